"""The embedded default: a small En->De Transformer on this machine's gettext catalogs, sized to
train, average, translate and score on a 2-core CPU in under 20 minutes.

    python train.py                      # = --config configs/default.py --workdir workdirs/default
"""

import ml_collections

from configs import common


def get_config() -> ml_collections.ConfigDict:
    config = common.base_config()
    config.dataset = "gettext:en-de"
    config.vocab_size = 8000
    config.max_len = 64
    config.pack = True
    config.batch_tokens = 4096
    config.num_train_steps = 2500
    config.warmup_steps = 1000
    config.learning_rate_scale = 2.0
    config.eval_every_steps = 500
    config.checkpoint_every_steps = 250
    config.log_every_steps = 50
    config.model.update(
        num_layers=3,
        d_model=256,
        d_ff=1024,
        num_heads=4,
        d_k=64,
        d_v=64,
        dropout_rate=0.1,
        max_len=128,
    )
    config.decode.average_last = 5
    return config
