# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %%
# Colab: fetch the repository (this notebook needs its configs/ folder) and
# install the package from it (edit REPOSITORY to point at your copy).
# Locally, where the repository is checked out, this cell does nothing.
import os
import subprocess
import sys

REPOSITORY = "https://github.com/poad-jax/poad_jax"
if "google.colab" in sys.modules:
    if not os.path.isdir("/content/poad_jax"):
        subprocess.run(["git", "clone", "-q", REPOSITORY, "/content/poad_jax"], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", "/content/poad_jax"], check=True)
    os.chdir("/content/poad_jax")

# %% [markdown]
# # Which token earned the reward? Credit assignment inside an action
#
# A language agent answers an observation $o_t$ with an action
# $a_t = (w_t^1, \dots, w_t^n)$ made of $n$ tokens. Often one token decides
# everything: *"walk to the **blue** door"* and *"walk to the **red** door"*
# share every word but the colour. This notebook reproduces, on a toy task,
# the picture of the POAD paper's Figure 1 (and Figures 8-12): how three ways
# of backing up value spread the credit for the reward over an action's
# tokens.
#
# | method | critic learns | credit unit |
# |---|---|---|
# | **POAD** (BAD backup) | $V(o_t, w_t^{<j})$ for every token prefix | one token, no discount inside the action |
# | **NTPO** (naive token level) | $V(o_t, w_t^{<j})$ for every token prefix | one token, discount $\gamma_w = \gamma$ between tokens |
# | **TWOSOME** (action level) | $V(o_t)$ | the whole action |
#
# Plan:
# 1. the toy task and its tokens;
# 2. the three backups written as one token-level GAE scan with different
#    per-token discounts (`poad_jax.core.gae`);
# 3. the **exact** critic of each backup (a converged critic), and the
#    per-token advantages it produces: heatmaps;
# 4. **training** the three methods with `poad_jax.run.train.run` (tiny random
#    model) and their learning curves;
# 5. critics **learned** with each backup on the model's features, and the
#    same heatmaps.
#
# Everything runs on CPU in about a minute.

# %%
import importlib.util
import pathlib
import shutil
import tempfile
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax
from flax import nnx


def find_repository_root() -> pathlib.Path:
    """The checkout that holds configs/toy.py: the working directory or one of its parents."""
    for folder in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]:
        if (folder / "configs" / "toy.py").is_file():
            return folder
    raise FileNotFoundError("run this notebook from inside the poad_jax repository (configs/toy.py not found)")


REPO = find_repository_root()
if importlib.util.find_spec("poad_jax") is None:  # a checkout that is not pip-installed
    sys.path.insert(0, str(REPO))

import envs_py
from poad_jax.core import gae as gae_lib
from poad_jax.run import train
from poad_jax.run import build
from poad_jax.run import config as config_lib
from poad_jax.run import cli
from poad_jax.agent.methods import make_method
from poad_jax.core.critic_config import CriticConfig
from poad_jax.core.policy import PackedRows, ValueHead, action_logprobs, base_features, head_values, split_policy
from poad_jax.core.token_batch import pack_rows

np.set_printoptions(precision=3, suppress=True)


