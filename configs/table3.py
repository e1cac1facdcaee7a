"""One row of Table 3 (En-De, development set newstest2013, no checkpoint averaging).

    python train.py --config configs/table3.py:B16 --workdir runs/table3-B16

Rows: base, A1, A4, A16, A32, B16, B32, C_N2, C_N4, C_N8, C_d256, C_d1024, C_ff1024, C_ff4096,
D_drop0.0, D_drop0.2, D_ls0.0, D_ls0.2, E, big (tfm.config.table3 holds their values and the
paper's PPL / BLEU / parameter counts).
"""

from configs import common
from tfm.config import table3


def get_config(row: str = "base"):
    rows = table3()
    if row not in rows:
        raise ValueError(f"configs/table3.py:{row}: unknown row; choose one of {sorted(rows)}")
    preset = rows[row]
    config = common.base_config()
    config.model = common.model_block(preset.model)
    config.label_smoothing = preset.label_smoothing
    config.num_train_steps = preset.train_steps
    config.decode.average_last = 1  # Table 3 reports single checkpoints
    config.decode.split = "validation"  # on the development set, newstest2013
    config.keep_checkpoints = 20
    return config
