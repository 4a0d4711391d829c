"""The sampler's settings (`config.sampling`), declared once beside the sampler that reads them.

`SamplingConfig` is both the declaration (each field's default, type, one-line
meaning and check in one `setting(...)`, `poad_jax.declare`) and what
`Sampler.generate` takes.  `run.config` makes `config.sampling` from it and
builds it back from a config (`run.config.typed(config).sampling`); code that
samples outside a run builds it directly, and the same checks hold
(temperature 0 is greedy here; a training run refuses it, `run.config.validate`).
Two fields are not settings: the run sets `stop_token_ids` (its tokenizer's
end tokens) and `logprobs_of` (from `behaviour_logprobs`).

No JAX: a config file loads without it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from poad_jax.declare import Check, at_least, derived, hold_to_declarations, setting, within


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """How tokens are drawn.  temperature 0 = greedy; top_k 0 = off; top_p 1 = off."""

    temperature: float = setting(1.0, "the optimised policy's sampling temperature",
                                 Check(lambda v: v >= 0 and math.isfinite(v), "a finite number >= 0", "0: greedy"))
    top_k: int = setting(0, "sample among the k likeliest tokens", at_least(0, "0 turns top-k off"))
    top_p: float = setting(1.0, "sample within the smallest set of this probability",
                           within(0, 1, open_low=True, why="1 turns top-p off"))
    max_new_tokens: int = setting(128, "an action's token limit",
                                  at_least(1, "an action needs at least one token"))
    share_prompts: bool = setting(False, "free-form sampling: a prompt several rows share is run into the KV cache "
                                  "once (one device; the same draws, the prefill's rows to float rounding)",
                                  resumable="speed")
    stop_token_ids: tuple[int, ...] = derived(
        "tokens that end a row (kept in the output); empty: the tokenizer's eos_token_ids when `generate` is "
        "given one", ())
    logprobs_of: Literal["sampled", "policy"] = derived(
        "what Generation.logprobs holds: log pi(token) of the sampled (truncated) distribution, or of the "
        "untruncated policy softmax(logits / T) (PPO's old log-probs, behaviour_logprobs='sampler')", "sampled")

    def __post_init__(self):
        hold_to_declarations(self)
        if self.logprobs_of not in ("sampled", "policy"):
            raise ValueError(f"logprobs_of must be 'sampled' or 'policy', got {self.logprobs_of!r}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
