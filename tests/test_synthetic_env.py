"""The synthetic save-or-take task and the closed form the studies draw beside it.

- Actions have exactly `action_length` tokens under the tiny model's
  tokenizer, differ in one word only, at the chosen position.
- Rewards arrive only at an action's end: takes at once, saves all at the
  episode's last action.
- `optimal_return(g)` equals a brute-force search over every deterministic
  policy of the discounted problem (a plain-Python reference).
- `per_action_discount` follows the methods' backups: the discount that
  `gae.action_discounts` applies across one action's tokens.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import envs_py
from envs_py.synthetic import optimal_return
from poad_jax.core import gae
from poad_jax.tools import theory
from poad_jax.models.tiny import WordTokenizer


@pytest.mark.parametrize("position", ["first", "middle", "last"])
@pytest.mark.parametrize("length", [1, 2, 5, 16])
def test_actions_have_n_tokens_and_differ_in_one_word(length, position):
    env = envs_py.make("synthetic/save_or_take", action_length=length, deciding_position=position)
    tokenizer = WordTokenizer()
    observation = env.reset(seed=0)
    encoded = [tokenizer.encode(" " + action) for action in observation.actions]
    assert all(len(ids) == length for ids in encoded)
    assert tokenizer.unk_token_id not in sum(encoded, []) + tokenizer.encode(observation.text)
    differing = [i for i in range(length) if len({ids[i] for ids in encoded}) > 1]
    want = {"first": 0, "middle": (length - 1) // 2, "last": length - 1}[position]
    assert differing == [want]


def test_rewards_arrive_at_action_ends_take_now_save_at_the_end():
    env = envs_py.make("synthetic/save_or_take", action_length=3, horizon=4, take_reward=0.5, save_reward=1.0)
    take, save, decoy = env.reset(seed=0).actions
    rewards = [env.step(a).reward for a in (save, take, decoy)]
    last = env.step(save)
    assert rewards == [0.0, 0.5, 0.0]
    assert last.done and last.reward == 2.0 and last.info["success"] is False
    env.reset()
    results = [env.step(save) for _ in range(4)]
    assert [r.reward for r in results] == [0.0, 0.0, 0.0, 4.0] and results[-1].info["success"] is True


def test_slip_replaces_the_written_action_at_its_rate():
    env = envs_py.make("synthetic/save_or_take", horizon=1, slip=0.5, num_decoys=0)
    chosen = []
    for episode in range(400):
        observation = env.reset(seed=episode)
        chosen.append(env.step(observation.actions[1]).info["chose"])  # always write "save"
    # Half the steps slip to a uniform choice of {take, save}: save 75 %.
    assert 0.68 < np.mean([c == "blue" for c in chosen]) < 0.82


@pytest.mark.parametrize("kwargs", [dict(action_length=0), dict(horizon=10), dict(deciding_position="end"),
                                    dict(take_reward=1.0, save_reward=1.0), dict(slip=1.5)])
def test_bad_parameters_are_refused(kwargs):
    with pytest.raises(ValueError):
        envs_py.make("synthetic/save_or_take", **kwargs)


def brute_force_optimum(g: float, horizon: int, take: float, save: float) -> float:
    """Undiscounted return of the best open-loop plan under per-action discount g (ties: more saves)."""
    best = None
    for plan in itertools.product((0, 1), repeat=horizon):  # 1 = save
        discounted = sum(take * g**t for t, s in enumerate(plan) if not s)
        discounted += sum(plan) * save * g ** (horizon - 1)
        key = (round(discounted, 12), sum(plan))
        if best is None or key > best[0]:
            best = (key, sum(save if s else take for s in plan))
    return best[1]


@pytest.mark.parametrize("g", [1.0, 0.95, 0.9, 0.8, 0.6, 0.4, 0.1])
@pytest.mark.parametrize("horizon", [1, 3, 4, 6])
def test_closed_form_optimum_equals_brute_force(g, horizon):
    assert optimal_return(g, horizon, 0.5, 1.0) == brute_force_optimum(g, horizon, 0.5, 1.0)


@pytest.mark.parametrize("method, gamma_w", [("poad", None), ("ntpo", None), ("ntpo", 0.8), ("twosome", None),
                                             ("twosome", 0.9)])
def test_per_action_discount_is_what_the_backup_applies_across_an_action(method, gamma_w):
    gamma, length = 0.95, 6
    g = theory.per_action_discount(method, gamma, gamma_w, length)
    if method == "twosome":
        want = gamma * (1.0 if gamma_w is None else gamma_w) ** (length - 1)
    else:
        action_end = np.zeros((1, length), bool)
        action_end[0, -1] = True
        from poad_jax.agent.methods import make_method

        d = np.asarray(gae.action_discounts(action_end, np.zeros((1, length), bool), gamma,
                                                make_method(method, gamma, gamma_w).gamma_w))
        want = float(np.prod(d))
    assert g == pytest.approx(want, rel=1e-6)
