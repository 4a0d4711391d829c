# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %%
# Colab: install the package (edit PACKAGE_SOURCE to point at your copy of the
# repository). Locally, where the package is installed, this cell does nothing.
import subprocess
import sys

PACKAGE_SOURCE = "git+https://github.com/poad-jax/poad_jax"
if "google.colab" in sys.modules:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", PACKAGE_SOURCE], check=True)

# %% [markdown]
# # Why the intra-action discount must be 1: the $\gamma_w$ derivation
#
# A language agent answers an observation $o_t$ with an action
# $a_t = (w_t^1, \dots, w_t^n)$ of $n = |a_t|$ tokens. Optimising it token by
# token is attractive (finer credit, no need to enumerate actions), but *how*
# the Bellman backup treats the tokens inside an action decides whether the
# token-level optimum is still the action-level optimum.
#
# This notebook derives, step by step, how the **naive token-level backup**
# (NTPO, paper Eq. 9-10) departs from the action-level optimum (Eq. 11-12),
# and why the **Bellman backup with Action Decomposition** (BAD, Eq. 13-14)
# removes the gap. Every claim is checked numerically with `poad_jax.core.tabular`
# on small tabular language MDPs.

# %%
import matplotlib.pyplot as plt
import numpy as np

from poad_jax.core import tabular

np.set_printoptions(precision=4, suppress=True)
GAMMA_A = 0.9  # discount between actions


def optimal_q(mdp, gamma_w, gamma_a=GAMMA_A):
    """Token table at the fixed point of the NTPO backup (BAD when gamma_w = 1)."""
    initial = np.zeros((mdp.num_states, mdp.num_nodes))
    return tabular.value_iteration(lambda q: tabular.ntpo_q_backup(q, mdp, gamma_w, gamma_a), initial)


def action_level_optimum(mdp, gamma_a=GAMMA_A):
    q = tabular.value_iteration(
        lambda q: tabular.action_q_backup(q, mdp, gamma_a), np.zeros((mdp.num_states, mdp.num_actions))
    )
    return q, q.max(axis=1)


# %% [markdown]
# ## 1. A small language MDP
#
# Observations $o \in \mathcal{S}$, a prefix-free set of actions spelled over a
# vocabulary of $V$ tokens (stored as a trie of prefixes), rewards $r(o, a)$
# and stochastic transitions $P(o' \mid o, a)$ whose rows may sum to less than
# one (the rest is the probability that the episode ends).

# %%
mdp = tabular.random_language_mdp(
    seed=0, num_states=4, num_actions=6, vocab_size=4, min_length=1, max_length=4, end_probability=0.1
)
for index, tokens in enumerate(tabular.action_tokens(mdp)):
    print(f"action {index}: tokens {tokens}  (|a| = {len(tokens)})")
print("rewards r(o, a):\n", mdp.rewards)

# %% [markdown]
# ## 2. The action-level optimum (Eq. 4-5)
#
# $$Q^*(o, a) = r(o, a) + \gamma_a \, \mathbb{E}_{o'}\big[\max_{a'} Q^*(o', a')\big],
# \qquad V^*(o) = \max_a Q^*(o, a).$$
#
# This is what TWOSOME-style action-level methods optimise, and the target any
# token-level method should reach.

# %%
q_star, v_star = action_level_optimum(mdp)
print("V*(o) =", v_star)
print("optimal actions:", q_star.argmax(axis=1))

# %% [markdown]
# ## 3. The naive token-level backup (Eq. 9-10)
#
# Flatten every action into tokens and treat each token as an MDP step with
# discount $\gamma_w$:
#
# $$Q(o, w^{1:j}) = 0 + \gamma_w \max_{w^{j+1}} Q(o, w^{1:j+1}) \quad (j < n),$$
# $$Q(o, w^{1:n}) = r(o, a) + \gamma_a \, \mathbb{E}_{o'}\big[\max_{w'^1} Q(o', w'^1)\big] \quad (j = n).$$
#
# **Unrolling inside an action.** Write $Q_N(o, a) := Q(o, w^{1:n})$ for the
# value at the action's last token. By induction from $j = n$ down,
#
# $$Q(o, w^{1:j}) = \max_{a \,\sqsupseteq\, w^{1:j}} \gamma_w^{\,|a| - j}\, Q_N(o, a),$$
#
# because each step up the trie multiplies by $\gamma_w$ and takes a max over
# the continuations. At the first token ($j = 1$) and at the observation:
#
# $$V_N(o) = \max_{w^1} Q(o, w^1) = \max_a \gamma_w^{\,|a|-1}\Big[r(o, a) + \gamma_a \, \mathbb{E}_{o'} V_N(o')\Big].$$
#
# So **NTPO solves a different action-level MDP**: the reward *and* the
# discount of action $a$ are scaled by $g_a = \gamma_w^{|a|-1}$. Two
# consequences (the paper's insights):
#
# 1. for $\gamma_w < 1$ the optimum moves: long actions are penalised, so the
#    greedy token policy may pick a shorter, worse action;
# 2. the discrepancy grows as $\gamma_w$ falls and as actions get longer
#    ($g_a$ shrinks in both cases).
#
# Check the unrolled form: NTPO value iteration on tokens equals action-level
# value iteration on the length-scaled MDP (written out here, independently).

