"""Tabular Bellman backups on a finite language MDP: the paper's §4-5 operators
in NumPy float64 (BAD, NTPO, action level, and their soft forms), with the helpers
that prove them equivalent (tests/test_backups_tabular.py) and the ``gamma_w``
notebook.  The streaming form the learner runs is `poad_jax.core.gae`.

Notation as in `poad_jax.core.gae`.  A tabular language MDP is a finite set
of observations ``S`` and a prefix-free set of ``K`` actions over a vocabulary of ``V`` tokens, stored as a trie of
``N`` prefix nodes (node 0 is the empty prefix).  Token tables are ``[S, N]``:
entry ``(s, n)`` is the value of having emitted the prefix of node ``n`` in
observation ``s``, i.e. the token Q-value ``Q(o, w^{1:j})`` of its last token;
at the root it is the observation value ``V(o)``; at a complete action
(a leaf) it is the action's Q-value.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import numpy as np

from poad_jax.core.gae import BackupError, check_unit_interval

ROOT = 0
"""Trie node index of the empty prefix."""

DEFAULT_TOLERANCE = 1e-10
"""Sup-norm change below which `value_iteration` stops."""

DEFAULT_MAX_ITERATIONS = 100_000
"""Iterations after which `value_iteration` gives up."""

PROBABILITY_SLACK = 1e-9
"""Rounding allowed when checking that transition rows sum to at most 1."""

_RANDOM_WEIGHT_FLOOR = 0.05
"""Added to uniform draws in `random_token_policy` so no probability is ~0."""

_TRANSITION_SHARPNESS = 3
"""Power applied to uniform draws in `random_language_mdp`: concentrates each
row on a few successors while keeping every transition possible."""


class LanguageMDP(NamedTuple):
    """A finite language MDP whose actions are token sequences.

    Attributes:
      children: ``[N, V]`` int, child node of node ``n`` by token ``w``, or -1.
      parent: ``[N]`` int, parent node (-1 for the root).
      token: ``[N]`` int, the token that leads into node ``n`` (-1 for the root).
      depth: ``[N]`` int, number of tokens in the node's prefix.
      node_action: ``[N]`` int, the action a complete-action node (leaf)
        spells, or -1.
      action_nodes: ``[K]`` int, the leaf node of each action.
      rewards: ``[S, K]`` ``r(o, a)``.
      transitions: ``[S, K, S]`` ``P(o' | o, a)``; a row may sum to less
        than 1, the missing mass being the probability that the episode ends.
    """

    children: np.ndarray
    parent: np.ndarray
    token: np.ndarray
    depth: np.ndarray
    node_action: np.ndarray
    action_nodes: np.ndarray
    rewards: np.ndarray
    transitions: np.ndarray

    @property
    def num_states(self) -> int:
        return self.rewards.shape[0]

    @property
    def num_actions(self) -> int:
        return self.rewards.shape[1]

    @property
    def num_nodes(self) -> int:
        return self.children.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.children.shape[1]

    @property
    def action_lengths(self) -> np.ndarray:
        """``[K]`` number of tokens of each action."""
        return self.depth[self.action_nodes]

    @property
    def is_leaf(self) -> np.ndarray:
        """``[N]`` true at complete-action nodes."""
        return self.node_action >= 0


def language_mdp(
    actions: Sequence[Sequence[int]], vocab_size: int, rewards, transitions
) -> LanguageMDP:
    """Build a `LanguageMDP`: the trie of ``actions`` plus the dynamics.

    Args:
      actions: ``K`` token sequences, non-empty, prefix-free (no action is a
        prefix of another; real actions end with an end-of-action token).
      vocab_size: ``V``; every token is in ``[0, V)``.
      rewards: ``[S, K]``.
      transitions: ``[S, K, S]``, non-negative, rows summing to at most 1.
    Raises:
      BackupError: on any inconsistency.
    """
    rewards = np.asarray(rewards, np.float64)
    transitions = np.asarray(transitions, np.float64)
    num_actions = len(actions)
    if num_actions == 0:
        raise BackupError("a language MDP needs at least one action")
    if rewards.ndim != 2 or rewards.shape[1] != num_actions:
        raise BackupError(f"rewards must be [S, K={num_actions}], got shape {rewards.shape}")
    num_states = rewards.shape[0]
    if transitions.shape != (num_states, num_actions, num_states):
        raise BackupError(
            f"transitions must be [S, K, S] = {(num_states, num_actions, num_states)}, got {transitions.shape}"
        )
    if np.any(transitions < 0) or np.any(transitions.sum(-1) > 1 + PROBABILITY_SLACK):
        raise BackupError("transitions must be non-negative with rows summing to at most 1")
    children, parent, token, depth = [[-1] * vocab_size], [-1], [-1], [0]
    action_nodes = []
    for index, sequence in enumerate(actions):
        sequence = [int(w) for w in sequence]
        if not sequence:
            raise BackupError(f"action {index} is empty")
        if any(not 0 <= w < vocab_size for w in sequence):
            raise BackupError(f"action {index} {sequence} has a token outside [0, {vocab_size})")
        node = ROOT
        for w in sequence:
            if children[node][w] < 0:
                children[node][w] = len(children)
                children.append([-1] * vocab_size)
                parent.append(node)
                token.append(w)
                depth.append(depth[node] + 1)
            node = children[node][w]
        action_nodes.append(node)
    children = np.asarray(children, np.int64)
    action_nodes = np.asarray(action_nodes, np.int64)
    is_internal = (children >= 0).any(axis=1)
    if len(set(action_nodes.tolist())) != num_actions or is_internal[action_nodes].any():
        raise BackupError("actions must be distinct and prefix-free (no action may be a prefix of another)")
    node_action = np.full(len(children), -1, np.int64)
    node_action[action_nodes] = np.arange(num_actions)
    return LanguageMDP(
        children=children,
        parent=np.asarray(parent, np.int64),
        token=np.asarray(token, np.int64),
        depth=np.asarray(depth, np.int64),
        node_action=node_action,
        action_nodes=action_nodes,
        rewards=rewards,
        transitions=transitions,
    )


def _neither_prefix(first: tuple[int, ...], second: tuple[int, ...]) -> bool:
    shorter = min(len(first), len(second))
    return first[:shorter] != second[:shorter]


def random_language_mdp(
    seed: int,
    num_states: int,
    num_actions: int,
    vocab_size: int,
    min_length: int,
    max_length: int,
    end_probability: float,
    reward_scale: float = 1.0,
) -> LanguageMDP:
    """A random `LanguageMDP` with stochastic transitions and rewards in [0, reward_scale).

    Actions are random token sequences of lengths drawn uniformly in
    ``[min_length, max_length]``, kept only when prefix-free with those drawn
    before (rejection sampling).  Every transition row sums to
    ``1 - end_probability``.
    """
    if vocab_size < 1 or not 1 <= min_length <= max_length:
        raise BackupError("need vocab_size >= 1 and 1 <= min_length <= max_length")
    rng = np.random.default_rng(seed)
    actions: list[tuple[int, ...]] = []
    attempts = 0
    while len(actions) < num_actions:
        attempts += 1
        if attempts > 1000 * num_actions:
            raise BackupError("cannot draw that many prefix-free actions; raise vocab_size or max_length")
        length = int(rng.integers(min_length, max_length + 1))
        candidate = tuple(int(w) for w in rng.integers(0, vocab_size, size=length))
        if all(_neither_prefix(candidate, other) for other in actions):
            actions.append(candidate)
    rewards = reward_scale * rng.random((num_states, num_actions))
    weights = rng.random((num_states, num_actions, num_states)) ** _TRANSITION_SHARPNESS
    transitions = (1.0 - end_probability) * weights / weights.sum(-1, keepdims=True)
    return language_mdp(actions, vocab_size, rewards, transitions)


def action_tokens(mdp: LanguageMDP) -> list[tuple[int, ...]]:
    """The ``K`` token sequences of the actions, read back from the trie."""
    sequences = []
    for node in mdp.action_nodes:
        tokens = []
        while node != ROOT:
            tokens.append(int(mdp.token[node]))
            node = mdp.parent[node]
        sequences.append(tuple(reversed(tokens)))
    return sequences


def _child_table(table: np.ndarray, mdp: LanguageMDP, fill: float) -> np.ndarray:
    """``[S, N, V]``: ``table[s, children[n, w]]``, or ``fill`` where no child."""
    gathered = table[:, np.maximum(mdp.children, 0)]
    return np.where(mdp.children[None] >= 0, gathered, fill)


def _expected_next(values: np.ndarray, mdp: LanguageMDP) -> np.ndarray:
    """``[S, K]``: ``sum_o' P(o' | o, a) values(o')`` (0 past the episode end)."""
    return np.einsum("skt,t->sk", mdp.transitions, values)


def _assemble(mdp: LanguageMDP, leaf_values: np.ndarray, prefix_values: np.ndarray, gamma_w: float) -> np.ndarray:
    """Token table: leaves get ``leaf_values[s, a]``; other non-root nodes
    ``gamma_w * prefix_values``; the root ``prefix_values`` (no token, no discount)."""
    table = gamma_w * prefix_values
    table[:, ROOT] = prefix_values[:, ROOT]
    table[:, mdp.action_nodes] = leaf_values
    return table


def _check_table(table: np.ndarray, mdp: LanguageMDP) -> np.ndarray:
    table = np.asarray(table, np.float64)
    if table.shape != (mdp.num_states, mdp.num_nodes):
        raise BackupError(f"token table must be [S, N] = {(mdp.num_states, mdp.num_nodes)}, got {table.shape}")
    return table


def action_q_backup(q: np.ndarray, mdp: LanguageMDP, gamma: float) -> np.ndarray:
    """Action-level optimal backup (paper Eq. 4), ``[S, K] -> [S, K]``.

        Q(o, a) <- r(o, a) + gamma E_{o'} [ max_{a'} Q(o', a') ]
    """
    check_unit_interval("gamma", gamma)
    return mdp.rewards + gamma * _expected_next(np.max(q, axis=1), mdp)


def action_v_backup(v: np.ndarray, mdp: LanguageMDP, action_policy: np.ndarray, gamma: float) -> np.ndarray:
    """Action-level policy-evaluation backup (paper Eq. 5), ``[S] -> [S]``.

        V(o) <- E_{a ~ pi(.|o)} [ r(o, a) + gamma E_{o'} V(o') ]
    """
    check_unit_interval("gamma", gamma)
    q = mdp.rewards + gamma * _expected_next(v, mdp)
    return np.sum(action_policy * q, axis=1)


def ntpo_q_backup(q: np.ndarray, mdp: LanguageMDP, gamma_w: float, gamma_a: float) -> np.ndarray:
    """Naive token-level optimal backup (paper Eq. 9-10), ``[S, N] -> [S, N]``.

        Q(o, w^{1:j}) <- gamma_w max_{w^{j+1}} Q(o, w^{1:j+1})                 (j < n)
        Q(o, w^{1:n}) <- r(o, a) + gamma_a E_{o'} [ max_{w'^1} Q(o', w'^1) ]   (j = n)

    Every token is treated as an MDP step with discount ``gamma_w``; the
    root entry holds ``V(o) = max_{w^1} Q(o, w^1)``.  See
    `ntpo_policy_value_gap` for how far its fixed point is from the
    action-level one.
    """
    check_unit_interval("gamma_w", gamma_w)
    check_unit_interval("gamma_a", gamma_a)
    q = _check_table(q, mdp)
    best_child = np.max(_child_table(q, mdp, -np.inf), axis=2)
    leaf = mdp.rewards + gamma_a * _expected_next(best_child[:, ROOT], mdp)
    return _assemble(mdp, leaf, best_child, gamma_w)


def bad_q_backup(q: np.ndarray, mdp: LanguageMDP, gamma: float) -> np.ndarray:
    """Bellman backup with Action Decomposition, max form (paper Eq. 13).

        Q(o, w^{1:j}) <- max_{w^{j+1}} Q(o, w^{1:j+1})                        (j < n)
        Q(o, w^{1:n}) <- r(o, a) + gamma E_{o'} [ max_{w'^1} Q(o', w'^1) ]    (j = n)

    No reward and no discount inside an action, the environment's discount
    between actions.  Its fixed point equals the action-level optimum:
    ``Q(o, leaf(a)) = Q*(o, a)`` and ``max_{w^1} Q(o, w^1) = V*(o)``.
    It is `ntpo_q_backup` with ``gamma_w = 1``.
    """
    return ntpo_q_backup(q, mdp, gamma_w=1.0, gamma_a=gamma)


def ntpo_v_backup(
    v: np.ndarray, mdp: LanguageMDP, token_policy: np.ndarray, gamma_w: float, gamma_a: float
) -> np.ndarray:
    """Naive token-level policy evaluation, ``[S, N] -> [S, N]``.

        Q(o, w^{1:j}) <- gamma_w E_{w^{j+1} ~ pi} Q(o, w^{1:j+1})             (j < n)
        Q(o, w^{1:n}) <- r(o, a) + gamma_a E_{o'} V(o'),   V(o) = E_{w^1 ~ pi} Q(o, w^1)

    Args:
      token_policy: ``[S, N, V]``, ``pi(w | o, prefix n)``, zero where node
        ``n`` has no child ``w`` (rows at leaves are ignored).
    """
    check_unit_interval("gamma_w", gamma_w)
    check_unit_interval("gamma_a", gamma_a)
    v = _check_table(v, mdp)
    expected_child = np.sum(token_policy * _child_table(v, mdp, 0.0), axis=2)
    leaf = mdp.rewards + gamma_a * _expected_next(expected_child[:, ROOT], mdp)
    return _assemble(mdp, leaf, expected_child, gamma_w)


def bad_v_backup(v: np.ndarray, mdp: LanguageMDP, token_policy: np.ndarray, gamma: float) -> np.ndarray:
    """BAD policy evaluation (paper Eq. 14, the backup POAD's critic learns).

        V(o, w^{<j}) <- E_{w^j ~ pi} V(o, w^{<j+1})                        (j < n)
        V(o, w^{<n}) <- E_{w^n ~ pi} [ r(o, a) + gamma E_{o'} V(o') ]       (j = n)

    Table entry ``(o, n)`` is the value after the prefix of node ``n``;
    at a leaf it is ``Q^pi(o, a)``, at the root ``V^pi(o)``.  Its fixed point
    is the action-level ``V^pi`` of the induced action policy
    ``pi(a | o) = prod_j pi(w^j | o, w^{<j})``.
    """
    return ntpo_v_backup(v, mdp, token_policy, gamma_w=1.0, gamma_a=gamma)


def _log_expectation_exp(log_weights: np.ndarray, values: np.ndarray, alpha: float, axis: int) -> np.ndarray:
    """``alpha log sum_i exp(log_weights_i + values_i / alpha)``, stably (-inf weights ignored)."""
    scaled = log_weights + values / alpha
    peak = np.max(scaled, axis=axis, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    total = np.sum(np.exp(scaled - peak), axis=axis)
    with np.errstate(divide="ignore"):
        return alpha * (np.log(total) + np.squeeze(peak, axis))


def _safe_log(probabilities: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(probabilities)


def soft_action_q_backup(
    q: np.ndarray, mdp: LanguageMDP, reference_policy: np.ndarray, alpha: float, gamma: float
) -> np.ndarray:
    """Action-level KL-regularised (soft) backup, ``[S, K] -> [S, K]``.

        Q(o, a) <- r(o, a) + gamma E_{o'} V(o')
        V(o)     = alpha log sum_a pi_ref(a | o) exp(Q(o, a) / alpha)
                 = max_pi E_{a ~ pi} Q(o, a) - alpha KL(pi(.|o) || pi_ref(.|o))

    Args:
      reference_policy: ``[S, K]`` ``pi_ref(a | o)``.
      alpha: temperature > 0.
    """
    check_unit_interval("gamma", gamma)
    if not alpha > 0:
        raise BackupError(f"alpha must be > 0, got {alpha}")
    v = _log_expectation_exp(_safe_log(reference_policy), q, alpha, axis=1)
    return mdp.rewards + gamma * _expected_next(v, mdp)


def soft_bad_q_backup(
    q: np.ndarray, mdp: LanguageMDP, reference_token_policy: np.ndarray, alpha: float, gamma: float
) -> np.ndarray:
    """Soft BAD (sBAD, paper App. B.3), ``[S, N] -> [S, N]``.

        Q(o, w^{1:j}) <- alpha log sum_w pi_ref(w | o, w^{1:j}) exp(Q(o, w^{1:j}, w) / alpha)   (j < n)
        Q(o, w^{1:n}) <- r(o, a) + gamma E_{o'} V(o'),   V(o) = Q(o, root)

    The KL to the reference is paid token by token with no intra-action
    discount.  By the chain rule of KL, the nested log-sum-exps collapse to
    the action-level one under ``pi_ref(a | o) = prod_j pi_ref(w^j | ...)``,
    so the fixed point agrees with `soft_action_q_backup`'s.

    Args:
      reference_token_policy: ``[S, N, V]`` ``pi_ref(w | o, prefix n)``.
      alpha: temperature > 0.
    """
    check_unit_interval("gamma", gamma)
    if not alpha > 0:
        raise BackupError(f"alpha must be > 0, got {alpha}")
    q = _check_table(q, mdp)
    log_reference = _safe_log(reference_token_policy)
    log_reference = np.where(mdp.children[None] >= 0, log_reference, -np.inf)
    soft_child = _log_expectation_exp(log_reference, _child_table(q, mdp, 0.0), alpha, axis=2)
    leaf = mdp.rewards + gamma * _expected_next(soft_child[:, ROOT], mdp)
    return _assemble(mdp, leaf, soft_child, 1.0)


def value_iteration(
    backup: Callable[[np.ndarray], np.ndarray],
    initial: np.ndarray,
    tolerance: float = DEFAULT_TOLERANCE,
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
) -> np.ndarray:
    """Iterate ``x <- backup(x)`` until ``max |x_new - x| <= tolerance``; the fixed point.

    Raises:
      BackupError: if it has not converged after ``max_iterations``.
    """
    current = np.asarray(initial, np.float64)
    for _ in range(max_iterations):
        updated = backup(current)
        if np.max(np.abs(updated - current)) <= tolerance:
            return updated
        current = updated
    raise BackupError(f"value iteration did not converge in {max_iterations} iterations")


def action_values(token_table: np.ndarray, mdp: LanguageMDP) -> np.ndarray:
    """``[S, K]``: the token table read at each complete action (its last token)."""
    return _check_table(token_table, mdp)[:, mdp.action_nodes]


def greedy_token_actions(token_table: np.ndarray, mdp: LanguageMDP) -> np.ndarray:
    """``[S]``: the action spelled by picking, token by token, the child of highest value."""
    table = _check_table(token_table, mdp)
    child_values = _child_table(table, mdp, -np.inf)
    node = np.full(mdp.num_states, ROOT)
    states = np.arange(mdp.num_states)
    for _ in range(int(mdp.depth.max())):
        at_leaf = mdp.is_leaf[node]
        best_token = np.argmax(child_values[states, node], axis=1)
        node = np.where(at_leaf, node, mdp.children[node, best_token])
    return mdp.node_action[node]


def uniform_token_policy(mdp: LanguageMDP) -> np.ndarray:
    """``[S, N, V]``: uniform over each node's children (zeros at leaves)."""
    has_child = (mdp.children >= 0).astype(np.float64)
    counts = np.maximum(has_child.sum(axis=1, keepdims=True), 1.0)
    return np.broadcast_to(has_child / counts, (mdp.num_states,) + mdp.children.shape).copy()


def random_token_policy(seed: int, mdp: LanguageMDP) -> np.ndarray:
    """``[S, N, V]``: random positive probabilities over each node's children."""
    rng = np.random.default_rng(seed)
    weights = rng.random((mdp.num_states,) + mdp.children.shape) + _RANDOM_WEIGHT_FLOOR
    weights = np.where(mdp.children[None] >= 0, weights, 0.0)
    totals = weights.sum(axis=2, keepdims=True)
    return np.divide(weights, totals, out=np.zeros_like(weights), where=totals > 0)


def action_policy_from_token_policy(token_policy: np.ndarray, mdp: LanguageMDP) -> np.ndarray:
    """``[S, K]``: ``pi(a | o) = prod_j pi(w^j | o, w^{<j})`` along each action's trie path."""
    reach = np.ones((mdp.num_states, mdp.num_nodes))
    # Nodes are created parent-first, so one pass in index order suffices.
    for node in range(1, mdp.num_nodes):
        parent = mdp.parent[node]
        reach[:, node] = reach[:, parent] * token_policy[:, parent, mdp.token[node]]
    return reach[:, mdp.action_nodes]


def soft_token_policy(
    soft_table: np.ndarray, mdp: LanguageMDP, reference_token_policy: np.ndarray, alpha: float
) -> np.ndarray:
    """``[S, N, V]``: the sBAD-optimal token policy.

        pi*(w | o, n) = pi_ref(w | o, n) exp((Q(o, n w) - Q(o, n)) / alpha)
    """
    table = _check_table(soft_table, mdp)
    log_ratio = (_child_table(table, mdp, 0.0) - table[:, :, None]) / alpha
    policy = reference_token_policy * np.exp(log_ratio)
    return np.where(mdp.children[None] >= 0, policy, 0.0)


def soft_action_policy(soft_q: np.ndarray, reference_policy: np.ndarray, alpha: float) -> np.ndarray:
    """``[S, K]``: ``pi*(a | o) proportional to pi_ref(a | o) exp(Q(o, a) / alpha)``."""
    logits = _safe_log(reference_policy) + soft_q / alpha
    logits = logits - np.max(logits, axis=1, keepdims=True)
    weights = np.exp(logits)
    return weights / weights.sum(axis=1, keepdims=True)


def action_policy_values(mdp: LanguageMDP, action_policy: np.ndarray, gamma: float) -> np.ndarray:
    """``[S]``: ``V^pi = (I - gamma P_pi)^{-1} r_pi`` (action-level, closed form)."""
    check_unit_interval("gamma", gamma)
    r_pi = np.sum(action_policy * mdp.rewards, axis=1)
    p_pi = np.einsum("sk,skt->st", action_policy, mdp.transitions)
    return np.linalg.solve(np.eye(mdp.num_states) - gamma * p_pi, r_pi)


def ntpo_action_scale(mdp: LanguageMDP, gamma_w: float) -> np.ndarray:
    """``[K]``: ``gamma_w^(|a| - 1)``, how much NTPO discounts an action's whole value."""
    return np.asarray(gamma_w, np.float64) ** (mdp.action_lengths - 1)


def ntpo_policy_values(
    mdp: LanguageMDP, action_policy: np.ndarray, gamma_w: float, gamma_a: float
) -> np.ndarray:
    """``[S]``: NTPO's value of an action policy, in closed form.

    Unrolling Eq. 9 inside an action gives
    ``Q_N(o, w^1) = gamma_w^(|a|-1) [ r(o, a) + gamma_a E V_N(o') ]``: NTPO is
    the action-level MDP whose reward AND discount of action ``a`` are
    scaled by ``g_a = gamma_w^(|a|-1)``.  Hence, with
    ``r~_pi(o) = E_pi[g_a r(o, a)]`` and ``P~_pi(o'|o) = E_pi[g_a P(o'|o, a)]``::

        V_N^pi = (I - gamma_a P~_pi)^{-1} r~_pi
    """
    check_unit_interval("gamma_w", gamma_w)
    check_unit_interval("gamma_a", gamma_a)
    scaled_policy = action_policy * ntpo_action_scale(mdp, gamma_w)[None]
    r_scaled = np.sum(scaled_policy * mdp.rewards, axis=1)
    p_scaled = np.einsum("sk,skt->st", scaled_policy, mdp.transitions)
    return np.linalg.solve(np.eye(mdp.num_states) - gamma_a * p_scaled, r_scaled)


def ntpo_policy_value_gap(
    mdp: LanguageMDP, action_policy: np.ndarray, gamma_w: float, gamma_a: float
) -> np.ndarray:
    """``[S]``: ``V^pi - V_N^pi``, the action-level value NTPO fails to see.

    Derivation.  With ``g_a = gamma_w^(|a|-1)``, ``Q^pi(o, a) = r(o, a) +
    gamma_a E V^pi(o')`` and ``V_N^pi = r~_pi + gamma_a P~_pi V_N^pi`` (see
    `ntpo_policy_values`), subtract ``V^pi = E_pi Q^pi``::

        V^pi - V_N^pi = E_pi[(1 - g_a) Q^pi(o, a)] + gamma_a P~_pi (V^pi - V_N^pi)

    so::

        gap_pi = (I - gamma_a P~_pi)^{-1}  E_{a~pi}[ (1 - gamma_w^(|a|-1)) Q^pi(o, a) ]

    Each action loses the fraction ``1 - gamma_w^(|a|-1)`` of its value, and
    the losses are propagated by NTPO's own (shrunk) discounting.  The gap is
    zero iff ``gamma_w = 1`` (BAD) or every action has one token, and - for
    non-negative rewards - it grows as ``gamma_w`` falls and as actions get
    longer (paper §4.2 insights (i), (ii)).  Special case, one action of
    ``n`` tokens repeated forever with reward ``r``::

        gap = r (1 - gamma_w^(n-1)) / ((1 - gamma_a) (1 - gamma_a gamma_w^(n-1)))

    The optimal-value gap ``V* - V_N*`` is bracketed by this closed form at
    NTPO's greedy policy (below) and at the action-level optimal policy
    (above).
    """
    q_pi = mdp.rewards + gamma_a * _expected_next(action_policy_values(mdp, action_policy, gamma_a), mdp)
    scale = ntpo_action_scale(mdp, gamma_w)
    lost = np.sum(action_policy * (1.0 - scale)[None] * q_pi, axis=1)
    p_scaled = np.einsum("sk,skt->st", action_policy * scale[None], mdp.transitions)
    return np.linalg.solve(np.eye(mdp.num_states) - gamma_a * p_scaled, lost)


def deterministic_policy(actions: np.ndarray, num_actions: int) -> np.ndarray:
    """``[S, K]`` one-hot action policy from ``[S]`` action indices."""
    return np.eye(num_actions)[np.asarray(actions)]


def ntpo_chain_gap(reward: float, action_length: int, gamma_w: float, gamma_a: float) -> float:
    """Closed-form gap of one ``n``-token action repeated forever with reward ``r``.

        gap = r (1 - gamma_w^(n-1)) / ((1 - gamma_a) (1 - gamma_a gamma_w^(n-1)))
    """
    scale = gamma_w ** (action_length - 1)
    return reward * (1.0 - scale) / ((1.0 - gamma_a) * (1.0 - gamma_a * scale))
