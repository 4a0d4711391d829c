"""POAD, NTPO and TWOSOME: which discounts, and what one stream element is.

| method  | stream element      | discount inside an action | at an action's end |
|---------|---------------------|---------------------------|--------------------|
| poad    | one action token    | 1 (BAD)                   | gamma (1 - done)   |
| ntpo    | one action token    | gamma_w (= gamma default) | gamma (1 - done)   |
| twosome | one whole action    | (none)                    | gamma (1 - done)   |

TWOSOME with `gamma_w < 1` (an ablation, not the paper's TWOSOME) discounts
each action as if its n tokens were time steps, as NTPO does:
d = gamma * gamma_w**(n - 1) * (1 - done) at the action's end.

All three then run the same token-level GAE scan (`poad_jax.backups`).
"""

from __future__ import annotations

import dataclasses

METHODS = ("poad", "ntpo", "twosome")


class UnknownMethodError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Method:
    """A credit-assignment method.

    Attributes:
      name: "poad", "ntpo" or "twosome".
      token_level: True if a stream element is an action token.
      gamma_w: the intra-action discount: per token for token-level methods;
        for the action level, an action of n tokens is discounted by an
        extra gamma_w**(n - 1) (1 for the paper's TWOSOME).
      share_prompt: action level only: each state's prompt is encoded once and
        every candidate attends to it (True), or every candidate runs prompt +
        action through the model on its own (False: the reference computation,
        K times the prompt's cost; same numbers up to float rounding).
    """

    name: str
    token_level: bool
    gamma_w: float
    share_prompt: bool = True


def make_method(name: str, gamma: float, gamma_w: float | None = None, share_prompt: bool = True) -> Method:
    """The method `name`; `gamma_w` overrides NTPO's intra-action discount (default gamma)
    and TWOSOME's per-token discount of an action (default 1; POAD's is always 1).
    `share_prompt=False` gives TWOSOME's per-candidate computation (see `Method`)."""
    if name == "poad":
        return Method("poad", token_level=True, gamma_w=1.0)
    if name == "ntpo":
        return Method("ntpo", token_level=True, gamma_w=gamma if gamma_w is None else gamma_w)
    if name == "twosome":
        return Method(
            "twosome", token_level=False, gamma_w=1.0 if gamma_w is None else gamma_w, share_prompt=share_prompt
        )
    raise UnknownMethodError(f"unknown method {name!r}; choose one of {', '.join(METHODS)}")