# %%
gamma_w = 0.8
q_ntpo = optimal_q(mdp, gamma_w)
scale = gamma_w ** (mdp.action_lengths - 1)  # g_a
q_scaled = np.zeros_like(q_star)
for _ in range(3000):
    q_scaled = scale * (mdp.rewards + GAMMA_A * mdp.transitions @ q_scaled.max(axis=1))
print("NTPO V_N(o) from token backups :", q_ntpo[:, tabular.ROOT])
print("length-scaled action-level MDP :", q_scaled.max(axis=1))
print("action-level V*(o)             :", v_star)
assert np.allclose(q_ntpo[:, tabular.ROOT], q_scaled.max(axis=1), atol=1e-8)

# %% [markdown]
# ### The gap in closed form
#
# Fix an action policy $\pi(a \mid o)$. Action level:
# $V^\pi = \mathbb{E}_\pi[Q^\pi]$ with $Q^\pi(o,a) = r(o,a) + \gamma_a \mathbb{E} V^\pi(o')$.
# NTPO: $V_N^\pi = \tilde r_\pi + \gamma_a \tilde P_\pi V_N^\pi$ with
# $\tilde r_\pi = \mathbb{E}_\pi[g_a r]$, $\tilde P_\pi = \mathbb{E}_\pi[g_a P]$.
# Subtracting,
#
# $$V^\pi - V_N^\pi = \mathbb{E}_\pi\big[(1 - g_a)\,Q^\pi(o, a)\big] + \gamma_a \tilde P_\pi \,(V^\pi - V_N^\pi),$$
#
# $$\boxed{\;V^\pi - V_N^\pi = (I - \gamma_a \tilde P_\pi)^{-1}\; \mathbb{E}_{a\sim\pi}\Big[\big(1 - \gamma_w^{|a|-1}\big)\, Q^\pi(o, a)\Big]\;}$$
#
# Each action loses the fraction $1 - \gamma_w^{|a|-1}$ of its value; NTPO's
# own discounting propagates the losses. The gap vanishes iff $\gamma_w = 1$
# or every action is one token. For one $n$-token action repeated forever with
# reward $r$: $\text{gap} = \dfrac{r\,(1 - \gamma_w^{n-1})}{(1-\gamma_a)(1 - \gamma_a\gamma_w^{n-1})}$.
#
# Check it against token-level policy evaluation of a random token policy:

# %%
token_policy = tabular.random_token_policy(1, mdp)
action_policy = tabular.action_policy_from_token_policy(token_policy, mdp)
evaluated = tabular.value_iteration(
    lambda v: tabular.ntpo_v_backup(v, mdp, token_policy, gamma_w, GAMMA_A),
    np.zeros((mdp.num_states, mdp.num_nodes)),
)
measured_gap = tabular.action_policy_values(mdp, action_policy, GAMMA_A) - evaluated[:, tabular.ROOT]
closed_form_gap = tabular.ntpo_policy_value_gap(mdp, action_policy, gamma_w, GAMMA_A)
print("gap measured by token backups:", measured_gap)
print("gap from the closed form     :", closed_form_gap)
assert np.allclose(measured_gap, closed_form_gap, atol=1e-8)

# %% [markdown]
# ## 4. BAD removes the gap (Eq. 13-14)
#
# BAD backs up **inside** an action with no reward and **no discount**, and
# applies the environment's reward and $\gamma_a$ only at the action's last token:
#
# $$Q(o, w^{1:j}) = \max_{w^{j+1}} Q(o, w^{1:j+1}) \quad (j<n), \qquad
# Q(o, w^{1:n}) = r(o,a) + \gamma_a\, \mathbb{E}_{o'}\big[\max_{w'^1} Q(o', w'^1)\big].$$
#
# It is the NTPO backup with $\gamma_w = 1$, so $g_a = 1$ for every action and the
# unrolled form above *is* the action-level Bellman equation:
# $Q(o, w^{1:n}) = Q^*(o, a)$, $\max_{w^1} Q(o, w^1) = V^*(o)$, and following the
# best token at each prefix spells an optimal action. The on-policy form
# (Eq. 14), the one POAD's critic learns, evaluates $V^\pi$ of the induced
# action policy $\pi(a\mid o)=\prod_j \pi(w^j \mid o, w^{<j})$.

