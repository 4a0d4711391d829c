"""Sampling from a `Llama`, by concern:

- `kernels`: top-k / top-p masks, drawing a token and its log-prob (pure).
- `loop`: prefill and the one KV-cache decode loop, with a next-token rule
  (`FreeSampling` or trie-constrained `TrieSampling`).
- `scoring`: TWOSOME action scoring (each prompt encoded once).
- `sampler`: `Sampler`, which holds the split model (`set_lora` for new
  adapters), buckets shapes and runs the jitted functions; `mesh=` runs it
  on a device mesh (`poad_jax.parallel.sampling_layout`).

`config`: `SamplingConfig`, the sampler's settings (no JAX: the package imports its
modules when a name is first used, so a config loads without JAX).

The trie of valid actions is `poad_jax.core.layout`'s (shared with batch packing).
"""

import importlib

_HOMES = {
    "ActionTrie": "poad_jax.core.layout", "bucket_size": "poad_jax.core.layout",
    "build_action_tries": "poad_jax.core.layout",
    "SamplingConfig": "poad_jax.sampling.config",
    **dict.fromkeys(("sample_allowed", "sample_tokens", "sampling_logits", "top_k_mask", "top_p_mask"),
                    "poad_jax.sampling.kernels"),
    **dict.fromkeys(("DecodeCarry", "FreeSampling", "TrieSampling", "decode_loop", "left_pad", "prefill"),
                    "poad_jax.sampling.loop"),
    **dict.fromkeys(("FINISH_LENGTH", "FINISH_STOP_TOKEN", "ConstrainedGeneration", "Generation", "Sampler"),
                    "poad_jax.sampling.sampler"),
    **dict.fromkeys(("NORMALIZATIONS", "ActionScores", "action_normalizers", "score_candidates",
                     "trie_action_probs"), "poad_jax.sampling.scoring"),
}


def __getattr__(name: str):
    """The package's names, each imported from its module when first used (PEP 562)."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


__all__ = [
    "FINISH_LENGTH",
    "FINISH_STOP_TOKEN",
    "NORMALIZATIONS",
    "ActionScores",
    "ActionTrie",
    "ConstrainedGeneration",
    "DecodeCarry",
    "FreeSampling",
    "Generation",
    "Sampler",
    "SamplingConfig",
    "TrieSampling",
    "action_normalizers",
    "bucket_size",
    "build_action_tries",
    "decode_loop",
    "left_pad",
    "prefill",
    "sample_allowed",
    "sample_tokens",
    "sampling_logits",
    "score_candidates",
    "trie_action_probs",
    "top_k_mask",
    "top_p_mask",
]
