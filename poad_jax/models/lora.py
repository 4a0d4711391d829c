"""LoRA utilities acting on a whole `Llama` (the adapters themselves live in
`llama.py`: `nnx.LoRAParam` A `[L, in, r]` and B `[L, r, out]`, scaled by
alpha / r in `llama.linear`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax.numpy as jnp

if TYPE_CHECKING:
    from poad_jax.models.llama import Llama


def merge_lora(model: Llama) -> None:
    """Folds the LoRA update into the base weights (W += scale * A @ B), in place.

    Afterwards B is zero, so the adapters-on forward equals the merged base.
    With bfloat16 base weights (`matmul_dtype`) the merged weights are rounded
    to bfloat16, which can erase a small LoRA update: merge into a float32
    model (load with `matmul_dtype=None`) to export merged weights.
    """
    if model.lora_config is None:
        return
    scale = model.lora_config.scale
    layers = model.layers
    for name in list(layers.lora_a.keys()):
        a, b = layers.lora_a[name][...], layers.lora_b[name][...]
        w = layers.weights[name]
        w[...] = (w[...] + scale * jnp.einsum("lir,lro->lio", a, b)).astype(w[...].dtype)
        layers.lora_b[name][...] = jnp.zeros_like(b)
