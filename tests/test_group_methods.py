"""GRPO and GiGPO as methods: group rollouts, critic-free updates, their batch and their errors.

- Group rollouts: the threads of a group start every episode from one reset seed; a
  thread whose episode ended takes no more env steps (its rows are padding, masked
  out); env steps count real steps; every update starts new episodes.
- The batch's advantages are the group kernel's on the real rows (checked against a
  plain NumPy loop), and the learner gives each row's advantage to every token of its
  action, without normalising it again.
- Critic-free: the value head is neither run nor trained.
- The KL penalty to the frozen base model is 0 while the adapter is the base.
- Sizes that do not divide, and an environment whose reset cannot repeat a state, are
  one line each.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import envs_py
from envs_py.interface import Observation
from envs_py.toy import DecisiveTokenEnv
from poad_jax.agent.experience import behaviour_statistics, groups_with_signal, make_token_batch, pack_batch
from poad_jax.agent.learner import compute_advantages, init_train_state, jit_update
from poad_jax.agent.methods import GroupRelative, make_method
from poad_jax.core.group_advantages import GroupConfig
from poad_jax.agent.rollout import RolloutCollector, merged_actor
from poad_jax.core.critic_config import CriticConfig
from poad_jax.core.policy import ValueHead, split_policy
from poad_jax.models.tiny import tiny_random_model
from poad_jax.run import cli as train_cli
from poad_jax.run import train as train_lib
from poad_jax.run import config as config_lib
from poad_jax.run.config import learner_config, rollout_config
from poad_jax.sampling import Sampler

REPO = pathlib.Path(__file__).resolve().parents[1]


class VaryingLength(DecisiveTokenEnv):
    """The toy task whose episodes last 1 to 3 steps, by seed: threads of one group end together,
    groups apart."""

    def reset(self, seed=None):
        observation = super().reset(seed)
        self.horizon = 1 + (seed or 0) % 3
        return observation


class UnrepeatableReset(DecisiveTokenEnv):
    """Each reset shows a fresh random number, whatever the seed."""

    def reset(self, seed=None):
        observation = super().reset(seed)
        return Observation(f"{observation.text} ({random.random():.6f})", observation.actions)


class NeverRewarded(DecisiveTokenEnv):
    """The toy task with no reward on any door: every group's returns are equal."""

    def step(self, action):
        result = super().step(action)
        return dataclasses.replace(result, reward=0.0)


envs_py.register("test/varying_length", f"{__name__}:VaryingLength", "(tests)")
envs_py.register("test/never_rewarded", f"{__name__}:NeverRewarded", "(tests)")
envs_py.register("test/unrepeatable_reset", f"{__name__}:UnrepeatableReset", "(tests)")


def group_rollout(method_name="gigpo", threads=4, size=2, length=3, env="test/varying_length", seed=0):
    model, tokenizer = tiny_random_model(seed=seed)
    head = ValueHead(model.config.hidden_size, CriticConfig(hidden_sizes=(32,)), rngs=nnx.Rngs(1))
    graph, frozen, params = split_policy(model, head)
    method = make_method(method_name, 0.95, group=GroupRelative(method_name, GroupConfig(size=size), threads, 0.95))
    config = rollout_config(num_threads=threads, rollout_length=length, prompt_format="raw", group_size=size)
    envs = envs_py.VectorEnv(env, threads, seed=seed, group_size=size, num_colours=3, rewarded="blue")
    collector = RolloutCollector(envs, tokenizer, Sampler(merged_actor(graph, frozen, params)), method, config,
                                 seed=seed)
    return graph, frozen, params, method, config, envs, collector, tokenizer


def test_group_rollouts_share_their_start_pad_after_the_end_and_count_real_steps():
    graph, frozen, params, method, config, envs, collector, _ = group_rollout()
    first = [o.text for o in collector.observations]
    assert first[0] == first[1] and first[2] == first[3]
    for update in range(3):
        horizons = [w.env.horizon for w in envs._workers]
        assert horizons[0] == horizons[1] and horizons[2] == horizons[3]
        before = collector.env_steps
        steps, _ = collector.collect(jax.random.key(update))
        assert len(steps) == 3 and all(len(records) == 4 for records in steps)
        for b in range(4):
            padding = [steps[t][b].padding for t in range(3)]
            assert padding == [t >= horizons[b] for t in range(3)], (update, b, horizons)
            assert [steps[t][b].done for t in range(horizons[b])][-1]  # each episode ended at its horizon
        assert collector.env_steps - before == sum(horizons)
        assert envs.episode_counters == [update + 1] * 4  # every thread starts its group's next episode
        assert all(not actions for actions in envs.episode_actions)  # no episode in progress at a checkpoint


