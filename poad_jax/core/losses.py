"""PPO's per-element terms (clipped surrogate, clipped value error, k3 KL, outside-clip
indicator, truncated importance weights), advantage normalisation, the weights that
average them, and how far the behaviour policy is from the optimised one.

The learner (`agent/learner.py`) weights the per-element terms by `chunk_weights`
over a `mask` of the elements that count (valid action tokens, or valid actions for
action-level methods); `masked_mean` is the one-chunk case ("token mean").
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """sum(x * mask) / max(sum(mask), 1)."""
    mask = mask.astype(x.dtype)
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def _centered(x: jax.Array, mask: jax.Array) -> jax.Array:
    """x - mean(x) over the masked elements, by the corrected two-pass rule: with m0 the float
    mean, (x - m0) - mean(x - m0).  The correction removes m0's rounding, which a plain x - m0
    keeps: for masked values that nearly coincide (two advantages 7.6e-6 apart at 0.91) the
    rounding of m0 (up to half an ulp of the mean, 3e-8) is a 1 % error in every centred value,
    and the normalisation divides by a std of the same small size.  Here x - m0 is exact for
    values within a factor 2 of m0, and so is the second mean for such a pair."""
    shifted = x - masked_mean(x, mask)
    return shifted - masked_mean(shifted, mask)


def normalize_advantages(advantages: jax.Array, mask: jax.Array, eps: float = 1e-8, ddof: int = 0) -> jax.Array:
    """(A - mean) / (std + eps) over the masked elements; zero elsewhere.

    std = sqrt(sum_mask (A - mean)^2 / (n - ddof)), n the masked count
    (ddof 1: the unbiased std, as torch.std; n - ddof is kept >= 1).  A - mean is
    computed by the corrected two-pass rule (`_centered`), exact for nearly equal
    advantages where a float mean's rounding would be amplified.
    """
    centered = _centered(advantages, mask)
    count = jnp.sum(mask.astype(advantages.dtype))
    var = jnp.sum(jnp.where(mask, jnp.square(centered), 0.0)) / jnp.maximum(count - ddof, 1.0)
    return jnp.where(mask, centered / (jnp.sqrt(var) + eps), 0.0)


def normalize_nonzero_advantages(advantages: jax.Array, mask: jax.Array, eps: float = 1e-8) -> jax.Array:
    """The authors' token-level normalisation (`trainers/llm_trainer_tppo.py`):

        mean, std over {A_i : mask_i and A_i != 0}   (NumPy nanmean / nanstd, ddof 0)
        A_i <- (A_i - mean) / (std + eps)            on every masked element

    so an element whose advantage is exactly 0 does not count in the
    statistics but is normalised like the others.  No non-zero element:
    mean = std = 0 (the authors' code would give NaN).  The mean is taken by
    the corrected two-pass rule, as in `normalize_advantages`.
    """
    nonzero = mask & (advantages != 0)
    m0 = masked_mean(advantages, nonzero)
    correction = masked_mean(advantages - m0, nonzero)
    centered = (advantages - m0) - correction
    std = jnp.sqrt(masked_mean(jnp.square(centered), nonzero))
    return jnp.where(mask, centered / (std + eps), 0.0)


def normalized_advantages(advantages: jax.Array, mask: jax.Array, token_level: bool, normalization: str,
                          chunks: int = 1) -> jax.Array:
    """A minibatch's advantages `[n, ...]`, normalised as `normalization` says:

        "valid" (ours):         A <- (A - mean) / (std + 1e-8) over the valid elements
                                (`normalize_advantages`)
        "adrl", token level:    the same with the mean and std of the valid non-zero
                                advantages (`normalize_nonzero_advantages`)
        "adrl", action level:   each of `chunks` equal row chunks c on its own, with the
                                unbiased std: A <- (A - mean_c) / (std_c + 1e-8),
                                std_c = sqrt(sum_c (A - mean_c)^2 / (n_c - 1))

    "adrl" is the authors' code (`trainers/llm_trainer_appo.py` normalises per
    gradient-accumulation chunk; docs/adrl_parity.md).
    """
    if normalization == "valid":
        return normalize_advantages(advantages, mask)
    if token_level:
        return normalize_nonzero_advantages(advantages, mask)
    split = lambda x: x.reshape(chunks, x.shape[0] // chunks, *x.shape[1:])
    normalized = jax.vmap(lambda a, m: normalize_advantages(a, m, ddof=1))(split(advantages), split(mask))
    return normalized.reshape(advantages.shape)


def clipped_surrogate(
    logprobs: jax.Array, old_logprobs: jax.Array, advantages: jax.Array, clip_eps: float
) -> jax.Array:
    """Per element: -min(rho A, clip(rho, 1 - eps, 1 + eps) A), rho = exp(logp - logp_old)."""
    chex.assert_equal_shape([logprobs, old_logprobs, advantages])
    ratio = jnp.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    return -jnp.minimum(unclipped, clipped)


def clipped_value_error(values: jax.Array, old_values: jax.Array, returns: jax.Array, clip_eps: float) -> jax.Array:
    """Per element: 0.5 max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2)."""
    chex.assert_equal_shape([values, old_values, returns])
    clipped_values = old_values + jnp.clip(values - old_values, -clip_eps, clip_eps)
    return 0.5 * jnp.maximum(jnp.square(values - returns), jnp.square(clipped_values - returns))


def k3_kl(logprobs: jax.Array, old_logprobs: jax.Array) -> jax.Array:
    """Per element, the k3 estimator of KL(old || new): (rho - 1) - log rho."""
    log_ratio = logprobs - old_logprobs
    return jnp.exp(log_ratio) - 1.0 - log_ratio


def importance_weights(old_logprobs: jax.Array, behaviour_logprobs: jax.Array, clip: float) -> jax.Array:
    """Per element, the truncated importance weight of a token w_j drawn from the behaviour
    distribution mu (the sampler's) for the optimised policy pi_old:

        rho_j = min(c, pi_old(w_j) / mu(w_j)) = min(c, exp(log pi_old(w_j) - log mu(w_j))),  c = clip

    The weights are constants of the update: the surrogate's gradient flows through its ratio
    pi / pi_old only, as in PPO with a behaviour policy apart from the proximal one."""
    chex.assert_equal_shape([old_logprobs, behaviour_logprobs])
    return jnp.minimum(jnp.exp(old_logprobs - behaviour_logprobs), clip)


def behaviour_divergence(behaviour_logprobs: jax.Array, old_logprobs: jax.Array, mask: jax.Array) -> dict:
    """How far the distribution mu the tokens were drawn from is from the optimised pi_old, on the
    tokens drawn (`[n, A]`, `mask` the valid ones; sample estimates of KL(mu || pi_old)):

        behaviour_kl_token  = mean over valid tokens  of log mu(w_j) - log pi_old(w_j)
        behaviour_kl_action = mean over valid actions of sum_j (log mu(w_j) - log pi_old(w_j))

    (an action is a row with at least one valid token; no valid action: the sum over 1).
    """
    gap = jnp.where(mask, behaviour_logprobs - old_logprobs, 0.0)
    actions = jnp.maximum(jnp.sum(jnp.any(mask, axis=-1)), 1)
    return {"behaviour_kl_token": masked_mean(gap, mask), "behaviour_kl_action": jnp.sum(gap) / actions}


def outside_clip(logprobs: jax.Array, old_logprobs: jax.Array, clip_eps: float) -> jax.Array:
    """Per element, 1.0 where the ratio lies outside [1 - eps, 1 + eps], else 0.0."""
    ratio = jnp.exp(logprobs - old_logprobs)
    return (jnp.abs(ratio - 1.0) > clip_eps).astype(jnp.float32)


def chunk_weights(mask: jax.Array, num_chunks: int) -> jax.Array:
    """Per-element weights (same shape as `mask [n, ...]`) that turn a weighted sum
    into the mean over `num_chunks` equal row chunks of each chunk's masked mean:

        sum_i w_i x_i = (1 / C) sum_c mean_{i in chunk c, mask_i} x_i,
        w_i = mask_i / (C * count_c(i))

    (C = 1: the plain masked mean.  The authors' trainer averages its
    `gradient_cp_steps` chunks this way; a chunk with no masked element adds 0.)
    """
    rows = mask.shape[0]
    chex.assert_equal(rows % num_chunks, 0)
    mask = mask.astype(jnp.float32)
    per_chunk = mask.reshape(num_chunks, rows // num_chunks, -1)
    counts = jnp.sum(per_chunk, axis=(1, 2), keepdims=True)
    weights = per_chunk / (num_chunks * jnp.maximum(counts, 1.0))
    return weights.reshape(mask.shape)


EXPLAINED_VARIANCE_MIN_SPREAD = 1e-6  # Var[target] below this fraction of E[target^2]: targets count as constant


def explained_variance(predictions: jax.Array, targets: jax.Array, mask: jax.Array) -> jax.Array:
    """1 - Var[target - prediction] / Var[target] over the masked elements; 0 where the targets are constant,
    i.e. Var[target] <= 1e-6 E[target^2] (a batch whose every return is one reward up to rounding, where the
    ratio would only measure float noise: -6.7e8 was logged for such a batch)."""
    def variance(x):
        mean = masked_mean(x, mask)
        return masked_mean(jnp.square(x - mean), mask)

    target_var = variance(targets)
    spread = target_var > EXPLAINED_VARIANCE_MIN_SPREAD * masked_mean(jnp.square(targets), mask)
    return jnp.where(spread, 1.0 - variance(targets - predictions) / jnp.where(spread, target_var, 1.0), 0.0)
