"""Streaming Bellman backups for language agents: BAD (POAD), NTPO and action level.

What the learner runs, in JAX (`jax.jit`-able): `action_discounts` and
`token_gae` (plus `token_gae_parallel`, the same numbers from an associative
scan).  Arrays are batch-major ``[B, T]``; one row is the stream of action
tokens of one rollout thread (docs/architecture.md).  The tabular forms of the same
operators, with the equivalence proofs, are `poad_jax.core.tabular`.

Notation.  An observation ``o_t`` is answered by an action
``a_t = (w_t^1 .. w_t^n)`` of ``n = |a_t|`` tokens; the environment returns
``r_t`` and ``o_{t+1}``.  ``V_t^j = V(o_t, w_t^{<j})`` is the value of the
prefix before token ``j``.

Streaming BAD (POAD, paper Eq. 14 under a policy)::

    inside an action (j < n):  V_t^j <- V_t^{j+1}                      (d = gamma_w = 1)
    last token      (j = n):   V_t^n <- r_t + gamma (1 - done_t) V_{t+1}^1

Token-level GAE over a stream with per-token discount ``d_j``::

    delta_j = r_j + d_j V_next(j) - V_j
    A_j     = delta_j + d_j lam A_next(j)
    R_j     = A_j + V_j

- **POAD / BAD**: ``d = 1`` inside an action, ``gamma (1 - done)`` at its end
  (``action_discounts(..., gamma_w=1)``).
- **NTPO**: the same with ``d = gamma_w`` inside the action (usually
  ``gamma_w = gamma``).
- **Action-level GAE (TWOSOME)** is `token_gae` on a stream with ONE element
  per action: the element carries ``V(o_t)``, ``r_t`` and the action's
  log-probability, ``action_end`` is all true, so every discount is
  ``gamma (1 - done)``.  One scan serves all three methods; they differ only
  in the discount vector and in what one stream element is.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

class BackupError(ValueError):
    """A bad argument to a backup (invalid MDP, discount out of range, ...)."""


def check_unit_interval(name: str, value) -> None:
    """Raise `BackupError` when a concrete Python number is outside [0, 1]."""
    if isinstance(value, (int, float)) and not 0.0 <= float(value) <= 1.0:
        raise BackupError(f"{name} must be in [0, 1], got {value}")


def action_discounts(action_end: chex.Array, done: chex.Array, gamma, gamma_w=1.0) -> chex.Array:
    """Per-token discounts ``[B, T]`` of a token stream.

        d_j = gamma * (1 - done_j)   if token j ends an action
        d_j = gamma_w                otherwise

    ``gamma_w = 1`` is BAD (POAD); ``gamma_w = gamma`` is NTPO.  For an
    action-level stream (TWOSOME) pass ``action_end`` all true.

    Args:
      action_end: ``[B, T]`` bool/float, true at the last token of an action.
      done: ``[B, T]`` bool/float, true where the episode ends after this
        action (read only at action ends).
      gamma: inter-action discount ``gamma_a``.
      gamma_w: intra-action discount.
    Returns:
      ``[B, T]`` float32 discounts (padding positions get some value; the
      scan ignores them).
    """
    chex.assert_rank([action_end, done], 2)
    chex.assert_equal_shape([action_end, done])
    check_unit_interval("gamma", gamma)
    check_unit_interval("gamma_w", gamma_w)
    is_end = jnp.asarray(action_end).astype(bool)
    not_done = 1.0 - jnp.asarray(done).astype(jnp.float32)
    at_end = jnp.asarray(gamma, jnp.float32) * not_done
    inside = jnp.full(is_end.shape, gamma_w, jnp.float32)
    return jnp.where(is_end, at_end, inside)


def action_lambdas(action_end: chex.Array, lam) -> chex.Array:
    """Per-token GAE lambdas ``[B, T]`` that apply lambda where gamma applies.

        lam_j = lam   if token j ends an action
        lam_j = 1     otherwise

    With BAD's discounts (1 inside an action) `token_gae` then blends
    n-step returns only across actions, never inside one, and

        A_t^1 = A_t                    (action-level GAE with V(o_t) = V_t^1)
        A_t^j = A_t^1 + V_t^1 - V_t^j  (that estimate minus the prefix's value)

    (tests/test_backups.py proves both), where a per-token lambda makes each
    token's advantage lean on the values of the prefixes after it inside its
    own action (`ppo.lambda_scope`, docs/backups.md).

    Args:
      action_end: ``[B, T]`` bool/float, true at the last token of an action.
      lam: the GAE lambda applied between actions.
    Returns:
      ``[B, T]`` float32.
    """
    chex.assert_rank(action_end, 2)
    check_unit_interval("lam", lam)
    is_end = jnp.asarray(action_end).astype(bool)
    return jnp.where(is_end, jnp.asarray(lam, jnp.float32), 1.0)


def _check_stream(rewards, values, discounts, valid, bootstrap_value) -> None:
    chex.assert_rank([rewards, values, discounts, valid, bootstrap_value], [2, 2, 2, 2, 1])
    chex.assert_equal_shape([rewards, values, discounts, valid])
    chex.assert_equal_shape_prefix([rewards, bootstrap_value], 1)


def token_gae(rewards, values, discounts, valid, bootstrap_value, lam, *, unroll: int = 1):
    """Token-level GAE over padded streams: one reverse `jax.lax.scan`.

    For each valid position ``j`` of a row, with ``next(j)`` the next valid
    position (``V_next = bootstrap_value`` and ``A_next = 0`` past the last)::

        delta_j = r_j + d_j V_next(j) - V_j
        A_j     = delta_j + d_j lam_j A_next(j)
        R_j     = A_j + V_j

    The carry is ``(V_next, A_next)``; an invalid (padding) position passes
    it through unchanged and gets ``A = R = 0``, so inserting padding
    anywhere changes no valid advantage.  ``lam = 1`` gives the discounted
    return minus ``V``; ``lam = 0`` gives ``delta``.

    Args:
      rewards: ``[B, T]`` rewards (non-zero only at action ends).
      values: ``[B, T]`` ``V(o_t, w_t^{<j})`` recorded at sampling time.
      discounts: ``[B, T]`` from `action_discounts`.
      valid: ``[B, T]`` bool/float, false on padding.
      bootstrap_value: ``[B]`` value of the observation after the stream.
      lam: GAE lambda: a number, or ``[B, T]`` per-token lambdas
        (`action_lambdas`).
      unroll: `lax.scan` unroll factor (speed only; same numbers).
    Returns:
      ``(advantages, returns)``, both ``[B, T]`` float32.
    """
    _check_stream(rewards, values, discounts, valid, bootstrap_value)
    check_unit_interval("lam", lam)
    as_f32 = lambda x: jnp.asarray(x, jnp.float32)
    # Time-major copies behind an optimisation barrier: left to itself XLA
    # fuses the transposes into the loop body, a strided read every step
    # (several times slower on CPU).
    rewards_tb, values_tb, discounts_tb, valid_tb = jax.lax.optimization_barrier(
        (as_f32(rewards).T, as_f32(values).T, as_f32(discounts).T, jnp.asarray(valid).astype(bool).T)
    )
    per_token = jnp.ndim(lam) > 0
    if per_token:
        chex.assert_equal_shape([rewards, lam])
        lambdas_tb = jax.lax.optimization_barrier(as_f32(lam).T)
    else:
        lam = as_f32(lam)

    def step(carry, x):
        next_value, next_advantage = carry
        if per_token:
            reward, value, discount, is_valid, lam_j = x
        else:
            (reward, value, discount, is_valid), lam_j = x, lam
        delta = reward + discount * next_value - value
        advantage = delta + discount * lam_j * next_advantage
        carry = (
            jnp.where(is_valid, value, next_value),
            jnp.where(is_valid, advantage, next_advantage),
        )
        return carry, jnp.where(is_valid, advantage, 0.0)

    init = (as_f32(bootstrap_value), jnp.zeros_like(as_f32(bootstrap_value)))
    xs = (rewards_tb, values_tb, discounts_tb, valid_tb) + ((lambdas_tb,) if per_token else ())
    _, advantages_tb = jax.lax.scan(step, init, xs, reverse=True, unroll=unroll)
    returns_tb = jnp.where(valid_tb, advantages_tb + values_tb, 0.0)
    advantages_tb, returns_tb = jax.lax.optimization_barrier((advantages_tb, returns_tb))
    advantages, returns = advantages_tb.T, returns_tb.T
    return advantages, returns


def next_valid_values(values, valid, bootstrap_value) -> chex.Array:
    """``[B, T]``: the value of the next valid position after each position.

        V_next(j) = V_{k},  k = min{k > j : valid_k},  or bootstrap_value if none
    """
    chex.assert_rank([values, valid, bootstrap_value], [2, 2, 1])
    values = jnp.asarray(values, jnp.float32)
    is_valid = jnp.asarray(valid).astype(bool)
    num_steps = values.shape[1]
    positions = jnp.arange(num_steps)
    # Index of the first valid position at or after j (num_steps if none),
    # then shifted by one to mean "strictly after j".
    at_or_after = jax.lax.cummin(jnp.where(is_valid, positions, num_steps), axis=1, reverse=True)
    after = jnp.concatenate(
        [at_or_after[:, 1:], jnp.full((values.shape[0], 1), num_steps, at_or_after.dtype)], axis=1
    )
    padded = jnp.concatenate([values, jnp.asarray(bootstrap_value, jnp.float32)[:, None]], axis=1)
    return jnp.take_along_axis(padded, after, axis=1)


def token_gae_parallel(rewards, values, discounts, valid, bootstrap_value, lam):
    """`token_gae` computed with `jax.lax.associative_scan` (O(log T) depth).

    The advantage recursion over valid positions is the linear recurrence
    ``A_j = delta_j + c_j A_{j+1}`` with ``c_j = d_j lam``; padding becomes the
    identity element ``(c, delta) = (1, 0)``.  Affine maps compose
    associatively::

        (c_1, b_1) o (c_2, b_2) = (c_1 c_2, b_1 + c_1 b_2)

    so a reverse associative scan yields every ``A_j`` at once.  ``V_next``
    comes from `next_valid_values`.  Same contract and results as
    `token_gae` (up to float re-association).
    """
    _check_stream(rewards, values, discounts, valid, bootstrap_value)
    check_unit_interval("lam", lam)
    values = jnp.asarray(values, jnp.float32)
    discounts = jnp.asarray(discounts, jnp.float32)
    is_valid = jnp.asarray(valid).astype(bool)
    next_value = next_valid_values(values, is_valid, bootstrap_value)
    delta = jnp.asarray(rewards, jnp.float32) + discounts * next_value - values
    if jnp.ndim(lam) > 0:
        chex.assert_equal_shape([rewards, lam])
    coefficient = jnp.where(is_valid, discounts * jnp.asarray(lam, jnp.float32), 1.0)
    offset = jnp.where(is_valid, delta, 0.0)

    def compose(earlier, later):
        # `earlier` holds positions before `later` in the stream.
        c_1, b_1 = earlier
        c_2, b_2 = later
        return c_1 * c_2, b_1 + c_1 * b_2

    # reverse=True hands the combine function (later, earlier) operands.
    _, advantages = jax.lax.associative_scan(
        lambda later, earlier: compose(earlier, later), (coefficient, offset), reverse=True, axis=1
    )
    advantages = jnp.where(is_valid, advantages, 0.0)
    returns = jnp.where(is_valid, advantages + values, 0.0)
    return advantages, returns
