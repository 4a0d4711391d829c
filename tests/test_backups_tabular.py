"""Equivalence proofs on random tabular language MDPs (paper §4-5, App. B.3).

BAD's token-level fixed point is the action-level optimum; NTPO's is not,
and its gap follows the closed form in `tabular.ntpo_policy_value_gap`;
soft BAD agrees with the action-level soft value under the action-level KL.
"""

from __future__ import annotations

import numpy as np
import pytest

from poad_jax.core import tabular

GAMMA = 0.9
SEEDS = (0, 1, 2, 3)


def make_mdp(seed: int, min_length: int = 1, max_length: int = 4, num_actions: int = 6) -> tabular.LanguageMDP:
    return tabular.random_language_mdp(
        seed,
        num_states=4,
        num_actions=num_actions,
        vocab_size=4,
        min_length=min_length,
        max_length=max_length,
        end_probability=0.1,
    )


def action_optimum(mdp, gamma=GAMMA):
    """Q*, V* by action-level value iteration, written out here in plain NumPy."""
    q = np.zeros((mdp.num_states, mdp.num_actions))
    for _ in range(5000):
        v = q.max(axis=1)
        q = mdp.rewards + gamma * mdp.transitions @ v
    return q, q.max(axis=1)


def zeros_table(mdp):
    return np.zeros((mdp.num_states, mdp.num_nodes))


def ntpo_optimum(mdp, gamma_w, gamma_a=GAMMA):
    return tabular.value_iteration(lambda q: tabular.ntpo_q_backup(q, mdp, gamma_w, gamma_a), zeros_table(mdp))


def lengthened(mdp, extra_tokens: int):
    """Same dynamics, each action prefixed by `extra_tokens` copies of token 0."""
    actions = [(0,) * extra_tokens + tokens for tokens in tabular.action_tokens(mdp)]
    return tabular.language_mdp(actions, mdp.vocab_size, mdp.rewards, mdp.transitions)


def test_random_mdps_have_the_promised_shape():
    for seed in SEEDS:
        mdp = make_mdp(seed)
        assert mdp.vocab_size >= 3
        assert set(mdp.action_lengths.tolist()) <= {1, 2, 3, 4}
        assert len(set(mdp.action_lengths.tolist())) >= 2
        assert np.all(mdp.transitions.sum(-1) < 1) and np.all((mdp.transitions > 0).sum(-1) >= 2)
        assert [len(a) for a in tabular.action_tokens(mdp)] == mdp.action_lengths.tolist()


@pytest.mark.parametrize("seed", SEEDS)
def test_bad_q_fixed_point_is_the_action_level_optimum(seed):
    mdp = make_mdp(seed)
    q_star, v_star = action_optimum(mdp)
    q_bad = tabular.value_iteration(lambda q: tabular.bad_q_backup(q, mdp, GAMMA), zeros_table(mdp))
    np.testing.assert_allclose(tabular.action_values(q_bad, mdp), q_star, atol=1e-8)
    first_tokens = mdp.children[tabular.ROOT][mdp.children[tabular.ROOT] >= 0]
    np.testing.assert_allclose(q_bad[:, first_tokens].max(axis=1), v_star, atol=1e-8)
    np.testing.assert_allclose(q_bad[:, tabular.ROOT], v_star, atol=1e-8)
    greedy = tabular.greedy_token_actions(q_bad, mdp)
    np.testing.assert_allclose(q_star[np.arange(mdp.num_states), greedy], v_star, atol=1e-8)
    # the library's action-level operator agrees with the loop above
    q_action = tabular.value_iteration(lambda q: tabular.action_q_backup(q, mdp, GAMMA), np.zeros_like(q_star))
    np.testing.assert_allclose(q_action, q_star, atol=1e-8)


@pytest.mark.parametrize("seed", SEEDS)
def test_bad_v_evaluates_the_induced_action_policy(seed):
    mdp = make_mdp(seed)
    token_policy = tabular.random_token_policy(seed + 100, mdp)
    action_policy = tabular.action_policy_from_token_policy(token_policy, mdp)
    np.testing.assert_allclose(action_policy.sum(axis=1), 1.0, atol=1e-12)
    v_bad = tabular.value_iteration(lambda v: tabular.bad_v_backup(v, mdp, token_policy, GAMMA), zeros_table(mdp))
    # V^pi by a linear solve written here
    r_pi = (action_policy * mdp.rewards).sum(1)
    p_pi = np.einsum("sk,skt->st", action_policy, mdp.transitions)
    v_pi = np.linalg.solve(np.eye(mdp.num_states) - GAMMA * p_pi, r_pi)
    np.testing.assert_allclose(v_bad[:, tabular.ROOT], v_pi, atol=1e-8)
    np.testing.assert_allclose(tabular.action_values(v_bad, mdp), mdp.rewards + GAMMA * mdp.transitions @ v_pi, atol=1e-8)
    np.testing.assert_allclose(tabular.action_policy_values(mdp, action_policy, GAMMA), v_pi, atol=1e-10)
    v_action = tabular.value_iteration(
        lambda v: tabular.action_v_backup(v, mdp, action_policy, GAMMA), np.zeros(mdp.num_states)
    )
    np.testing.assert_allclose(v_action, v_pi, atol=1e-8)


