"""Transformer (big), WMT14 En-Fr (Table 2: 41.8 BLEU): P_drop 0.1 for En-Fr (section 6.1)."""

from configs import big


def get_config():
    config = big.get_config()
    config.dataset = "tfds:wmt14_translate/fr-en"
    config.vocab_size = 32000
    config.model.dropout_rate = 0.1
    return config
