"""The credit schemes' own settings (`config.gamma_w`, `config.share_prompt`), declared once beside
the methods that read them (`agent.methods.make_method`).

`MethodConfig` is the declaration: each field's default, type, one-line meaning
and check sit in one `setting(...)` (`poad_jax.declare`); `run.config` splices
them into the config's top level (`inline`) and builds this object back once
(`run.config.typed(config).scheme`).  The method's name (`config.method`) and
the discount per env step (`ppo.gamma`) are declared with the run and the
learner; the group methods' settings are `core.group_advantages.GroupConfig`.

No JAX: a config file loads without it.
"""

from __future__ import annotations

import dataclasses

from poad_jax.declare import Check, hold_to_declarations, setting


@dataclasses.dataclass(frozen=True)
class MethodConfig:
    """The intra-action discount of NTPO (and of TWOSOME's ablation) and TWOSOME's prompt sharing."""

    gamma_w: float = setting(-1.0, "NTPO's intra-action discount; negative: gamma (NTPO) / 1 (POAD, TWOSOME)",
                             Check(lambda v: v < 0 or 0 < v <= 1, "in (0, 1], or negative for the method's default"))
    share_prompt: bool = setting(
        True, "TWOSOME: encode each state's prompt once and score every candidate as its continuation (exact); "
        "False runs the whole prompt per candidate", resumable="speed")

    def __post_init__(self):
        hold_to_declarations(self)
