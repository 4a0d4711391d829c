"""The update's pure math in `core/`, each function against a plain NumPy reference of its docstring's
equation: the advantage normalisations as the learner picks them (`losses.normalized_advantages`), how far
the behaviour policy is from pi_old (`losses.behaviour_divergence`), and what an update reports of its
minibatch steps (`step_statistics.step_is_finite`, `finite_step_means`).  (The truncated importance
weights are checked in tests/test_method_options.py, with the rest of the behaviour correction.)
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from poad_jax.core import losses
from poad_jax.core.step_statistics import finite_step_means, step_is_finite

EPS = 1e-8


def advantages_and_mask(seed: int, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Random advantages with some exact zeros, and a mask with some invalid elements."""
    rng = np.random.default_rng(seed)
    advantages = rng.normal(size=shape).astype(np.float32)
    advantages[rng.random(shape) < 0.2] = 0.0
    mask = rng.random(shape) < 0.8
    return advantages, mask


def normalized(advantages, mask, token_level, normalization, chunks=1) -> np.ndarray:
    return np.asarray(losses.normalized_advantages(jnp.asarray(advantages), jnp.asarray(mask), token_level,
                                                   normalization, chunks))


@pytest.mark.parametrize("token_level", [True, False])
def test_valid_normalisation_is_the_masked_mean_and_std(token_level):
    advantages, mask = advantages_and_mask(0, (12, 5) if token_level else (12,))
    valid = advantages[mask].astype(np.float64)
    reference = np.where(mask, (advantages - valid.mean()) / (valid.std() + EPS), 0.0)
    np.testing.assert_allclose(normalized(advantages, mask, token_level, "valid"), reference, rtol=1e-5, atol=1e-6)


def test_adrl_token_level_takes_its_statistics_from_the_nonzero_advantages():
    advantages, mask = advantages_and_mask(1, (10, 6))
    counted = advantages[mask & (advantages != 0)].astype(np.float64)
    reference = np.where(mask, (advantages - counted.mean()) / (counted.std() + EPS), 0.0)
    got = normalized(advantages, mask, True, "adrl")
    np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-6)
    zero_and_valid = mask & (advantages == 0)
    assert zero_and_valid.any() and np.all(got[zero_and_valid] != 0)  # normalised like the others


def test_adrl_action_level_normalises_each_chunk_with_the_unbiased_std():
    chunks, rows = 3, 4
    advantages = np.random.default_rng(2).normal(size=(chunks * rows,)).astype(np.float32)
    mask = np.ones(advantages.shape, bool)
    per_chunk = advantages.reshape(chunks, rows).astype(np.float64)
    reference = (per_chunk - per_chunk.mean(axis=1, keepdims=True)) / (per_chunk.std(axis=1, ddof=1, keepdims=True)
                                                                       + EPS)
    got = normalized(advantages, mask, False, "adrl", chunks)
    np.testing.assert_allclose(got.reshape(chunks, rows), reference, rtol=1e-5, atol=1e-6)
    whole = normalized(advantages, mask, False, "adrl", 1)  # one chunk: one statistic, another answer
    assert not np.allclose(whole, got, atol=1e-3)


def test_behaviour_divergence_is_the_mean_log_ratio_per_token_and_per_action():
    rng = np.random.default_rng(3)
    behaviour = np.log(rng.uniform(0.05, 1.0, size=(5, 4))).astype(np.float32)
    old = np.log(rng.uniform(0.05, 1.0, size=(5, 4))).astype(np.float32)
    mask = np.array([[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]], bool)
    got = losses.behaviour_divergence(jnp.asarray(behaviour), jnp.asarray(old), jnp.asarray(mask))
    gap = (behaviour - old).astype(np.float64)
    per_action = [gap[row][mask[row]].sum() for row in range(5) if mask[row].any()]
    np.testing.assert_allclose(float(got["behaviour_kl_token"]), gap[mask].mean(), rtol=1e-5)
    np.testing.assert_allclose(float(got["behaviour_kl_action"]), np.mean(per_action), rtol=1e-5)
    nothing = losses.behaviour_divergence(jnp.asarray(behaviour), jnp.asarray(old), jnp.zeros((5, 4), bool))
    assert float(nothing["behaviour_kl_token"]) == 0.0 and float(nothing["behaviour_kl_action"]) == 0.0


def test_a_step_is_finite_when_all_its_scalars_are():
    assert bool(step_is_finite(jnp.float32(1.0), jnp.float32(-2.0), jnp.float32(0.0)))
    for bad in (np.nan, np.inf, -np.inf):
        assert not bool(step_is_finite(jnp.float32(1.0), jnp.float32(bad), jnp.float32(0.0)))


def test_finite_step_means_average_over_the_finite_steps_and_count_over_all():
    rng = np.random.default_rng(4)
    loss = rng.normal(size=(2, 3)).astype(np.float32)
    nonfinite = np.array([[0, 1, 0], [0, 0, 1]], np.float32)
    loss[nonfinite == 1] = np.nan
    skipped = np.array([[1, 0, 0], [0, 0, 0]], np.float32)
    stats = {"loss": jnp.asarray(loss), "nonfinite": jnp.asarray(nonfinite), "skipped": jnp.asarray(skipped),
             "gradients": jnp.ones((2, 3, 7))}
    means = finite_step_means(stats)
    assert set(means) == {"loss", "nonfinite", "skipped"}  # a step's arrays (gradients) are left out
    np.testing.assert_allclose(float(means["loss"]), loss[nonfinite == 0].mean(), rtol=1e-6)
    assert float(means["nonfinite"]) == pytest.approx(2 / 6) and float(means["skipped"]) == pytest.approx(1 / 6)
    none_finite = finite_step_means(dict(stats, nonfinite=jnp.ones((2, 3))))
    assert math.isnan(float(none_finite["loss"])) and float(none_finite["nonfinite"]) == 1.0