def toy_config():
    """configs/toy.py, loaded by path (a fresh ConfigDict each call)."""
    spec = importlib.util.spec_from_file_location("toy_config", REPO / "configs" / "toy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


CONFIG = toy_config()
RUN = config_lib.typed(CONFIG)  # the config typed once, as each command types its own
GAMMA = CONFIG.ppo.gamma  # discount between actions
LAM = CONFIG.ppo.lam  # GAE lambda
METHODS = ("poad", "ntpo", "twosome")
LABELS = {"poad": "POAD (BAD)", "ntpo": "NTPO ($\\gamma_w=\\gamma$)", "twosome": "TWOSOME (action level)"}
print(f"gamma = {GAMMA}, lambda = {LAM}, NTPO gamma_w = {make_method('ntpo', GAMMA).gamma_w}")

# %% [markdown]
# ## 1. The task: one token decides
#
# `toy/decisive_token` (`envs_py/toy.py`): every episode has two steps; at each
# step the agent picks one of three doors. Only the **blue** door pays
# $r = 1$, so the best return is 2. The three valid actions differ in one
# word, and the tiny model's word tokenizer gives one token per word: the
# 4th token (the colour) is the only one that matters.

# %%
env = envs_py.make("toy/decisive_token", **dict(CONFIG.env.kwargs))
observation = env.reset(seed=0)
ACTIONS = observation.actions
_, TOKENIZER = build.load_model(RUN)
ACTION_TOKENS = [TOKENIZER.encode(" " + action) for action in ACTIONS]  # raw prompts: a space before the action
WORDS = [TOKENIZER.decode([t]).strip() for t in ACTION_TOKENS[0]]
N_TOKENS = len(WORDS)
DECISIVE = next(j for j in range(N_TOKENS) if len({tokens[j] for tokens in ACTION_TOKENS}) > 1)
COLOURS = [TOKENIZER.decode([tokens[DECISIVE]]).strip() for tokens in ACTION_TOKENS]
TOKEN_LABELS = [word if j != DECISIVE else "(colour)" for j, word in enumerate(WORDS)]
REWARDS = []
for action in ACTIONS:  # the reward of each door at the first step
    env.reset(seed=0)
    REWARDS.append(env.step(action).reward)
REWARDS = np.array(REWARDS)
STEPS = env.horizon

print("observation:", observation.text)
for action, tokens in zip(ACTIONS, ACTION_TOKENS):
    print(f"  {action!r:28} -> tokens {tokens}")
print(f"decisive token: position {DECISIVE + 1} of {N_TOKENS}; rewards {dict(zip(COLOURS, REWARDS.tolist()))}")
assert all(len(tokens) == N_TOKENS for tokens in ACTION_TOKENS)
assert REWARDS.tolist() == [float(c == "blue") for c in COLOURS]

# %% [markdown]
# ## 2. Three backups, one scan
#
# Lay out the tokens of a rollout as one **stream**; element $j$ carries the
# critic's value of the prefix before it, $V_j = V(o_t, w_t^{<j})$ (so
# $V_t^1 = V(o_t)$), a reward $r_j$ (the environment reward on an action's
# last token, 0 elsewhere) and a discount $d_j$. The TD error and GAE are
#
# $$\delta_j = r_j + d_j\, V_{j+1} - V_j, \qquad A_j = \delta_j + d_j\,\lambda\, A_{j+1}, \qquad R_j = A_j + V_j,$$
#
# a single reverse scan (`gae_lib.token_gae`). The methods differ only in
# $d_j$ and in what one stream element is:
#
# * **BAD** (POAD): inside an action, no reward and no discount; at its end,
#   the environment's step:
#   $$V_t^j \leftarrow V_t^{j+1} \quad (j < n), \qquad V_t^n \leftarrow r_t + \gamma\,(1 - \text{done}_t)\, V_{t+1}^1 .$$
#   So $d_j = 1$ inside, $d_j = \gamma(1-\text{done})$ at the last token.
# * **NTPO**: the same stream, but every token is treated as an MDP step,
#   $V_t^j \leftarrow \gamma_w V_t^{j+1}$ inside the action, with
#   $\gamma_w = \gamma < 1$: $d_j = \gamma_w$ inside.
# * **Action level** (TWOSOME): one element per action, carrying $V(o_t)$;
#   every $d = \gamma(1 - \text{done})$. One advantage
#   $A_t = r_t + \gamma V(o_{t+1}) - V(o_t) + \dots$ for the whole action.
#
# An episode of this task is 2 actions = 10 tokens. Below: the streams of
# all $3 \times 3$ episodes (one row each) and each method's discounts.

# %%
EPISODES = [(a1, a2) for a1 in range(len(ACTIONS)) for a2 in range(len(ACTIONS))]


def episode_streams(method_name: str) -> dict[str, np.ndarray]:
    """Streams [9, T] of the 9 possible episodes: T = 2 x 5 tokens, or 2 actions (action level)."""
    method = make_method(method_name, GAMMA)
    width = N_TOKENS if method.token_level else 1  # stream elements per action
    shape = (len(EPISODES), STEPS * width)
    rewards, action_end, done = np.zeros(shape, np.float32), np.zeros(shape, bool), np.zeros(shape, bool)
    for row, episode in enumerate(EPISODES):
        for step, action in enumerate(episode):
            last = (step + 1) * width - 1
            rewards[row, last] = REWARDS[action]
            action_end[row, last] = True
        done[row, -1] = True
    discounts = gae_lib.action_discounts(action_end, done, GAMMA, method.gamma_w if method.token_level else 1.0)
    return dict(rewards=rewards, action_end=action_end, done=done, discounts=np.asarray(discounts), width=width)


for name in METHODS:
    print(f"{name:8} discounts of one episode: {episode_streams(name)['discounts'][0]}")

# %% [markdown]
# ## 3. The exact critic of each backup
#
# A converged critic is the fixed point of its backup under the current
# policy $\pi$: $V_j = \mathbb{E}_\pi[G_j \mid o_t, w_t^{<j}]$, where
# $G_j = \sum_{k \ge j} \big(\prod_{i=j}^{k-1} d_i\big)\, r_k$ is the return
# discounted by the method's own $d$. On this task we can enumerate all
# episodes, so the exact critic is a weighted average: `token_gae` with
# $V \equiv 0$ and $\lambda = 1$ returns $G_j$ (the advantage is then the
# return), and averaging over the actions not yet chosen at $j$ gives $V_j$.
#
# The information at element $j$: before the first colour token nothing is
# chosen; from the door token of step 1 on, $a_1$ is known; at the door token
# of step 2, $a_2$ too.
#
# We use a policy that is still undecided, $\pi = (0.2, 0.3, 0.5)$ over
# (red, blue, green) at both steps, so that every action has a non-zero
# advantage.


# %%
def discounted_returns(streams) -> np.ndarray:
    zeros = np.zeros_like(streams["rewards"])
    returns, _ = gae_lib.token_gae(
        streams["rewards"], zeros, streams["discounts"], np.ones_like(zeros, bool), zeros[:, 0], 1.0
    )
    return np.asarray(returns)


def information(width: int) -> np.ndarray:
    """How many actions of the episode are known at each stream element (0, 1 or 2)."""
    known = np.zeros(STEPS * width, int)
    for step in range(STEPS):
        last = (step + 1) * width - 1
        known[last:] += 1  # an action's last element reads V(o, w^{<n}): the colour is known
    if width == 1:
        known = np.arange(STEPS)  # V(o_t): the actions before step t are known
    return known


def exact_values(method_name: str, policy_1: np.ndarray, policy_2: np.ndarray) -> np.ndarray:
    """[9, T] exact critic values V_j = E[G_j | what is known at j] for each episode's stream.

    `policy_1`, `policy_2`: pi(a | o) at the first and second step.
    """
    streams = episode_streams(method_name)
    returns = discounted_returns(streams).reshape(len(ACTIONS), len(ACTIONS), -1)  # [a1, a2, T]
    known = information(streams["width"])
    values = np.empty_like(returns)
    for j, k in enumerate(known):
        g = returns[..., j]
        if k == 0:  # nothing chosen yet: average over both actions
            values[..., j] = np.einsum("a,b,ab->", policy_1, policy_2, g)
        elif k == 1:  # a1 known: average over a2
            values[..., j] = (g @ policy_2)[:, None]
        else:  # both known
            values[..., j] = g
    return values.reshape(len(EPISODES), -1)


def step_one_advantages(method_name: str, values: np.ndarray, policy: np.ndarray, lam: float) -> np.ndarray:
    """[3, 5]: advantage of each token of each first action, in expectation over the second action.

    Action level: the action's single advantage repeated over its tokens.
    """
    streams = episode_streams(method_name)
    valid = np.ones_like(streams["rewards"], bool)
    advantages, _ = gae_lib.token_gae(
        streams["rewards"], values, streams["discounts"], valid, np.zeros(len(EPISODES), np.float32), lam
    )
    advantages = np.asarray(advantages).reshape(len(ACTIONS), len(ACTIONS), -1)
    first = np.einsum("b,abt->at", policy, advantages)[:, : streams["width"]]
    return np.repeat(first, N_TOKENS // streams["width"], axis=1)


POLICY = np.array([0.2, 0.3, 0.5])
exact = {name: exact_values(name, POLICY, POLICY) for name in METHODS}
credit = {name: step_one_advantages(name, exact[name], POLICY, lam=0.0) for name in METHODS}
gae = {name: step_one_advantages(name, exact[name], POLICY, lam=LAM) for name in METHODS}

# Action-level quantities under the same policy, for reference.
v2 = POLICY @ REWARDS
q1 = REWARDS + GAMMA * v2
v1 = POLICY @ q1
print("action-level advantage at step 1, Q(o1, a) - V(o1):", dict(zip(COLOURS, np.round(q1 - v1, 3).tolist())))
for name in METHODS:
    first_step = exact[name].reshape(len(ACTIONS), len(ACTIONS), -1)[:, 0, : episode_streams(name)["width"]]
    print(f"\n{name}: exact values V(o1, w^<j) (rows = first action)\n{first_step}")
    print(f"{name}: one-step token credit (lambda = 0)\n{np.round(credit[name], 3) + 0.0}")

# %% [markdown]
# The claims, checked:
#
# * **BAD** puts all the credit on the colour token, and that credit *is* the
#   action-level advantage $Q(o_1, a) - V(o_1)$: the critic's value does not
#   move while the forced words "walk to the" are written, jumps when the
#   colour is written, and does not move on "door".
# * **NTPO** also moves only at the colour token, but every value is
#   discounted by $\gamma_w$ per remaining token of the action, so its
#   critic has to learn an artificial geometric ramp over tokens that change
#   nothing, and the credit is shrunk (here by $\gamma_w$; the next step's
#   reward, seen from step 1, by $\gamma_w^{n-1}\gamma$ instead of $\gamma$).
# * **Action level** gives one number, the same $Q - V$, to all five tokens.

# %%
action_advantage = q1 - v1
others = [j for j in range(N_TOKENS) if j != DECISIVE]
np.testing.assert_allclose(credit["poad"][:, DECISIVE], action_advantage, atol=1e-5)
np.testing.assert_allclose(credit["poad"][:, others], 0.0, atol=1e-5)
np.testing.assert_allclose(credit["ntpo"][:, others], 0.0, atol=1e-5)
gamma_w = make_method("ntpo", GAMMA).gamma_w
np.testing.assert_allclose(credit["ntpo"][:, DECISIVE], gamma_w * action_advantage, atol=1e-5)
# BAD's token TD errors of an action add up to the action-level TD error.
np.testing.assert_allclose(credit["poad"].sum(axis=1), credit["twosome"][:, 0], atol=1e-5)
np.testing.assert_allclose(credit["twosome"], np.repeat(action_advantage[:, None], N_TOKENS, axis=1), atol=1e-5)
print("checked")

# %% [markdown]
# The exact values along one episode (blue, then blue): BAD's critic is
# flat over "walk to the" and moves only when a colour or a reward arrives;
# NTPO's climbs by $1/\gamma_w$ at every token; the action-level critic has
# one value per observation.

# %%
BLUE = COLOURS.index("blue")
episode = EPISODES.index((BLUE, BLUE))
fig, ax = plt.subplots(figsize=(8, 3.2), constrained_layout=True)
positions = np.arange(STEPS * N_TOKENS)
STYLES = {
    "poad": dict(lw=3, marker="o"), "ntpo": dict(lw=1.5, marker="s"), "twosome": dict(lw=1.5, ls="--", marker="^")
}
for name in METHODS:
    values = exact[name][episode]
    if values.size < positions.size:  # one value per action
        values = np.repeat(values, N_TOKENS)
    ax.plot(positions, values, drawstyle="steps-mid", label=LABELS[name], **STYLES[name])
blue_words = [TOKENIZER.decode([token]).strip() for token in ACTION_TOKENS[BLUE]]
ax.set_xticks(positions, [f"{w}\n(t={t + 1})" if j == 0 else w for t in range(STEPS) for j, w in enumerate(blue_words)])
ax.set_ylabel("$V(o_t, w_t^{<j})$")
ax.set_title("Exact critic values before each token, episode (blue, blue)")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# The heatmaps: rows are the three possible first actions, columns their
# tokens. Left: the one-step token credit $\delta_j$ ($\lambda = 0$). Right:
# the GAE advantage the learner actually uses ($\lambda = 0.95$), averaged
# over the second action.


# %%
def heatmap_grid(tables: dict[str, dict[str, np.ndarray]], title: str):
    """One heatmap per (method row, table column); rows of a heatmap = actions, columns = tokens."""
    columns = list(tables)
    scale = max(np.max(np.abs(t[name])) for t in tables.values() for name in METHODS)
    size = (4.6 * len(columns), 1.5 * len(METHODS) + 0.8)
    fig, axes = plt.subplots(len(METHODS), len(columns), figsize=size, squeeze=False, constrained_layout=True)
    for i, name in enumerate(METHODS):
        for k, column in enumerate(columns):
            ax = axes[i, k]
            table = tables[column][name]
            image = ax.imshow(table, cmap="RdBu", vmin=-scale, vmax=scale, aspect="auto")
            for (r, c), value in np.ndenumerate(table):
                text = f"{round(float(value), 2) + 0.0:+.2f}"  # + 0.0: no "-0.00"
                colour = "white" if abs(value) > 0.6 * scale else "black"
                ax.text(c, r, text, ha="center", va="center", fontsize=8, color=colour)
            ax.set_xticks(range(N_TOKENS), TOKEN_LABELS if i == len(METHODS) - 1 else [""] * N_TOKENS)
            ax.set_yticks(range(len(COLOURS)), COLOURS if k == 0 else [""] * len(COLOURS))
            if i == 0:
                ax.set_title(column)
            if k == 0:
                ax.set_ylabel(LABELS[name], fontsize=9)
    fig.colorbar(image, ax=axes, shrink=0.6, label="advantage")
    fig.suptitle(title)
    plt.show()


heatmap_grid(
    {"token credit $\\delta_j$ ($\\lambda=0$)": credit, f"GAE advantage ($\\lambda={LAM}$)": gae},
    f"Exact critics, policy $\\pi$ = {dict(zip(COLOURS, POLICY.tolist()))}, first step",
)

# %% [markdown]
# With $\lambda > 0$, GAE hands every token a share of the TD errors that
# follow it, $A_j = \sum_k (\prod d\,\lambda)\,\delta_{j+k}$: under BAD the
# forced words before the colour inherit $\lambda^k$ of its credit (under
# NTPO $(\gamma_w\lambda)^k$ of a smaller one). That is harmless: those words
# are forced by the set of valid actions (trie decoding), their log-probability
# is 0 whatever the parameters, so they carry no policy gradient. The token
# whose probability the update can change, the colour, gets the full
# action-level advantage under BAD.

# %% [markdown]
# ## 4. Training the three methods
#
# Now learn everything: `poad_jax.run.train.run` with `configs/toy.py` (a random
# 2-layer LLaMA with a word tokenizer, a LoRA actor, an MLP critic head over
# the frozen base's hidden states), 4 threads x 4 steps = 16 env steps per
# update. POAD and NTPO decode token by token, constrained by the trie of
# valid actions; TWOSOME scores the three actions and samples from their
# normalised softmax. A run spends nearly all of its time (15-30 s on a
# 2-core CPU) compiling the sampler and the update; an update then takes a
# fraction of a second. The compilations are cached on disk
# (`~/.cache/poad_jax/jax`, or `$JAX_COMPILATION_CACHE_DIR`), so a second
# execution of the notebook is several times faster.

# %%
UPDATES = 40
RUN_DIR = pathlib.Path(tempfile.mkdtemp(prefix="credit_assignment_"))
cli.enable_compilation_cache()  # as the training CLI does: running the notebook again skips most compiling


def train_method(name: str):
    config = toy_config()
    config.method = name
    config.total_env_steps = UPDATES * config.num_threads * config.rollout_length
    config.tensorboard = False
    config.plot = False
    config.checkpoint_every = 10**9  # only the final checkpoint
    start = time.perf_counter()
    result = train.run(config, RUN_DIR / name, show_progress=False)
    returns = [r["episode_return"] for r in result.records]
    print(f"{name}: {len(result.records)} updates in {time.perf_counter() - start:.1f} s; "
          f"mean return over the last 5 updates {np.mean(returns[-5:]):.2f} (max {STEPS})")
    return result


runs = {"poad": train_method("poad")}

# %%
runs["ntpo"] = train_method("ntpo")

# %%
runs["twosome"] = train_method("twosome")

# %%
fig, ax = plt.subplots(figsize=(6.5, 3.5))
for name in METHODS:
    records = runs[name].records
    ax.plot([r["env_steps"] for r in records], [r["episode_return"] for r in records], marker=".", label=LABELS[name])
ax.axhline(STEPS, color="grey", lw=0.8, ls="--")
ax.set_xlabel("env steps")
ax.set_ylabel("mean episode return\n(episodes ended in the update)")
ax.set_title("toy/decisive_token, tiny random model")
ax.legend(loc="lower right")
plt.show()
for name in METHODS:
    assert np.mean([r["episode_return"] for r in runs[name].records[-5:]]) > 1.0, name  # all three learn
shutil.rmtree(RUN_DIR, ignore_errors=True)  # checkpoints and metrics.jsonl; the records stay in `runs`

# %% [markdown]
# All three find the blue door. The random initial policy disfavours blue,
# so POAD and NTPO first have to stumble on it; TWOSOME, which samples from a
# softmax over whole-action scores, starts closer to uniform. On this task
# the three methods share their optimum: every action has the same 5 tokens,
# so NTPO's per-token discount scales every action's value by the same
# $\gamma_w^{n-1}$ (the first notebook, `gamma_w_derivation.ipynb`, shows
# where that stops being harmless: actions of different lengths). What
# differs is *where* the credit lands, which the learning curves do not show.
#
# What did the runs learn? Their policies at the first step, read with the
# learner's own forward pass (`policy.action_logprobs`): for POAD / NTPO the
# trie-restricted softmax at the colour token, for TWOSOME the softmax over
# the actions' token-normalised log-probabilities.


# %%
def prompt_tokens(step: int) -> list[int]:
    """The raw prompt of the observation at `step` (0-based), as the rollout renders it."""
    observation = env.reset(seed=0)
    for _ in range(step):
        observation = env.step(ACTIONS[0]).observation
    return TOKENIZER.encode(observation.text)


MODEL, _ = build.load_model(RUN)  # same seed, same frozen base as the runs
GRAPH, FROZEN, PARAMS = split_policy(
    MODEL, ValueHead(MODEL.config.hidden_size, CriticConfig(hidden_sizes=CONFIG.critic.hidden_sizes),
                     rngs=nnx.Rngs(CONFIG.seed + 1))
)
PROMPTS = [prompt_tokens(step) for step in range(STEPS)]
PROMPT_LEN = max(len(p) for p in PROMPTS)
ROWS = {  # one row per (step, action): prompt + action tokens
    key: jnp.asarray(value)
    for key, value in pack_rows(
        [p for p in PROMPTS for _ in ACTIONS], ACTION_TOKENS * STEPS, PROMPT_LEN, N_TOKENS, TOKENIZER.pad_token_id
    ).items()
}
PACKED = PackedRows(ROWS["tokens"], ROWS["positions"], ROWS["key_mask"], PROMPT_LEN)


def trained_policy(name: str) -> np.ndarray:
    """[STEPS, 3]: pi(a | o_t) of a trained run."""
    logprobs, _ = action_logprobs(GRAPH, FROZEN, runs[name].state.params["actor"], PACKED, CONFIG.sampling.temperature or 1.0)
    logprobs = np.asarray(logprobs).reshape(STEPS, len(ACTIONS), N_TOKENS)
    if make_method(name, GAMMA).token_level:
        scores = logprobs[..., DECISIVE]  # the other tokens are forced by the trie
    else:
        scores = logprobs.sum(-1) / N_TOKENS  # TWOSOME's token-normalised score
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return weights / weights.sum(-1, keepdims=True)


for name in METHODS:
    print(f"{name:8} pi(. | o_1) = {dict(zip(COLOURS, np.round(trained_policy(name)[0].astype(float), 3).tolist()))}")

# %% [markdown]
# ## 5. Learned critics: the same picture
#
# A snapshot of a run's critic mostly shows how far it lags behind a policy
# that has just changed. To see what each backup makes a critic *converge*
# to, hold the policy fixed at the undecided $\pi$ of section 3 and train a
# fresh critic head with each method's backup, the way the learner trains
# its critic:
#
# * inputs: the frozen base's final hidden state at the position that
#   predicts token $j$ (`policy.base_features`), the same features the
#   learner's critic reads; TWOSOME's critic reads only the position before
#   the action, $V(o_t)$;
# * targets: the GAE returns $R_j = A_j + V_j$ of `token_gae` with the
#   method's discounts, recomputed from the current critic at every step
#   (semi-gradient TD($\lambda$));
# * loss: $\tfrac12 (V_j - R_j)^2$, in expectation over the 9 episodes
#   (weights $\pi(a_1)\pi(a_2)$), Adam, 400 steps.

# %%
FEATURES = base_features(  # [STEPS, 3, 5, H]; adapters off, so the actor's LoRA state is unused
    GRAPH, FROZEN, PARAMS["actor"], PACKED
).reshape(STEPS, len(ACTIONS), N_TOKENS, -1)


def stream_values(name: str, values: jax.Array) -> jax.Array:
    """[9, T]: critic values [STEPS, 3, 5] laid out as the streams of the 9 episodes."""
    width = N_TOKENS if make_method(name, GAMMA).token_level else 1  # action level: V(o_t) only
    first = jnp.asarray([a1 for a1, _ in EPISODES])
    second = jnp.asarray([a2 for _, a2 in EPISODES])
    return jnp.concatenate([values[0, first, :width], values[1, second, :width]], axis=1)


def fit_critic(name: str, policy: np.ndarray, steps: int = 400, learning_rate: float = 3e-3) -> np.ndarray:
    """Trains a fresh value head with the method's backup under a fixed policy; returns its [9, T] values."""
    streams = episode_streams(name)
    weights = jnp.asarray(np.outer(policy, policy).reshape(-1, 1))  # P(a1, a2)
    valid = jnp.ones(streams["rewards"].shape, bool)
    episode_over = jnp.zeros(len(EPISODES))  # every stream ends with done: nothing to bootstrap
    head = ValueHead(MODEL.config.hidden_size, CriticConfig(hidden_sizes=CONFIG.critic.hidden_sizes),
                     rngs=nnx.Rngs(CONFIG.seed + 1))
    head_graph, head_state = nnx.split(head)
    optimizer = optax.adam(learning_rate)

    def loss_fn(state):
        values = stream_values(name, nnx.merge(head_graph, state)(FEATURES))
        _, returns = gae_lib.token_gae(
            streams["rewards"], jax.lax.stop_gradient(values), streams["discounts"], valid, episode_over, LAM
        )
        return 0.5 * jnp.sum(weights * (values - returns) ** 2) / values.shape[1]

    @jax.jit
    def train_step(state, opt_state):
        grads = jax.grad(loss_fn)(state)
        updates, opt_state = optimizer.update(grads, opt_state, state)
        return optax.apply_updates(state, updates), opt_state

    opt_state = optimizer.init(head_state)
    for _ in range(steps):
        head_state, opt_state = train_step(head_state, opt_state)
    return np.asarray(stream_values(name, nnx.merge(head_graph, head_state)(FEATURES)))


start = time.perf_counter()
learned = {name: fit_critic(name, POLICY) for name in METHODS}
print(f"trained three critics in {time.perf_counter() - start:.1f} s")
learned_credit = {name: step_one_advantages(name, learned[name], POLICY, 0.0) for name in METHODS}
learned_gae = {name: step_one_advantages(name, learned[name], POLICY, LAM) for name in METHODS}
for name in METHODS:
    print(f"{name:8} max |V_learned - V_exact| = {np.max(np.abs(learned[name] - exact[name])):.3f}")

heatmap_grid(
    {"token credit $\\delta_j$ ($\\lambda=0$)": learned_credit, f"GAE advantage ($\\lambda={LAM}$)": learned_gae},
    "Learned critics (fixed policy $\\pi$), first step",
)

# %% [markdown]
# Reading the learned heatmaps:
#
# * **POAD**: the forced words "walk to the" get ~0, the colour gets the
#   action-level advantage (-0.3 / +0.7 / -0.3, as with the exact critic).
#   The colour's credit is a difference of two values *within one
#   observation*, $V(o_1, \text{walk to the } c) - V(o_1, \text{walk to the})$,
#   which the critic learns easily.
# * The **door** token picks up one number, the same for all three actions:
#   it is the only place where the learned critic compares two observations,
#   $\delta = r + \gamma V(o_2) - V(o_1, w^{<5})$, and the random frozen base
#   barely tells "Step 1" from "Step 2" (their features differ by ~0.3%, see
#   below), so $V(o_2)$ is learned too close to $V(o_1)$. A critic error that
#   is the same for every action does not change which action is better, and
#   the door is forced anyway (no policy gradient).
# * **NTPO**: the same, plus small non-zero credit on the forced words: its
#   critic has to learn the geometric ramp $\gamma_w^{k}$ over tokens that
#   change nothing, and what it cannot fit leaks into their advantages.
# * **Action level**: one number per action, and that number rests entirely
#   on the cross-observation comparison $r + \gamma V(o_2) - V(o_1)$, so the
#   aliasing of $o_1$ and $o_2$ shifts all of it (here to about $-0.03$ /
#   $+0.97$ instead of $-0.3$ / $+0.7$).

# %%
features = np.asarray(FEATURES)
relative = np.linalg.norm(features[0, :, 0] - features[1, :, 0], axis=-1) / np.linalg.norm(features[0, :, 0], axis=-1)
print(f"relative feature distance between o_1 and o_2: {relative.max():.4f}")

poad = learned_credit["poad"]
np.testing.assert_allclose(poad[:, DECISIVE], action_advantage, atol=0.05)  # the colour gets Q - V
np.testing.assert_allclose(poad[:, others[:-1]], 0.0, atol=0.03)  # "walk to the": nothing
assert np.ptp(poad[:, -1]) < 0.03  # "door": one action-independent number
assert np.max(np.abs(learned_credit["ntpo"][:, others[:-1]])) > np.max(np.abs(poad[:, others[:-1]]))
print("checked")

# %% [markdown]
# ## 6. Summary
#
# | | where the credit for the decisive word goes | value the critic must learn over the forced words |
# |---|---|---|
# | **POAD (BAD)** | the decisive token, exactly $Q(o,a) - V(o)$ | flat: $V(o)$, unchanged until the colour |
# | **NTPO** | the decisive token, shrunk by $\gamma_w^{n-j}$ | a ramp $\gamma_w^{k} \cdot (\dots)$ |
# | **TWOSOME** | all tokens alike (one number per action) | none (one value per observation) |
#
# BAD gives each token the part of the action-level advantage that it
# caused: with no reward and no discount inside an action, the token TD
# errors of an action telescope to
# $\sum_j \delta_t^j = r_t + \gamma V(o_{t+1}) - V(o_t)$, the action-level TD
# error, and a token that changes nothing has $\delta = 0$.
