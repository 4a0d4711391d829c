"""PPO losses over action tokens: clipped policy loss, clipped value loss,
entropy, approximate KL, clip fraction.

All functions take a `mask` of the elements that count (valid action tokens,
or valid actions for action-level methods) and average over it ("token mean").
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """sum(x * mask) / max(sum(mask), 1)."""
    mask = mask.astype(x.dtype)
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def normalize_advantages(advantages: jax.Array, mask: jax.Array, eps: float = 1e-8) -> jax.Array:
    """(A - mean) / (std + eps) over the masked elements; zero elsewhere."""
    mean = masked_mean(advantages, mask)
    var = masked_mean(jnp.square(advantages - mean), mask)
    return jnp.where(mask, (advantages - mean) / (jnp.sqrt(var) + eps), 0.0)


def clipped_policy_loss(
    logprobs: jax.Array, old_logprobs: jax.Array, advantages: jax.Array, mask: jax.Array, clip_eps: float
) -> jax.Array:
    """mean over mask of -min(rho A, clip(rho, 1 - eps, 1 + eps) A), rho = exp(logp - logp_old)."""
    chex.assert_equal_shape([logprobs, old_logprobs, advantages, mask])
    ratio = jnp.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    return masked_mean(-jnp.minimum(unclipped, clipped), mask)


def clipped_value_loss(
    values: jax.Array, old_values: jax.Array, returns: jax.Array, mask: jax.Array, clip_eps: float
) -> jax.Array:
    """mean over mask of 0.5 max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2)."""
    chex.assert_equal_shape([values, old_values, returns, mask])
    clipped_values = old_values + jnp.clip(values - old_values, -clip_eps, clip_eps)
    loss = jnp.maximum(jnp.square(values - returns), jnp.square(clipped_values - returns))
    return 0.5 * masked_mean(loss, mask)


def categorical_entropy(logits: jax.Array) -> jax.Array:
    """H = -sum_v p_v log p_v over the last axis (full vocabulary)."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def approx_kl(logprobs: jax.Array, old_logprobs: jax.Array, mask: jax.Array) -> jax.Array:
    """k3 estimator of KL(old || new): mean over mask of (rho - 1) - log rho."""
    log_ratio = logprobs - old_logprobs
    return masked_mean(jnp.exp(log_ratio) - 1.0 - log_ratio, mask)


def clip_fraction(logprobs: jax.Array, old_logprobs: jax.Array, mask: jax.Array, clip_eps: float) -> jax.Array:
    """Fraction of masked elements whose ratio lies outside [1 - eps, 1 + eps]."""
    ratio = jnp.exp(logprobs - old_logprobs)
    return masked_mean((jnp.abs(ratio - 1.0) > clip_eps).astype(jnp.float32), mask)


def explained_variance(predictions: jax.Array, targets: jax.Array, mask: jax.Array) -> jax.Array:
    """1 - Var[target - prediction] / Var[target] over the masked elements."""
    def variance(x):
        mean = masked_mean(x, mask)
        return masked_mean(jnp.square(x - mean), mask)

    target_var = variance(targets)
    return jnp.where(target_var > 0, 1.0 - variance(targets - predictions) / target_var, 0.0)
