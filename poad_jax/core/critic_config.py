"""The critic's settings (`config.critic`), declared once beside the value head that reads them.

`CriticConfig` is both the declaration and the object `core.policy.ValueHead`
is built from: each field's default, type, one-line meaning and check sit in
one `setting(...)` (`poad_jax.declare`); `run.config` makes `config.critic`
from them and builds this object back once (`run.config.typed(config).critic`).
The learner reads `kind` (as `LearnerConfig.critic_kind`), the run's loop
`target_update_every`.

No JAX: a config file loads without it.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from poad_jax.declare import Check, at_least, hold_to_declarations, setting

CriticKind = Literal["head", "lora"]
HeadInit = Literal["zero_output", "torch"]


@dataclasses.dataclass(frozen=True)
class CriticConfig:
    """The critic (`config.critic`): which one, its MLP head's shape and init, and its target copy."""

    kind: CriticKind = setting(
        "head", "an MLP head on the frozen base's features, or a second adapter")
    hidden_sizes: tuple[int, ...] = setting((1024, 512), "the head's hidden layer widths",
                                            Check(lambda v: all(int(h) >= 1 for h in v), "positive layer widths"))
    target_update_every: int = setting(0, "hard-copy a target critic every K updates",
                                       at_least(0, "0 turns the target critic off"))
    bias: bool = setting(True, "the head's layers have biases (the authors' head has none, docs/adrl_parity.md)")
    init: HeadInit = setting(
        "zero_output", "a zero output layer (V = 0 at the start), or PyTorch's default random init (the authors')")

    def __post_init__(self):
        hold_to_declarations(self)
