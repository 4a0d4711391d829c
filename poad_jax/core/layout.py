"""Shapes and tables shared by the sampler and the batch packer (one implementation each).

- Bucket rounding (`bucket_size`) and the bucket lists: padded shapes are
  rounded up to a few sizes so the jit-compiled sampler and learner compile
  once per bucket, not once per length.
- Positions from a key mask (`positions_from_mask`): the RoPE position of a
  slot is the count of real tokens before it (left padding takes position 0).
- The token trie of a state's valid actions (`action_trie`), the one
  implementation: the trie sampler walks its padded edge tables
  (`build_action_tries`) and the batch packer reads its branching along the
  chosen action (`allowed_next_tokens`), so the behaviour and the optimised
  distributions are the same one.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np

# Prompt buckets (tokens): every multiple of a step up to FINE_PROMPT_LIMIT (short
# prompts, e.g. VirtualHome's 54-84 tokens, pad by less than one step), then a
# coarse ladder (long prompts vary more; finer steps there would recompile more
# than they save).  `prompt_buckets(step)` builds the list; step 0 gives the
# powers of two below the ladder (the buckets before issue 31).
PROMPT_BUCKET_STEP = 16  # the default step (config.prompt_bucket_step)
FINE_PROMPT_LIMIT = 256
COARSE_PROMPT_BUCKETS = (384, 512, 768, 1024, 1536, 2048)
POWER_OF_TWO_PROMPT_BUCKETS = (32, 64, 128, 256)  # step 0
ACTION_BUCKETS = (4, 8, 16, 32, 64, 128, 256)  # action tokens
COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # rows of a sampler call, candidates of a state
POWERS_OF_TWO = tuple(1 << i for i in range(40))


def bucket_size(n: int, buckets: Sequence[int]) -> int:
    """Smallest bucket >= n; beyond the largest, the next multiple of the largest."""
    for b in buckets:
        if n <= b:
            return b
    largest = buckets[-1]
    return -(-n // largest) * largest


def is_prompt_bucket_step(step) -> bool:
    """A valid `prompt_buckets` step: 0, or a positive integer dividing FINE_PROMPT_LIMIT
    (so the fine buckets end exactly where the coarse ladder starts)."""
    return isinstance(step, int) and not isinstance(step, bool) and (
        step == 0 or (0 < step <= FINE_PROMPT_LIMIT and FINE_PROMPT_LIMIT % step == 0))


def prompt_buckets(step: int = PROMPT_BUCKET_STEP) -> tuple[int, ...]:
    """Prompt buckets of a step: (step, 2 step, ..., FINE_PROMPT_LIMIT) + COARSE_PROMPT_BUCKETS;
    step 0: POWER_OF_TWO_PROMPT_BUCKETS + COARSE_PROMPT_BUCKETS.

    A prompt of n <= FINE_PROMPT_LIMIT tokens then pads to ceil(n / step) * step."""
    if not is_prompt_bucket_step(step):
        raise ValueError(f"prompt bucket step must be 0 or a divisor of {FINE_PROMPT_LIMIT}, got {step!r}")
    fine = POWER_OF_TWO_PROMPT_BUCKETS if step == 0 else tuple(range(step, FINE_PROMPT_LIMIT + 1, step))
    return fine + COARSE_PROMPT_BUCKETS


PROMPT_BUCKETS = prompt_buckets()  # the default


def next_power_of_two(n: int, minimum: int = 1) -> int:
    """The smallest power of two >= max(n, minimum) (bucket rounding over powers of two)."""
    return bucket_size(max(n, minimum), POWERS_OF_TWO)


def positions_from_mask(mask):
    """Positions `[..., S]` int32 of a key mask (NumPy or JAX array): the count of
    real tokens before each slot, clipped at 0 (so left padding sits at 0)."""
    if isinstance(mask, np.ndarray):
        return np.maximum(np.cumsum(mask.astype(np.int32), axis=-1) - 1, 0).astype(np.int32)
    import jax.numpy as jnp

    return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)


def action_trie(actions: Sequence[Sequence[int]], end_token_id: int | None, row: int = 0) -> list[list[Any]]:
    """The token trie of one state's candidate actions.

    Nodes `[children {token: node}, action index or -1, depth]`, node 0 the
    root.  An action that is a strict prefix of another gets an end-of-action
    edge on `end_token_id` (so that choice has a probability); without
    `end_token_id` that case is an error.  Duplicate actions map to their
    first index.  `row` only names the state in error messages.
    """
    if not actions:
        raise ValueError(f"row {row} has no candidate actions")
    nodes: list[list[Any]] = [[{}, -1, 0]]
    for index, action in enumerate(actions):
        if not action:
            raise ValueError(f"row {row}: candidate action {index} is empty")
        node = 0
        for token in action:
            children = nodes[node][0]
            if token not in children:
                children[token] = len(nodes)
                nodes.append([{}, -1, nodes[node][2] + 1])
            node = children[token]
        if nodes[node][1] < 0:
            nodes[node][1] = index
    for node in list(nodes):
        children, action, depth = node
        if action >= 0 and children:
            if end_token_id is None:
                raise ValueError(
                    f"row {row}: candidate action {action} is a prefix of another; "
                    "pass end_token_id (e.g. the EOS id) or append an end token to every action"
                )
            if end_token_id in children:
                raise ValueError(f"row {row}: end_token_id {end_token_id} also continues an action")
            children[end_token_id] = len(nodes)
            nodes.append([{}, action, depth + 1])
            node[1] = -1
    return nodes


def allowed_next_tokens(
    chosen: Sequence[int], candidates: Sequence[Sequence[int]], action_len: int, width: int,
    end_token_id: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The trie's branching at each column of the chosen action.

    Column j lists (sorted) the tokens the trie sampler could pick after the
    chosen action's first j tokens.  Returns (`[A, width]` ids, `[A, width]` mask).
    """
    tokens = np.zeros((action_len, width), np.int32)
    mask = np.zeros((action_len, width), bool)
    nodes = action_trie([[int(t) for t in c] for c in candidates], end_token_id)
    node = 0
    for j, token in enumerate(chosen):
        children = nodes[node][0]
        if int(token) not in children:
            raise ValueError(f"the chosen action's token {j} leaves the trie of its candidates")
        options = sorted(children)
        tokens[j, : len(options)] = options
        mask[j, : len(options)] = True
        node = children[int(token)]
    return tokens, mask


