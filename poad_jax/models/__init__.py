"""LLaMA-family models (SmolLM2, Qwen2) in Flax NNX: model, loading, tokenizer.

`load(name_or_path)` returns `(Llama, Tokenizer)`; see docs/models.md.
"""

import importlib

_HOMES = {
    "ModelLoadError": "poad_jax.models.errors", "LlamaConfig": "poad_jax.models.config",
    "LoraConfig": "poad_jax.models.config", "KVCache": "poad_jax.models.decode", "init_cache": "poad_jax.models.decode",
    "Llama": "poad_jax.models.llama", "ModelOutput": "poad_jax.models.llama", "load": "poad_jax.models.loading",
    "Tokenizer": "poad_jax.models.tokenizer",
}


def __getattr__(name: str):
    """The package's names, each imported from its module when first used (PEP 562): `models.config`
    loads without JAX."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


__all__ = [
    "KVCache",
    "Llama",
    "LlamaConfig",
    "LoraConfig",
    "ModelLoadError",
    "ModelOutput",
    "Tokenizer",
    "init_cache",
    "load",
]
