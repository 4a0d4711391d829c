"""POAD, NTPO and TWOSOME: which discounts, and what one stream element is.

| method  | stream element      | discount inside an action | at an action's end |
|---------|---------------------|---------------------------|--------------------|
| poad    | one action token    | 1 (BAD)                   | gamma (1 - done)   |
| ntpo    | one action token    | gamma_w (= gamma default) | gamma (1 - done)   |
| twosome | one whole action    | (none)                    | gamma (1 - done)   |

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
      gamma_w: the intra-action discount (token-level methods only).
    """

    name: str
    token_level: bool
    gamma_w: float


def make_method(name: str, gamma: float, gamma_w: float | None = None) -> Method:
    """The method `name`; `gamma_w` overrides NTPO's intra-action discount (default gamma)."""
    if name == "poad":
        return Method("poad", token_level=True, gamma_w=1.0)
    if name == "ntpo":
        return Method("ntpo", token_level=True, gamma_w=gamma if gamma_w is None else gamma_w)
    if name == "twosome":
        return Method("twosome", token_level=False, gamma_w=1.0)
    raise UnknownMethodError(f"unknown method {name!r}; choose one of {', '.join(METHODS)}")