# %%
q_bad = tabular.value_iteration(
    lambda q: tabular.bad_q_backup(q, mdp, GAMMA_A), np.zeros((mdp.num_states, mdp.num_nodes))
)
print("max |Q_BAD(o, a) - Q*(o, a)| =", np.abs(tabular.action_values(q_bad, mdp) - q_star).max())
print("max |V_BAD(o) - V*(o)|       =", np.abs(q_bad[:, tabular.ROOT] - v_star).max())
greedy = tabular.greedy_token_actions(q_bad, mdp)
print("greedy token policy spells actions", greedy, "with Q* =", q_star[np.arange(mdp.num_states), greedy])
assert np.allclose(tabular.action_values(q_bad, mdp), q_star, atol=1e-8)

v_bad = tabular.value_iteration(
    lambda v: tabular.bad_v_backup(v, mdp, token_policy, GAMMA_A), np.zeros((mdp.num_states, mdp.num_nodes))
)
print("BAD-V root vs action-level V^pi:", v_bad[:, tabular.ROOT], tabular.action_policy_values(mdp, action_policy, GAMMA_A))
assert np.allclose(v_bad[:, tabular.ROOT], tabular.action_policy_values(mdp, action_policy, GAMMA_A), atol=1e-8)

# %% [markdown]
# ## 5. The gap against $\gamma_w$ and against action length
#
# Two measures over several random MDPs whose longer actions earn more reward
# (so that the length penalty matters):
#
# - **value gap** $\frac{1}{|\mathcal S|}\sum_o V^*(o) - V_N^*(o)$: what NTPO's
#   critic fails to see;
# - **regret** $\frac{1}{|\mathcal S|}\sum_o V^*(o) - V^{\pi_N}(o)$: the
#   action-level return lost by acting greedily on NTPO's token values.
#
# Action length is varied by spelling every token $m$ times, so an $n$-token
# action becomes $mn$ tokens long (same rewards and dynamics, so the
# action-level optimum is unchanged, and the trie stays prefix-free).

# %%
SEEDS = range(6)


def length_rewarding_mdp(seed, stretch=1):
    base = tabular.random_language_mdp(
        seed, num_states=4, num_actions=6, vocab_size=4, min_length=1, max_length=4, end_probability=0.1
    )
    actions = [tuple(w for w in tokens for _ in range(stretch)) for tokens in tabular.action_tokens(base)]
    rewards = base.rewards * (0.5 + 0.25 * base.action_lengths)[None]
    return tabular.language_mdp(actions, base.vocab_size, rewards, base.transitions)


def gap_and_regret(mdp, gamma_w, gamma_a=GAMMA_A):
    _, v_star = action_level_optimum(mdp, gamma_a)
    q_ntpo = optimal_q(mdp, gamma_w, gamma_a)
    greedy = tabular.deterministic_policy(tabular.greedy_token_actions(q_ntpo, mdp), mdp.num_actions)
    regret = v_star - tabular.action_policy_values(mdp, greedy, gamma_a)
    return np.mean(v_star - q_ntpo[:, tabular.ROOT]), np.mean(regret)


gamma_ws = np.array([1.0, 0.98, 0.95, 0.9, 0.85, 0.8, 0.7, 0.6])
stretches = [1, 2, 3]
by_gamma_w = {
    k: np.array([[gap_and_regret(length_rewarding_mdp(s, k), g) for s in SEEDS] for g in gamma_ws]).mean(axis=1)
    for k in stretches
}

fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
for k, curve in by_gamma_w.items():
    axes[0].plot(gamma_ws, curve[:, 0], marker="o", label=f"action length x{k}")
    axes[1].plot(gamma_ws, curve[:, 1], marker="o", label=f"action length x{k}")
axes[0].set(xlabel=r"$\gamma_w$", ylabel=r"mean $V^* - V_N^*$", title="NTPO value gap")
axes[1].set(xlabel=r"$\gamma_w$", ylabel=r"mean $V^* - V^{\pi_N}$", title="regret of NTPO's greedy policy")
for ax in axes:
    ax.invert_xaxis()
    ax.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# Both curves start at zero at $\gamma_w = 1$ (BAD) and rise as $\gamma_w$
