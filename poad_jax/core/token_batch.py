"""The TokenBatch: what a rollout hands to the learner (docs/architecture.md).

One row per (thread, step), thread-major: row n = b * T + t for thread b and
step t.  Each row is `prompt (left padded to P columns) + action (A columns,
right padded)`.  Shapes are static per bucket (P, A rounded up) so the
compiled learner is reused.

Token-level methods (POAD, NTPO) gather the action columns of a thread's rows
into one stream `[B, T * A]`; the action-level method (TWOSOME) uses one
element per action, `[B, T]`, and its rows carry all K candidate actions.
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np

from poad_jax.core.layout import positions_from_mask


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TokenBatch:
    """A packed rollout.

    Attributes (N = B * T rows; K candidates for action-level batches, else
    the candidate axis is absent):
      tokens: `[N, L]` or `[N, K, L]` int32, L = P + A.
      positions: same shape, RoPE positions (count of real tokens before).
      key_mask: same shape, bool, real (prompt or action) tokens.
      action_mask: `[N, A]` or `[N, K, A]` bool, real action tokens.
      rewards: `[N]` float32, the env reward of each step.
      dones: `[N]` bool, the episode ended at this step.
      old_logprobs: `[N, A]` (token level) or `[N]` (action level): behaviour
        log-probs recomputed with the learner's own forward pass.
      old_values: `[N, A]` or `[N]`: V(o, w^{<j}) or V(o).
      features: `[N, A, H]` or `[N, H]`: the critic head's input.
      bootstrap_value: `[B]`: V of each thread's next observation.
      chosen: `[N]` int32, index of the taken candidate (action level; None
        at the token level).
      candidate_mask: `[N, K]` bool, real candidates (action level; else None).
      normalizer: `[N, K]` float32, token or word count of each candidate
        (action level; else None).
      allowed_tokens: `[N, A, M]` int32 (token level; None at the action
        level): for trie-constrained actions the token ids that could follow
        the action's prefix at each action column.
      allowed_mask: `[N, A, M]` bool; a column with no True is unconstrained
        (full vocabulary: free-form actions, or the paper code's raw-token
        optimisation).  Token level; else None.
      behaviour_logprobs: `[N, A]` float32 (token level, with
        `ppo.behaviour_correction="importance"`; else None): log mu of each
        action token under the distribution it was drawn from.

    Which fields a batch has, and what they mean, is the method's credit
    scheme's (`poad_jax.agent.methods`): it packs them and reads them.
    """

    tokens: jax.Array
    positions: jax.Array
    key_mask: jax.Array
    action_mask: jax.Array
    rewards: jax.Array
    dones: jax.Array
    old_logprobs: jax.Array
    old_values: jax.Array
    features: jax.Array
    bootstrap_value: jax.Array
    chosen: jax.Array | None = None
    candidate_mask: jax.Array | None = None
    normalizer: jax.Array | None = None
    allowed_tokens: jax.Array | None = None
    allowed_mask: jax.Array | None = None
    behaviour_logprobs: jax.Array | None = None

    @property
    def num_rows(self) -> int:
        return self.rewards.shape[0]

    @property
    def action_len(self) -> int:
        return self.action_mask.shape[-1]

    @property
    def prompt_len(self) -> int:
        return self.tokens.shape[-1] - self.action_len

    @property
    def num_threads(self) -> int:
        return self.bootstrap_value.shape[0]


def pack_rows(
    prompts: list[list[int]], actions: list[list[int]], prompt_len: int, action_len: int, pad_id: int
) -> dict[str, np.ndarray]:
    """Packs prompt/action token lists into left-padded prompt + right-padded action arrays.

    Returns tokens, positions, key_mask `[N, P + A]` and action_mask `[N, A]`.
    """
    num_rows = len(prompts)
    length = prompt_len + action_len
    tokens = np.full((num_rows, length), pad_id, np.int32)
    key_mask = np.zeros((num_rows, length), bool)
    action_mask = np.zeros((num_rows, action_len), bool)
    for n, (prompt, action) in enumerate(zip(prompts, actions)):
        if len(prompt) > prompt_len or len(action) > action_len:
            raise ValueError(
                f"row {n}: prompt {len(prompt)} / action {len(action)} tokens exceed "
                f"the bucket ({prompt_len} / {action_len})"
            )
        if len(prompt) == 0:
            raise ValueError(f"row {n}: empty prompt")
        tokens[n, prompt_len - len(prompt) : prompt_len] = prompt
        key_mask[n, prompt_len - len(prompt) : prompt_len] = True
        tokens[n, prompt_len : prompt_len + len(action)] = action
        key_mask[n, prompt_len : prompt_len + len(action)] = True
        action_mask[n, : len(action)] = True
    positions = positions_from_mask(key_mask)
    return {"tokens": tokens, "positions": positions, "key_mask": key_mask, "action_mask": action_mask}


def token_streams(batch: TokenBatch) -> dict[str, jax.Array]:
    """Per-thread streams `[B, T * A]` of the action tokens (POAD / NTPO).

    The env reward and done sit on each action's last token (`action_end`).
    """
    num_threads, action_len = batch.num_threads, batch.action_len
    chex.assert_rank(batch.action_mask, 2)
    valid = batch.action_mask
    lengths = jnp.sum(valid, axis=-1)
    action_end = jnp.arange(action_len)[None, :] == (lengths[:, None] - 1)
    rewards = jnp.where(action_end, batch.rewards[:, None], 0.0)
    dones = action_end & batch.dones[:, None]

    def stream(x):
        return x.reshape(num_threads, -1)

    return {
        "valid": stream(valid),
        "action_end": stream(action_end),
        "rewards": stream(rewards.astype(jnp.float32)),
        "dones": stream(dones),
        "values": stream(batch.old_values),
    }


def action_streams(batch: TokenBatch) -> dict[str, jax.Array]:
    """Per-thread streams `[B, T]` with one element per action (TWOSOME)."""
    num_threads = batch.num_threads
    chex.assert_rank(batch.old_values, 1)

    def stream(x):
        return x.reshape(num_threads, -1)

    ones = jnp.ones_like(batch.dones)
    return {
        "valid": stream(ones),
        "action_end": stream(ones),
        "rewards": stream(batch.rewards.astype(jnp.float32)),
        "dones": stream(batch.dones),
        "values": stream(batch.old_values),
    }
