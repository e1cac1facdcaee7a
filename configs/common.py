"""Keys every config has, with the paper's values where the paper gives one."""

import dataclasses

import ml_collections
from ml_collections import config_dict

from tfm import config as presets
from tfm.inference.translate import TranslateConfig


def model_block(model: presets.ModelConfig) -> ml_collections.ConfigDict:
    """config.model: a ModelConfig's fields but vocab_size, which the vocabulary decides."""
    fields = dataclasses.asdict(model)
    del fields["vocab_size"]
    return ml_collections.ConfigDict(fields)


def base_config() -> ml_collections.ConfigDict:
    """Transformer (base) on WMT14 En-De, section 5; configs change what differs."""
    config = ml_collections.ConfigDict()
    # data
    config.dataset = "tfds:wmt14_translate/de-en"
    config.source_language = config_dict.placeholder(str)
    config.target_language = config_dict.placeholder(str)
    config.data_dir = "data"
    config.vocab_size = 37000  # shared BPE vocabulary (section 5.1)
    config.max_seq_len = 256  # longest training sentence per side in tokens, EOS included
    config.overlong = "drop"  # or "truncate"
    config.encoding_errors = "strict"  # or "replace": invalid UTF-8 in a text/tsv corpus -> U+FFFD
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
    # validation BLEU during training: translate the whole validation split every N steps (0 =
    # off) with this beam (1 = greedy; alpha and extra length as config.decode) and log sacreBLEU
    config.eval_bleu_every_steps = 0
    config.eval_bleu_beam_size = 1
    # the operations a backend kit may replace (tfm.implementation): "auto" (the XLA:CPU kit where a
    # program runs on the CPU, Flax's and JAX's own ops elsewhere) | "reference" | "xla_cpu"; not
    # part of the model, so a run may resume with another setting
    config.kernels = "auto"
    # parallelism: data | fsdp | tensor | pmap
    config.parallelism = "data"
    config.model_parallel = 1
    # model (tfm.ModelConfig fields; vocab_size comes from the vocabulary)
    # sources of up to 512 tokens can be translated (sinusoids have no table to outgrow)
    config.model = model_block(presets.base(max_positions=512))
    # translation of a held-out split after training (section 6.1: beam 4, alpha 0.6, +50)
    defaults = TranslateConfig()
    config.decode = ml_collections.ConfigDict(
        dict(
            beam_size=defaults.beam_size,
            alpha=defaults.alpha,
            extra_length=defaults.extra_length,
            # None: tfm.inference.translate.default_batch_tokens() for the backend decoding runs on
            batch_tokens=config_dict.placeholder(int),
            # None: tfm.cpu_host.side_by_side.default_parts(): searches side by side (beam: streams
            # per bucket; greedy: a bucket's batches)
            streams=config_dict.placeholder(int),
            average_last=5,
            num_samples=6,
            enabled=True,
            split="test",  # or "validation" (Table 3: newstest2013, the development set)
        )
    )
    return config