# falls, and longer actions lift the whole curve. The value gap is monotone
# (for non-negative rewards every $g_a$ only shrinks). The regret moves in
# steps, each time the length penalty $\gamma_w^{|a|-1}$ flips an argmax
# towards a shorter action; stretching the actions multiplies the length
# *differences* between competing actions, so the flips come at larger
# $\gamma_w$. (Prefixing every action with the same extra tokens would
# instead scale all actions alike at the current step: it raises the value
# gap but mostly just makes NTPO more myopic.)

# %%
for k in stretches:
    assert np.allclose(by_gamma_w[k][0], 0.0, atol=1e-8)
    assert np.all(np.diff(by_gamma_w[k][:, 0]) > 0)
for shorter, longer in zip(stretches, stretches[1:]):
    assert np.all(by_gamma_w[longer][1:, 0] > by_gamma_w[shorter][1:, 0])

lengths = np.arange(1, 9)
fig, ax = plt.subplots(figsize=(5.5, 3.5))
for g in (0.99, 0.95, 0.9, 0.8):
    ax.plot(lengths, [tabular.ntpo_chain_gap(1.0, n, g, GAMMA_A) for n in lengths], marker="o", label=rf"$\gamma_w$={g}")
ax.set(xlabel="action length n", ylabel="gap", title=r"closed form, one n-token action repeated ($r=1$)")
ax.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 6. Setting $\gamma_w = \gamma_a < 1$ does not fix it (paper Fig. 5, right)
#
# One might hope the discrepancy disappears if we simply use one discount
# everywhere, $\gamma_w = \gamma_a = \gamma$, and compare against the
# action-level optimum *with the same* $\gamma$. It does not: the token-level
# problem still scales action $a$ by $\gamma^{|a|-1}$, a length penalty the
# action-level problem does not have, for every $\gamma < 1$. Only an
# intra-action discount of exactly one (BAD) matches the action-level
# optimum, whatever $\gamma_a$ is.

# %%
gammas = np.array([0.99, 0.97, 0.95, 0.9, 0.85, 0.8])
same_discount = np.array(
    [[gap_and_regret(length_rewarding_mdp(s), g, gamma_a=g) for s in SEEDS] for g in gammas]
).mean(axis=1)
bad = np.array([[gap_and_regret(length_rewarding_mdp(s), 1.0, gamma_a=g) for s in SEEDS] for g in gammas]).mean(axis=1)

fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
axes[0].plot(gammas, same_discount[:, 0], marker="o", label=r"token-level, $\gamma_w=\gamma_a=\gamma$")
axes[0].plot(gammas, bad[:, 0], marker="s", label=r"BAD, $\gamma_w=1$, $\gamma_a=\gamma$")
axes[1].plot(gammas, same_discount[:, 1], marker="o", label=r"token-level, $\gamma_w=\gamma_a=\gamma$")
axes[1].plot(gammas, bad[:, 1], marker="s", label=r"BAD, $\gamma_w=1$, $\gamma_a=\gamma$")
axes[0].set(xlabel=r"$\gamma$", ylabel=r"mean $V^* - V^*_{token}$", title="value gap")
axes[1].set(xlabel=r"$\gamma$", ylabel="mean regret", title="regret of the greedy token policy")
for ax in axes:
    ax.invert_xaxis()
    ax.legend()
fig.tight_layout()
plt.show()
assert np.all(same_discount[:, 0] > 0) and np.allclose(bad, 0.0, atol=1e-8)
print("value gap with gamma_w = gamma_a:", same_discount[:, 0])
print("regret with gamma_w = gamma_a   :", same_discount[:, 1])

# %% [markdown]
# ## Summary
#
# | backup | intra-action discount | fixed point |
# |---|---|---|
# | action level (Eq. 4-5) | (one step per action) | $Q^*, V^*$ |
# | NTPO (Eq. 9-10) | $\gamma_w < 1$ | optimum of the MDP with reward and discount scaled by $\gamma_w^{\lvert a\rvert-1}$ |
# | BAD (Eq. 13-14) | $1$ | $Q^*, V^*$ exactly |
#
# In the streaming form used for training (`poad_jax.core.gae.action_discounts` +
# `token_gae`), BAD is the per-token discount $d = 1$ inside an action
# and $d = \gamma(1 - \text{done})$ at its last token; NTPO puts $\gamma_w$
# inside too.
