"""LLaMA-family models (SmolLM2, Qwen2) in Flax NNX: model, loading, tokenizer.

`load(name_or_path)` returns `(Llama, Tokenizer)`; see docs/models.md.
"""

from poad_jax.models.errors import ModelLoadError
from poad_jax.models.config import LlamaConfig, LoraConfig
from poad_jax.models.decode import KVCache, init_cache
from poad_jax.models.llama import Llama, ModelOutput
from poad_jax.models.loading import load
from poad_jax.models.tokenizer import Tokenizer

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
