"""Transformer (base), WMT14 En-Fr (Table 2: 38.1 BLEU): 32000 word pieces (section 5.1)."""

from configs import base


def get_config():
    config = base.get_config()
    config.dataset = "tfds:wmt14_translate/fr-en"
    config.vocab_size = 32000
    return config
