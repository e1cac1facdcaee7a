"""Transformer (big), WMT14 En-De (Table 2: 28.4 BLEU): d_model 1024, d_ff 4096, 16 heads,
P_drop 0.3, 300K steps; average the last 20 checkpoints.

    python train.py --config configs/big.py --workdir runs/big
"""

from configs import common
from tfm import config as presets


def get_config():
    config = common.base_config()
    config.model = common.model_block(presets.big(max_positions=512))
    config.num_train_steps = 300_000
    config.checkpoint_every_steps = 600  # ~10 minutes at the paper's 1.0 s/step
    config.keep_checkpoints = 20
    config.decode.average_last = 20
    return config
