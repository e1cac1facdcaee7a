"""tfm: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) in JAX/Flax.

Layout: the paper core at the top (config, attention, layers, model, cache, loss, training;
implementation chooses the operations a backend kit may replace), `tfm.inference` (searches,
decoding, continuous batching, translation), `tfm.job` (the training job: trainer, steps,
parallelism, checkpoints, workdir), `tfm.data`, `tfm.export`, `tfm.experiments`, `tfm.xla_cpu`
(the XLA:CPU kit's op forms) and `tfm.cpu_host` (tooling for jobs on a CPU host). The names
below load on first use, so `import tfm.data` (what prepare's worker processes run) does not
import JAX.
"""

import importlib

_EXPORTS = {
    "attention": ("tfm.attention", None),
    "config": ("tfm.config", None),
    "decoding": ("tfm.inference.decoding", None),
    "implementation": ("tfm.implementation", None),
    "layers": ("tfm.layers", None),
    "loss": ("tfm.loss", None),
    "training": ("tfm.training", None),
    "ModelConfig": ("tfm.config", "ModelConfig"),
    "Preset": ("tfm.config", "Preset"),
    "Transformer": ("tfm.model", "Transformer"),
    "DecodeCache": ("tfm.cache", "DecodeCache"),
    "LayerCache": ("tfm.cache", "LayerCache"),
    "PAD_ID": ("tfm.model", "PAD_ID"),
}
__all__ = list(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tfm' has no attribute {name!r}")
    module_name, attribute = _EXPORTS[name]
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
