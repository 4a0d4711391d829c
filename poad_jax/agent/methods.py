"""POAD, NTPO and TWOSOME: which discounts, and what one stream element is.

| method  | stream element      | discount inside an action | at an action's end |
|---------|---------------------|---------------------------|--------------------|
| poad    | one action token    | 1 (BAD)                   | gamma (1 - done)   |
| ntpo    | one action token    | gamma_w (= gamma default) | gamma (1 - done)   |
| twosome | one whole action    | (none)                    | gamma (1 - done)   |

TWOSOME with `gamma_w < 1` (an ablation, not the paper's TWOSOME) discounts
each action as if its n tokens were time steps, as NTPO does:
d = gamma * gamma_w**(n - 1) * (1 - done) at the action's end.

The scheme objects (`poad_jax.agent.schemes`) implement what follows from the
"stream element" column: batch layout, packing, streams, log-probs.

All three then run the same token-level GAE scan (`poad_jax.core.gae`).
"""

from __future__ import annotations

import dataclasses

from poad_jax.agent.schemes import ActionLevel, TokenLevel

METHODS = ("poad", "ntpo", "twosome")


class UnknownMethodError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Method:
    """A credit-assignment method: a name and its credit scheme.

    Attributes:
      name: "poad", "ntpo" or "twosome".
      scheme: `TokenLevel(gamma_w)` or `ActionLevel(gamma_w, share_prompt)`.
    """

    name: str
    scheme: TokenLevel | ActionLevel

    @property
    def token_level(self) -> bool:
        """True if a stream element is an action token."""
        return self.scheme.token_level

    @property
    def gamma_w(self) -> float:
        """The intra-action discount: per token for token-level methods; for the
        action level, an action of n tokens is discounted by an extra
        gamma_w**(n - 1) (1 for the paper's TWOSOME)."""
        return self.scheme.gamma_w

    @property
    def share_prompt(self) -> bool:
        """Action level: each state's prompt encoded once (see `schemes.ActionLevel`)."""
        return getattr(self.scheme, "share_prompt", True)


def make_method(name: str, gamma: float, gamma_w: float | None = None, share_prompt: bool = True) -> Method:
    """The method `name`; `gamma_w` overrides NTPO's intra-action discount (default gamma)
    and TWOSOME's per-token discount of an action (default 1; POAD's is always 1).
    `share_prompt=False` gives TWOSOME's per-candidate computation (`schemes.ActionLevel`)."""
    if name == "poad":
        return Method("poad", TokenLevel(gamma_w=1.0))
    if name == "ntpo":
        return Method("ntpo", TokenLevel(gamma_w=gamma if gamma_w is None else gamma_w))
    if name == "twosome":
        return Method("twosome", ActionLevel(gamma_w=1.0 if gamma_w is None else gamma_w, share_prompt=share_prompt))
    raise UnknownMethodError(f"unknown method {name!r}; choose one of {', '.join(METHODS)}")
