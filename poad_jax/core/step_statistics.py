"""What a PPO update reports of its minibatch steps: whether a step's numbers are finite
(`step_is_finite`), and each statistic's mean over the finite steps (`finite_step_means`).

A step's statistics are scalars; the update stacks them over its epochs and
minibatches as `[epochs, M]` arrays (`agent/learner.py:ppo_update`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

STEP_COUNTERS = ("skipped", "nonfinite")
"""The statistics that count steps (1.0 for a step skipped on the KL, or not finite): averaged over all steps."""


def step_is_finite(*scalars: jax.Array) -> jax.Array:
    """finite = isfinite(x_1) and ... and isfinite(x_k), over a minibatch step's scalars (its loss,
    approximate KL and gradient norms: a non-finite gradient element makes its norm non-finite)."""
    return functools.reduce(jnp.logical_and, [jnp.isfinite(x) for x in scalars])


def finite_step_means(stats: dict) -> dict:
    """Each statistic x `[epochs, M]` averaged over the finite steps F = {s : nonfinite_s = 0}:

        mean_F(x) = sum_{s in F} x_s / |F|        (NaN when F is empty)

    so one bad step leaves the update's losses readable; the counters (`STEP_COUNTERS`) are
    fractions of all the steps, mean_s(x_s).  Entries that are not `[epochs, M]` arrays (a
    harness's gradients) are left out: they stay in the update's details."""
    finite = stats["nonfinite"] == 0
    count = jnp.sum(finite.astype(jnp.float32))
    finite_mean = lambda v: jnp.where(count > 0, jnp.sum(jnp.where(finite, v, 0.0)) / jnp.maximum(count, 1.0), jnp.nan)
    return {k: jnp.mean(v) if k in STEP_COUNTERS else finite_mean(v)
            for k, v in stats.items() if isinstance(v, jax.Array) and v.ndim == 2}