@pytest.mark.parametrize("seed", SEEDS)
def test_ntpo_with_unit_gamma_w_is_bad_and_below_one_departs(seed):
    mdp = make_mdp(seed, min_length=2)
    _, v_star = action_optimum(mdp)
    np.testing.assert_allclose(ntpo_optimum(mdp, 1.0)[:, tabular.ROOT], v_star, atol=1e-8)
    v_ntpo = ntpo_optimum(mdp, 0.9)[:, tabular.ROOT]
    assert np.all(v_ntpo < v_star - 1e-3)


def test_one_token_actions_have_no_gap():
    mdp = make_mdp(0, min_length=1, max_length=1, num_actions=4)
    q_star, _ = action_optimum(mdp)
    np.testing.assert_allclose(tabular.action_values(ntpo_optimum(mdp, 0.5), mdp), q_star, atol=1e-8)


@pytest.mark.parametrize("seed", SEEDS)
def test_ntpo_gap_grows_as_gamma_w_falls(seed):
    mdp = make_mdp(seed)
    _, v_star = action_optimum(mdp)
    gaps = [v_star - ntpo_optimum(mdp, gamma_w)[:, tabular.ROOT] for gamma_w in (1.0, 0.95, 0.9, 0.8, 0.6)]
    assert np.all(np.diff(np.stack(gaps), axis=0) >= -1e-9)
    assert gaps[-1].max() > gaps[1].max() + 1e-3


@pytest.mark.parametrize("seed", SEEDS)
def test_ntpo_gap_grows_as_actions_get_longer(seed):
    base = make_mdp(seed)
    _, v_star = action_optimum(base)  # lengthening changes no action-level quantity
    gaps = []
    for extra in (0, 1, 2):
        mdp = lengthened(base, extra)
        gaps.append(v_star - ntpo_optimum(mdp, 0.9)[:, tabular.ROOT])
    assert np.all(np.diff(np.stack(gaps), axis=0) > 1e-6)


@pytest.mark.parametrize("seed", SEEDS)
def test_ntpo_gap_matches_the_closed_form(seed):
    mdp = make_mdp(seed)
    gamma_w = 0.85
    q_star, v_star = action_optimum(mdp)
    q_ntpo = ntpo_optimum(mdp, gamma_w)
    for policy in (tabular.random_token_policy(seed, mdp), None):
        if policy is None:  # deterministic: follow NTPO's own greedy actions
            greedy = tabular.greedy_token_actions(q_ntpo, mdp)
            action_policy = tabular.deterministic_policy(greedy, mdp.num_actions)
            policy = token_policy_spelling(mdp, greedy)
        else:
            action_policy = tabular.action_policy_from_token_policy(policy, mdp)
        evaluated = tabular.value_iteration(
            lambda v: tabular.ntpo_v_backup(v, mdp, policy, gamma_w, GAMMA), zeros_table(mdp)
        )
        v_pi = tabular.action_policy_values(mdp, action_policy, GAMMA)
        gap = tabular.ntpo_policy_value_gap(mdp, action_policy, gamma_w, GAMMA)
        np.testing.assert_allclose(v_pi - evaluated[:, tabular.ROOT], gap, atol=1e-8)
        np.testing.assert_allclose(
            tabular.ntpo_policy_values(mdp, action_policy, gamma_w, GAMMA), evaluated[:, tabular.ROOT], atol=1e-8
        )
        assert np.all(gap > 0)
    # the optimal-value gap is bracketed by the closed form at the two greedy policies
    optimal_gap = v_star - q_ntpo[:, tabular.ROOT]
    at_ntpo_greedy = tabular.ntpo_policy_value_gap(mdp, action_policy, gamma_w, GAMMA)
    at_optimum = tabular.ntpo_policy_value_gap(
        mdp, tabular.deterministic_policy(q_star.argmax(1), mdp.num_actions), gamma_w, GAMMA
    )
    assert np.all(at_ntpo_greedy <= optimal_gap + 1e-9)
    assert np.all(optimal_gap <= at_optimum + 1e-9)


def token_policy_spelling(mdp, actions):
    """Deterministic token policy that spells action `actions[s]` in state s."""
    policy = np.zeros((mdp.num_states, mdp.num_nodes, mdp.vocab_size))
    for state, tokens in enumerate(tabular.action_tokens(mdp)[a] for a in actions):
        node = tabular.ROOT
        for token in tokens:
            policy[state, node, token] = 1.0
            node = mdp.children[node, token]
    # off-path nodes: any valid distribution (uniform) so every prefix is defined
    uniform = tabular.uniform_token_policy(mdp)
    off_path = policy.sum(axis=2, keepdims=True) == 0
    return np.where(off_path, uniform, policy)


