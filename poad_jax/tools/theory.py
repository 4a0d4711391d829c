"""Closed-form predictions that studies draw beside their measured curves.

`per_action_discount` is how much one action of n tokens discounts what
follows it under each method's backup (`methods.py`):

    POAD:              g = gamma_a                        (discount 1 inside the action)
    NTPO:              g = gamma_a * gamma_w ** (n - 1)   (gamma_w on every token transition)
    TWOSOME:           g = gamma_a                        (one step per action)
    TWOSOME, gamma_w:  g = gamma_a * gamma_w ** (n - 1)   (the ablation in methods.py)

A policy optimal for a method's objective is optimal for that g; on the
synthetic save-or-take task its undiscounted return has a closed form
(`envs_py.synthetic.optimal_return`).
"""

from __future__ import annotations

from envs_py.synthetic import optimal_return
from poad_jax.agent.methods import make_method
from poad_jax.run import config as config_lib


def per_action_discount(method: str, gamma_a: float, gamma_w: float | None, action_length: int) -> float:
    """g: the discount one action of `action_length` tokens applies to what follows it."""
    m = make_method(method, gamma_a, gamma_w)
    return gamma_a * m.gamma_w ** (action_length - 1)


def save_or_take_optimum(config) -> float:
    """Undiscounted return of the policy optimal for the method's objective on
    `synthetic/save_or_take` with this trainer config (deterministic transitions)."""
    run = config_lib.typed(config)
    kwargs = run.env.kwargs
    gamma_w = None if run.scheme.gamma_w < 0 else run.scheme.gamma_w
    g = per_action_discount(run.method, run.ppo.gamma, gamma_w, int(kwargs.get("action_length", 4)))
    return optimal_return(g, int(kwargs.get("horizon", 4)), float(kwargs.get("take_reward", 0.5)),
                          float(kwargs.get("save_reward", 1.0)))
