"""Keys every config has, with the paper's values where the paper gives one."""

import ml_collections
from ml_collections import config_dict


def base_config() -> ml_collections.ConfigDict:
    """Transformer (base) on WMT14 En-De, section 5; configs change what differs."""
    config = ml_collections.ConfigDict()
    # data
    config.dataset = "tfds:wmt14_translate/de-en"
    config.source_language = config_dict.placeholder(str)
    config.target_language = config_dict.placeholder(str)
    config.data_dir = "data"
    config.vocab_size = 37000  # shared BPE vocabulary (section 5.1)
    config.max_len = 256  # tokens per side, EOS included
    config.overlong = "drop"  # or "truncate"
    config.pack = False
    config.batch_tokens = 25000  # per side (section 5.1)
    config.grad_accum_steps = 1  # micro-batches per step (same result as one big batch)
    # training (section 5.3, 5.4)
    config.num_train_steps = 100_000
    config.warmup_steps = 4000
    config.learning_rate_scale = 1.0
    config.label_smoothing = 0.1
    config.grad_clip_norm = 0.0  # 0 = off
    config.seed = 0
    # loop
    config.log_every_steps = 100
    config.eval_every_steps = 2000
    config.checkpoint_every_steps = 2000
    config.keep_checkpoints = 20
    config.eval_batches = 0  # 0 = the whole validation split
    # parallelism: data | fsdp | tensor | pmap
    config.parallelism = "data"
    config.model_parallel = 1
    # model (tfm.ModelConfig fields; vocab_size comes from the vocabulary)
    config.model = ml_collections.ConfigDict(
        dict(
            num_layers=6,
            d_model=512,
            d_ff=2048,
            num_heads=8,
            d_k=64,
            d_v=64,
            dropout_rate=0.1,
            attention_dropout_rate=0.0,
            positional="sinusoidal",
            max_len=512,
            norm="post",
            dtype="float32",
            attention="reference",
            remat=False,
        )
    )
    # translation of the test split after training (section 6.1)
    config.decode = ml_collections.ConfigDict(
        dict(
            beam_size=4,
            alpha=0.6,
            extra_length=50,
            average_last=5,
            batch_tokens=4096,
            num_samples=6,
            enabled=True,
        )
    )
    return config
