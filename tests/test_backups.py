"""Streaming backups: `action_discounts` and `token_gae` against plain NumPy loops.

The references below follow the POAD reference code's per-token formulas
and never call `action_discounts`:

  inside an action:  delta = gamma_w V_{j+1} - V_j,               A = delta + gamma_w lam A_{j+1}
  last token:        delta = r + gamma (1-done) V_next - V,       A = delta + gamma lam (1-done) A_next

(gamma_w = 1 for BAD, gamma_w = gamma for NTPO), skipping padding.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from poad_jax.core import gae as gae_lib

GAMMA = 0.95


def random_streams(seed: int, batch: int, num_actions: int, max_action_length: int, pad_rate: float):
    """Streams of whole actions (lengths 1..max), episodes ending at random, padding sprinkled in."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(batch):
        row = []
        for _ in range(num_actions):
            length = int(rng.integers(1, max_action_length + 1))
            done = bool(rng.random() < 0.25)
            reward = float(rng.normal())
            for j in range(length):
                while rng.random() < pad_rate:
                    row.append((0.0, float(rng.normal()), False, bool(rng.random() < 0.5), bool(rng.random() < 0.5)))
                is_end = j == length - 1
                row.append((reward if is_end else 0.0, float(rng.normal()), True, is_end, done and is_end))
        rows.append(row)
    width = max(len(row) for row in rows) + 2
    fields = np.zeros((5, batch, width))
    for b, row in enumerate(rows):
        for t, element in enumerate(row):
            fields[:, b, t] = element
    rewards, values, valid, action_end, done = fields
    # Trailing padding keeps random values and flags: they must be ignored.
    values[valid == 0] = rng.normal(size=int((valid == 0).sum()))
    bootstrap = rng.normal(size=batch)
    return (
        rewards.astype(np.float32),
        values.astype(np.float32),
        valid.astype(bool),
        action_end.astype(bool),
        done.astype(bool),
        bootstrap.astype(np.float32),
    )


def reference_token_gae(rewards, values, valid, action_end, done, bootstrap, gamma, gamma_w, lam):
    """Per-token Python loop, reverse over each stream."""
    advantages = np.zeros(rewards.shape)
    returns = np.zeros(rewards.shape)
    for b in range(rewards.shape[0]):
        next_value, next_advantage = float(bootstrap[b]), 0.0
        for t in reversed(range(rewards.shape[1])):
            if not valid[b, t]:
                continue
            if action_end[b, t]:
                not_done = 1.0 - float(done[b, t])
                delta = rewards[b, t] + gamma * not_done * next_value - values[b, t]
                advantage = delta + gamma * lam * not_done * next_advantage
            else:
                delta = gamma_w * next_value - values[b, t]
                advantage = delta + gamma_w * lam * next_advantage
            advantages[b, t] = advantage
            returns[b, t] = advantage + values[b, t]
            next_value, next_advantage = float(values[b, t]), advantage
    return advantages, returns


def reference_discounted_return(rewards, valid, action_end, done, bootstrap, gamma, gamma_w):
    """G_j = r_j + d_j G_next over valid tokens, G = bootstrap past the end."""
    returns = np.zeros(rewards.shape)
    for b in range(rewards.shape[0]):
        following = float(bootstrap[b])
        for t in reversed(range(rewards.shape[1])):
            if valid[b, t]:
                discount = gamma * (1.0 - float(done[b, t])) if action_end[b, t] else gamma_w
                following = rewards[b, t] + discount * following
                returns[b, t] = following
    return returns


def gae_of(variant, streams, gamma_w, lam, gamma=GAMMA):
    rewards, values, valid, action_end, done, bootstrap = streams

    @variant
    def run(rewards, values, valid, action_end, done, bootstrap):
        discounts = gae_lib.action_discounts(action_end, done, gamma, gamma_w)
        return gae_lib.token_gae(rewards, values, discounts, valid, bootstrap, lam)

    advantages, returns = run(rewards, values, valid, action_end, done, bootstrap)
    return np.asarray(advantages), np.asarray(returns)


class TokenGaeTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_reference_loop_bad_and_ntpo(self):
        for seed, (gamma_w, lam) in enumerate([(1.0, 0.95), (GAMMA, 0.95), (1.0, 0.5), (0.8, 0.9)]):
            streams = random_streams(seed, batch=3, num_actions=6, max_action_length=4, pad_rate=0.2)
            advantages, returns = gae_of(self.variant, streams, gamma_w, lam)
            expected_a, expected_r = reference_token_gae(*streams, GAMMA, gamma_w, lam)
            np.testing.assert_allclose(advantages, expected_a, atol=1e-5, rtol=1e-5)
            np.testing.assert_allclose(returns, expected_r, atol=1e-5, rtol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_float_masks_equal_bool_masks(self):
        streams = random_streams(9, 3, 6, 4, pad_rate=0.2)
        as_float = tuple(x.astype(np.float32) if x.dtype == bool else x for x in streams)
        for gamma_w in (1.0, GAMMA):
            chex.assert_trees_all_close(
                gae_of(self.variant, as_float, gamma_w, 0.95), gae_of(self.variant, streams, gamma_w, 0.95)
            )

    @chex.variants(with_jit=True, without_jit=True)
    def test_one_token_actions_bad_equals_ntpo_equals_action_level(self):
        rewards, values, valid, _, done, bootstrap = random_streams(10, 3, 8, 1, pad_rate=0.0)
        action_end = valid.copy()  # every valid element is a whole action
        streams = (rewards, values, valid, action_end, done, bootstrap)
        bad, _ = gae_of(self.variant, streams, gamma_w=1.0, lam=0.9)
        ntpo, _ = gae_of(self.variant, streams, gamma_w=GAMMA, lam=0.9)
        # Action-level GAE over steps, as PPO implementations write it.
        action_level = np.zeros(rewards.shape)
        for b in range(rewards.shape[0]):
            following_value, following_gae = bootstrap[b], 0.0
            for t in reversed(np.flatnonzero(valid[b])):
                mask = 1.0 - done[b, t]
                delta = rewards[b, t] + GAMMA * mask * following_value - values[b, t]
                following_gae = delta + GAMMA * 0.9 * mask * following_gae
                action_level[b, t] = following_gae
                following_value = values[b, t]
        np.testing.assert_allclose(bad, action_level, atol=1e-5)
        np.testing.assert_allclose(ntpo, action_level, atol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_ntpo_with_unit_gamma_w_is_bad(self):
        streams = random_streams(11, 2, 6, 4, pad_rate=0.1)
        ntpo, _ = gae_of(self.variant, streams, gamma_w=1.0, lam=0.95)
        expected, _ = reference_token_gae(*streams, GAMMA, 1.0, 0.95)
        np.testing.assert_allclose(ntpo, expected, atol=1e-5)
        # and a gamma_w < 1 really changes the advantages of multi-token actions
        smaller, _ = gae_of(self.variant, streams, gamma_w=0.5, lam=0.95)
        self.assertGreater(np.abs(smaller - ntpo).max(), 1e-2)

    @chex.variants(with_jit=True, without_jit=True)
    def test_padding_anywhere_changes_no_valid_advantage(self):
        streams = random_streams(12, 3, 6, 4, pad_rate=0.0)
        base_a, base_r = gae_of(self.variant, streams, gamma_w=1.0, lam=0.95)
        rng = np.random.default_rng(0)
        width = streams[0].shape[1]
        positions = np.sort(rng.integers(0, width + 1, size=7))
        padded = []
        for array in streams[:5]:
            filler = rng.normal(size=(array.shape[0], len(positions))).astype(array.dtype)
            if array.dtype == bool:
                filler = rng.random((array.shape[0], len(positions))) < 0.5
            padded.append(np.insert(array, positions, filler, axis=1))
        padded[2] = np.insert(streams[2], positions, False, axis=1)  # valid
        keep = np.insert(np.ones(width, bool), positions, False)
        pad_a, pad_r = gae_of(self.variant, (*padded, streams[5]), gamma_w=1.0, lam=0.95)
        np.testing.assert_allclose(pad_a[:, keep], base_a, atol=1e-6)
        np.testing.assert_allclose(pad_r[:, keep], base_r, atol=1e-6)
        np.testing.assert_array_equal(pad_a[:, ~keep], 0.0)
        np.testing.assert_array_equal(pad_r[:, ~keep], 0.0)

    @chex.variants(with_jit=True, without_jit=True)
    def test_lambda_one_is_return_minus_value_and_lambda_zero_is_td_error(self):
        streams = random_streams(13, 3, 6, 4, pad_rate=0.15)
        rewards, values, valid, action_end, done, bootstrap = streams
        for gamma_w in (1.0, GAMMA):
            lam_one, returns = gae_of(self.variant, streams, gamma_w, lam=1.0)
            monte_carlo = reference_discounted_return(rewards, valid, action_end, done, bootstrap, GAMMA, gamma_w)
            np.testing.assert_allclose(lam_one, np.where(valid, monte_carlo - values, 0.0), atol=1e-4)
            np.testing.assert_allclose(returns, np.where(valid, monte_carlo, 0.0), atol=1e-4)
            lam_zero, _ = gae_of(self.variant, streams, gamma_w, lam=0.0)
            td_error, _ = reference_token_gae(*streams, GAMMA, gamma_w, 0.0)
            np.testing.assert_allclose(lam_zero, td_error, atol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_parallel_form_equals_scan(self):
        streams = random_streams(14, 4, 10, 4, pad_rate=0.3)
        rewards, values, valid, action_end, done, bootstrap = streams

        @self.variant
        def both(rewards, values, valid, action_end, done, bootstrap):
            discounts = gae_lib.action_discounts(action_end, done, GAMMA)
            scan = gae_lib.token_gae(rewards, values, discounts, valid, bootstrap, 0.9)
            parallel = gae_lib.token_gae_parallel(rewards, values, discounts, valid, bootstrap, 0.9)
            return scan, parallel

        scan, parallel = both(rewards, values, valid, action_end, done, bootstrap)
        chex.assert_trees_all_close(scan, parallel, atol=1e-5)

    def test_action_discounts_values(self):
        action_end = np.array([[0, 0, 1, 1, 0, 1]], bool)
        done = np.array([[0, 1, 0, 1, 0, 0]], bool)  # done read only at action ends
        np.testing.assert_allclose(
            gae_lib.action_discounts(action_end, done, 0.9), [[1.0, 1.0, 0.9, 0.0, 1.0, 0.9]], atol=1e-7
        )
        np.testing.assert_allclose(
            gae_lib.action_discounts(action_end.astype(np.float32), done.astype(np.float32), 0.9, 0.9),
            [[0.9, 0.9, 0.9, 0.0, 0.9, 0.9]],
            atol=1e-7,
        )

    def test_jit_traces_once_per_shape(self):
        @jax.jit
        @chex.assert_max_traces(n=1)
        def gae(rewards, values, valid, action_end, done, bootstrap):
            discounts = gae_lib.action_discounts(action_end, done, GAMMA)
            return gae_lib.token_gae(rewards, values, discounts, valid, bootstrap, 0.95)

        for seed in range(3):
            rewards, values, valid, action_end, done, bootstrap = random_streams(seed, 2, 3, 2, 0.0)
            rewards, values, valid, action_end, done = (
                x[:, :6] for x in (rewards, values, valid, action_end, done)
            )
            gae(rewards, values, valid, action_end, done, bootstrap)[0].block_until_ready()
        with self.assertRaises(AssertionError):  # a new shape would retrace
            gae(*(jnp.zeros((2, 7)) for _ in range(5)), jnp.zeros(2))
        chex.clear_trace_counter()


def test_bad_arguments_give_clear_errors():
    with pytest.raises(gae_lib.BackupError, match="gamma must be in"):
        gae_lib.action_discounts(np.ones((1, 2)), np.zeros((1, 2)), 1.5)
    with pytest.raises(gae_lib.BackupError, match="lam must be in"):
        gae_lib.token_gae(*(np.zeros((1, 2)),) * 4, np.zeros(1), -0.1)
    with pytest.raises(AssertionError):
        gae_lib.token_gae(*(np.zeros((1, 2)),) * 4, np.zeros(3), 0.9)