class ActionTrie(NamedTuple):
    """Padded edge tables of one token trie per row (node 0 = root).

    `edge_token/edge_child [B, N, K]` int32, `edge_valid [B, N, K]` bool: the
    allowed next tokens at each node and the node each leads to.
    `node_action [B, N]` int32: the candidate index completed at a leaf, else -1;
    `node_depth [B, N]` int32: tokens from the root.  A row is finished when
    its node has no valid edge.
    """

    edge_token: np.ndarray
    edge_child: np.ndarray
    edge_valid: np.ndarray
    node_action: np.ndarray
    node_depth: np.ndarray
    max_depth: int


def build_action_tries(
    candidates: Sequence[Sequence[Sequence[int]]], batch: int, end_token_id: int | None
) -> ActionTrie:
    """`action_trie` of each row's candidate actions, padded into shared-size
    edge tables for the trie sampler (edges sorted by token, as
    `allowed_next_tokens` lists them).  Dummy rows (beyond the candidate
    lists) get the trie of one one-token action."""
    rows = [[[int(t) for t in a] for a in row] for row in candidates]
    rows += [[[0]]] * (batch - len(rows))
    tries = [action_trie(actions, end_token_id, b) for b, actions in enumerate(rows)]
    n_nodes = next_power_of_two(max(len(t) for t in tries), 8)
    n_edges = next_power_of_two(max(len(n[0]) for t in tries for n in t), 4)
    edge_token = np.zeros((batch, n_nodes, n_edges), np.int32)
    edge_child = np.zeros((batch, n_nodes, n_edges), np.int32)
    edge_valid = np.zeros((batch, n_nodes, n_edges), bool)
    node_action = np.full((batch, n_nodes), -1, np.int32)
    node_depth = np.zeros((batch, n_nodes), np.int32)
    for b, nodes in enumerate(tries):
        for i, (children, action, depth) in enumerate(nodes):
            for j, (token, child) in enumerate(sorted(children.items())):
                edge_token[b, i, j], edge_child[b, i, j], edge_valid[b, i, j] = token, child, True
            node_action[b, i], node_depth[b, i] = action, depth
    max_depth = int(node_depth.max())
    return ActionTrie(edge_token, edge_child, edge_valid, node_action, node_depth, max_depth)
