"""Transformer (base), WMT14 En-De (Table 2: 27.3 BLEU): 100K steps of ~25000-token batches,
P_drop 0.1, eps_ls 0.1, warmup 4000; average the last 5 checkpoints, beam 4, alpha 0.6.

    python train.py --config configs/base.py --workdir runs/base
"""

from configs import common


def get_config():
    config = common.base_config()
    # the paper wrote checkpoints every 10 minutes (~1500 steps at 0.4 s/step)
    config.checkpoint_every_steps = 1500
    config.decode.average_last = 5
    return config