def grpo_reference(rewards, threads, size, epsilon=1e-6):
    """GRPO's advantage of each real row by plain loops: the trajectory's return, normalised over its
    group's step rows (unbiased std; a group of one row keeps its return)."""
    returns = {b: sum(r for tb, r in zip(threads, rewards) if tb == b) for b in set(threads)}
    out = []
    for b in threads:
        rows = [returns[tb] for tb in threads if tb // size == b // size]
        if len(rows) == 1:
            out.append(rows[0] / (1 + epsilon))
            continue
        mean = sum(rows) / len(rows)
        std = (sum((x - mean) ** 2 for x in rows) / (len(rows) - 1)) ** 0.5
        out.append((returns[b] - mean) / (std + epsilon))
    return out


def test_the_batch_carries_the_group_advantages_on_every_token_of_each_real_row():
    graph, frozen, params, method, config, envs, collector, tokenizer = group_rollout("grpo")
    steps, next_prompts = collector.collect(jax.random.key(0))
    for records in steps:  # a reward on some rows, so the groups differ
        for b, record in enumerate(records):
            record.reward = float(b % 3 == 0) if not record.padding else 0.0
    arrays, next_arrays = pack_batch(steps, next_prompts, method, config, tokenizer.pad_token_id)
    rows = [(b, t) for b in range(4) for t in range(3)]  # thread-major
    real = [n for n, (b, t) in enumerate(rows) if not steps[t][b].padding]
    expected = grpo_reference([steps[rows[n][1]][rows[n][0]].reward for n in real], [rows[n][0] for n in real], 2)
    np.testing.assert_allclose(arrays["advantages"][real], expected, rtol=1e-6, atol=1e-6)
    padding = [n for n in range(len(rows)) if n not in real]
    assert not arrays["action_mask"][padding].any() and not arrays["advantages"][padding].any()
    stats = behaviour_statistics(graph, frozen, params, params["head"], arrays, next_arrays, method=method,
                                 temperature=1.0, critic_kind="head")
    batch = make_token_batch(arrays, stats)
    assert not np.asarray(batch.old_values).any()  # no critic ran
    advantages, returns = compute_advantages(batch, method, learner_config(gamma=0.95))
    mask = np.asarray(batch.action_mask)
    per_token = np.broadcast_to(arrays["advantages"][:, None], mask.shape)
    np.testing.assert_array_equal(np.asarray(advantages)[mask], per_token[mask])
    assert not np.asarray(advantages)[~mask].any() and not np.asarray(returns).any()


@pytest.mark.parametrize("method_name", ["grpo", "gigpo"])
@pytest.mark.parametrize("rewarded_threads, expected", [
    ((), 0), ((0, 1, 2, 3), 0), ((0,), 1), ((1, 2), 2), ((0, 1, 2), 1),
], ids=["none", "all", "one-in-group-0", "one-in-each", "group-0-alike"])
def test_groups_with_signal_counts_the_groups_whose_advantages_are_not_all_zero(method_name, rewarded_threads,
                                                                                expected):
    *_, method, config, _, collector, tokenizer = group_rollout(method_name, length=1, env="test/never_rewarded")
    steps, next_prompts = collector.collect(jax.random.key(0))
    for b, record in enumerate(steps[0]):
        record.reward = float(b in rewarded_threads)
    # the reference: a group (threads 2g, 2g + 1, one step each) has signal iff its two returns differ
    returns = [float(b in rewarded_threads) for b in range(4)]
    reference = sum(returns[2 * g] != returns[2 * g + 1] for g in range(2))
    assert reference == expected
    advantages = pack_batch(steps, next_prompts, method, config, tokenizer.pad_token_id)[0]["advantages"]
    assert groups_with_signal(advantages, 2, 1) == (expected, 2)


@pytest.mark.long
def test_a_group_run_without_differing_returns_says_so_once_and_counts_across_a_resume(capsys, tmp_path,
                                                                                       monkeypatch):
    monkeypatch.setattr(train_lib, "SILENT_GROUP_UPDATES", 2)
    config = toy_group_config("grpo", updates=2, **{"env.name": "test/never_rewarded"})
    capsys.readouterr()
    assert train_cli.main(config, tmp_path / "w", compilation_cache=False, show_progress=False) == 0
    records = [json.loads(line) for line in (tmp_path / "w" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["groups_with_signal"], r["groups"]) for r in records] == [(0, 1), (0, 1)]  # one group of 4
    assert all(r["advantage_mean"] == 0.0 for r in records)
    out, err = capsys.readouterr()
    warnings = [line for line in err.splitlines() if line.startswith("warning: grpo")]
    assert len(warnings) == 1, warnings
    assert "why: in none of the 2 updates did an episode group have trajectories whose returns differ" in out
    assert "larger learning rate (ppo.actor_lr)" not in out
    assert "in the last 2 updates no episode group had trajectories whose returns differ" in warnings[0]
    assert "only the entropy bonus moves the policy" in warnings[0] and "--config.rollout_length" in warnings[0]
    # resumed past the streak: no second warning; a streak that started before the checkpoint counts on
    assert train_lib.trailing_silent_updates(records) == 2
    assert train_cli.main(toy_group_config("grpo", updates=3, **{"env.name": "test/never_rewarded"}),
                          tmp_path / "w", compilation_cache=False, show_progress=False) == 0
    assert not [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: grpo")]
    assert train_lib.trailing_silent_updates([{"groups_with_signal": 0}, {"groups_with_signal": 1},
                                              {"groups_with_signal": 0}]) == 1
    assert train_lib.trailing_silent_updates([{"approx_kl": 0.1}]) == 0  # not a group method's record


@pytest.mark.long
def test_an_update_trains_the_actor_and_leaves_the_value_head_as_it_was():
    graph, frozen, params, method, config, envs, collector, tokenizer = group_rollout("gigpo")
    steps, next_prompts = collector.collect(jax.random.key(0))
    for records in steps:
        for b, record in enumerate(records):
            record.reward = 0.0 if record.padding else float(b)
    arrays, next_arrays = pack_batch(steps, next_prompts, method, config, tokenizer.pad_token_id)
    lconfig = learner_config(gamma=0.95, num_minibatches=1, actor_lr=1e-2, critic_lr=1e-2, ref_kl_coef=0.5)
    stats = behaviour_statistics(graph, frozen, params, params["head"], arrays, next_arrays, method=method,
                                 temperature=1.0, critic_kind="head", reference_logprobs=True)
    batch = make_token_batch(arrays, stats)
    # The adapter starts as the base model (B = 0): the reference's log-probs are the policy's.
    np.testing.assert_allclose(np.asarray(batch.ref_logprobs), np.asarray(batch.old_logprobs), atol=1e-6)
    update, _ = jit_update(graph, method, lconfig)
    state = init_train_state(params, lconfig, jax.random.key(0))
    before = jax.tree.map(np.asarray, state.params)
    state, metrics = update(state, frozen, batch)
    same = lambda a, b: all(np.array_equal(np.asarray(x), y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
    assert same(state.params["head"], before["head"])
    assert not same(state.params["actor"], before["actor"])
    assert float(metrics["value_loss"]) == 0.0 and abs(float(metrics["ref_kl"])) < 1e-6  # the step from the base
    state, metrics = update(state, frozen, batch)
    assert float(metrics["ref_kl"]) > 1e-6  # the adapter has moved away from the base


def toy_group_config(method="grpo", updates=2, **fields):
    config = config_lib.load_config_file(REPO / "configs" / "toy.py")
    config.method = method
    config.total_env_steps = 8 * updates  # horizon 2 x 4 threads per update
    config.tensorboard = False
    config.plot = False
    for name, value in fields.items():
        node = config
        *parents, leaf = name.split(".")
        for parent in parents:
            node = node[parent]
        node[leaf] = value
    return config


@pytest.mark.parametrize("fields, words", [
    ({"group.size": 3}, "num_threads (4) must be divisible by group.size (3)"),
    ({"restricted_sampling": "action_scores"}, "restricted_sampling must be 'trie'"),
    ({"method": "poad", "ppo.ref_kl_coef": 0.01}, "ppo.ref_kl_coef > 0 is for grpo and gigpo, not poad"),
    ({"ppo.behaviour_correction": "importance"}, "grpo samples the token policy it optimises: it needs no"),
    ({"env.name": "test/unrepeatable_reset", "env.kwargs": {}},
     "threads 0 and 1 were reset with one seed but start from different observations"),
], ids=["size", "sampling", "kl-for-poad", "correction", "unrepeatable-reset"])
def test_group_mistakes_are_one_line(capsys, tmp_path, fields, words):
    config = toy_group_config(**fields)
    capsys.readouterr()
    assert train_cli.main(config, tmp_path / "w", compilation_cache=False, show_progress=False) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], err
    assert not (tmp_path / "w").exists()


@pytest.mark.long
@pytest.mark.parametrize("method", ["grpo", "gigpo"])
def test_the_methods_train_from_the_command_and_resume_exactly(capsys, tmp_path, method):
    config = toy_group_config(method, updates=2)
    assert train_cli.main(config, tmp_path / "whole", compilation_cache=False, show_progress=False) == 0
    halves = toy_group_config(method, updates=1)
    assert train_cli.main(halves, tmp_path / "halves", compilation_cache=False, show_progress=False) == 0
    assert train_cli.main(config, tmp_path / "halves", compilation_cache=False, show_progress=False) == 0
    read = lambda w: [json.loads(line) for line in (w / "metrics.jsonl").read_text().splitlines()]
    whole, halves = read(tmp_path / "whole"), read(tmp_path / "halves")
    assert [r["env_steps"] for r in whole] == [8, 16]  # 4 threads x horizon 2: no padding steps counted
    for a, b in zip(whole, halves):
        for key in ("policy_loss", "approx_kl", "entropy", "episode_return"):
            assert a[key] == b[key], (a["update"], key)
    assert whole[-1]["value_loss"] == 0.0
