"""Sampling from a `Llama`, by concern:

- `kernels`: top-k / top-p masks, drawing a token and its log-prob (pure).
- `loop`: prefill and the one KV-cache decode loop, with a next-token rule
  (`FreeSampling` or trie-constrained `TrieSampling`).
- `scoring`: TWOSOME action scoring (each prompt encoded once).
- `sampler`: `Sampler`, which holds the split model (`set_lora` for new
  adapters), buckets shapes and runs the jitted functions; `mesh=` runs it
  on a device mesh (`poad_jax.parallel.sampling_layout`).

The trie of valid actions is `poad_jax.core.layout`'s (shared with batch packing).
"""

from poad_jax.core.layout import ActionTrie, bucket_size, build_action_tries
from poad_jax.sampling.kernels import sample_allowed, sample_tokens, sampling_logits, top_k_mask, top_p_mask
from poad_jax.sampling.loop import DecodeCarry, FreeSampling, TrieSampling, decode_loop, left_pad, prefill
from poad_jax.sampling.sampler import (
    FINISH_LENGTH,
    FINISH_STOP_TOKEN,
    ConstrainedGeneration,
    Generation,
    Sampler,
    SamplingConfig,
)
from poad_jax.sampling.scoring import (
    NORMALIZATIONS,
    ActionScores,
    action_normalizers,
    score_candidates,
    trie_action_probs,
)

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
