"""The rollouts' settings (top-level fields of the config), declared once beside the rollout
code that reads them.

`RolloutConfig` is both the declaration (each field's default, type, one-line
meaning and check in one `setting(...)`, `poad_jax.declare`) and what
`RolloutCollector` runs on.  The run's config holds these settings at its top
level (`config.num_threads`; `run.config.settings.Run` splices them in with
`inline`), and `run.config` builds this object back once
(`run.config.typed(config).rollout`, or `rollout_config(config, eos_ids)`).
The fields marked `derived` are not settings: the run sets them from other
sections (`sampling`, the method, `ppo.behaviour_correction`, `prompt_bucket_step`).

No JAX: a config file loads without it.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from poad_jax.core.layout import ACTION_BUCKETS, PROMPT_BUCKETS  # NumPy only
from poad_jax.declare import at_least, derived, hold_to_declarations, setting, within
from poad_jax.sampling.config import SamplingConfig

BehaviourLogprobs = Literal["recompute", "sampler", "auto"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    """How rollouts are collected and packed."""

    behaviour_logprobs: BehaviourLogprobs = setting(
        "recompute", "PPO's old log-probs: the learner's own forward (first ratio exactly 1), the sampler's "
        "(one forward fewer; 1 up to the decode's rounding), or auto (the sampler's where float32 makes them "
        "the learner's, `run/hardware.py`)")
    num_threads: int = setting(4, "parallel rollout threads (environments)", at_least(1))
    rollout_length: int = setting(32, "env steps per thread per update", at_least(1))
    prompt_format: Literal["chat", "raw"] = setting("raw", "the tokenizer's chat template, or the raw text")
    system_prompt: str = setting("", "the chat template's system message")
    max_prompt_tokens: int = setting(1024, "a prompt keeps its last this many tokens", at_least(1))
    restricted_sampling: Literal["trie", "action_scores"] = setting(
        "trie", "restricted actions: decoded through the trie of valid actions, or drawn from the "
        "action scores' softmax (the paper code's way)")
    trie_explore_temperature: float = setting(
        0.0, "> 0: trie sampling draws at this temperature while the optimised policy stays at "
        "sampling.temperature (needs ppo.behaviour_correction='importance'); 0: off",
        at_least(0, "0 turns exploration off"))
    twosome_normalization: Literal["token", "word"] = setting(
        "token", "an action's score: its log-prob per token or per word")
    discounted_return_gamma: float = setting(
        0.95, "the `discounted_return` metric's discount per env step (the paper's Appendix H: 0.95)",
        within(0, 1, open_low=True))
    sampling: SamplingConfig = derived("how actions are decoded (config.sampling)")
    pack_behaviour: bool = derived(
        "pack_batch packs each action token's log-prob under the distribution it was drawn from "
        "(StepRecord.behaviour_logprobs) for the learner's importance correction "
        "(ppo.behaviour_correction != 'none')")
    group_size: int = derived(
        "> 0 (grpo, gigpo): episodic group rollouts, collect_episodes: every update starts a new episode in "
        "every thread, the threads of a group from one reset seed; 0: each thread's episode goes on (group.size)")
    prompt_buckets: tuple[int, ...] = derived("the prompts' padded lengths (prompt_bucket_step)", PROMPT_BUCKETS)
    action_buckets: tuple[int, ...] = derived("the actions' padded lengths", ACTION_BUCKETS)

    def __post_init__(self):
        hold_to_declarations(self)