@pytest.mark.parametrize("length", [2, 3, 5])
def test_chain_gap_closed_form(length):
    reward, gamma_w, gamma_a = 0.7, 0.8, 0.9
    mdp = tabular.language_mdp([tuple(range(length))], length, [[reward]], [[[1.0]]])
    v_ntpo = ntpo_optimum(mdp, gamma_w, gamma_a)[0, tabular.ROOT]
    scale = gamma_w ** (length - 1)
    expected_ntpo = scale * reward / (1 - gamma_a * scale)  # geometric series written here
    np.testing.assert_allclose(v_ntpo, expected_ntpo, rtol=1e-9)
    np.testing.assert_allclose(
        tabular.ntpo_chain_gap(reward, length, gamma_w, gamma_a), reward / (1 - gamma_a) - v_ntpo, rtol=1e-8
    )


def test_ntpo_prefers_short_actions_and_loses_return():
    # one-step bandit: a 1-token action worth 1.0 and a 4-token action worth 1.2
    mdp = tabular.language_mdp([(0,), (1, 1, 1, 2)], 3, [[1.0, 1.2]], np.zeros((1, 2, 1)))
    for gamma_w, expected in ((1.0, 1), (0.95, 1), (0.9, 0)):
        # NTPO picks the long action iff gamma_w^3 * 1.2 > 1.0
        assert (gamma_w**3 * 1.2 > 1.0) == (expected == 1)
        chosen = tabular.greedy_token_actions(ntpo_optimum(mdp, gamma_w), mdp)
        assert chosen.tolist() == [expected]
    # with gamma_w = gamma_a < 1 for both methods the gap remains
    regret = 1.2 - mdp.rewards[0, tabular.greedy_token_actions(ntpo_optimum(mdp, 0.9, 0.9), mdp)[0]]
    assert regret == pytest.approx(0.2)


@pytest.mark.parametrize("seed", SEEDS)
def test_soft_bad_agrees_with_action_level_soft_value(seed):
    mdp = make_mdp(seed)
    alpha = 0.3
    reference_tokens = tabular.random_token_policy(seed + 7, mdp)
    reference_actions = tabular.action_policy_from_token_policy(reference_tokens, mdp)
    q_soft_tokens = tabular.value_iteration(
        lambda q: tabular.soft_bad_q_backup(q, mdp, reference_tokens, alpha, GAMMA), zeros_table(mdp)
    )
    q_soft_actions = tabular.value_iteration(
        lambda q: tabular.soft_action_q_backup(q, mdp, reference_actions, alpha, GAMMA),
        np.zeros((mdp.num_states, mdp.num_actions)),
    )
    np.testing.assert_allclose(tabular.action_values(q_soft_tokens, mdp), q_soft_actions, atol=1e-8)
    # soft value = max_pi E_pi Q - alpha KL(pi || pi_ref), attained by the soft-optimal policy
    optimal_actions = tabular.soft_action_policy(q_soft_actions, reference_actions, alpha)
    kl = np.sum(optimal_actions * np.log(optimal_actions / reference_actions), axis=1)
    soft_value = np.sum(optimal_actions * q_soft_actions, axis=1) - alpha * kl
    np.testing.assert_allclose(q_soft_tokens[:, tabular.ROOT], soft_value, atol=1e-8)
    # the token-level soft-optimal policy spells the action-level one
    optimal_tokens = tabular.soft_token_policy(q_soft_tokens, mdp, reference_tokens, alpha)
    np.testing.assert_allclose(
        tabular.action_policy_from_token_policy(optimal_tokens, mdp), optimal_actions, atol=1e-8
    )
    # any other policy scores lower under the action-level KL objective
    other = tabular.action_policy_from_token_policy(tabular.random_token_policy(seed + 9, mdp), mdp)
    other_value = np.sum(other * q_soft_actions, 1) - alpha * np.sum(other * np.log(other / reference_actions), 1)
    assert np.all(other_value < soft_value)


def test_bad_inputs_give_clear_errors():
    with pytest.raises(tabular.BackupError, match="prefix-free"):
        tabular.language_mdp([(0,), (0, 1)], 2, np.zeros((1, 2)), np.zeros((1, 2, 1)))
    with pytest.raises(tabular.BackupError, match="outside"):
        tabular.language_mdp([(5,)], 2, np.zeros((1, 1)), np.zeros((1, 1, 1)))
    with pytest.raises(tabular.BackupError, match="rows summing"):
        tabular.language_mdp([(0,)], 2, np.zeros((1, 1)), np.full((1, 1, 1), 2.0))
    mdp = make_mdp(0)
    with pytest.raises(tabular.BackupError, match="did not converge"):
        tabular.value_iteration(lambda q: tabular.bad_q_backup(q, mdp, GAMMA), zeros_table(mdp), max_iterations=3)
    with pytest.raises(tabular.BackupError, match="alpha"):
        tabular.soft_bad_q_backup(zeros_table(mdp), mdp, tabular.uniform_token_policy(mdp), 0.0, GAMMA)
    with pytest.raises(tabular.BackupError, match="token table"):
        tabular.bad_q_backup(np.zeros((1, 1)), mdp, GAMMA)
