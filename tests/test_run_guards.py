"""A misbehaving environment or a non-finite number never corrupts a run.

- The environment boundary (`envs_py.checks`, in `VectorEnv`): a NaN, infinite or
  string reward, a non-bool `done`, a non-string observation, no offered actions,
  and an environment that raises each end the training command with exit status 3,
  one `error:` line naming the environment, thread, env step and field with the
  value (the environment's own traceback under that header when it raised), and a
  line saying which checkpoints are intact.
- The update's guard (`agent/learner.py`): a minibatch step whose loss or gradient
  is not finite changes no parameter and no optimiser state and is counted; a
  reward of 1e30 makes every step non-finite and the run stops after
  `max_nonfinite_updates` updates with a line naming the likely causes.
- Checkpoints: a non-finite train state is refused before anything is written;
  every checkpoint a run wrote holds finite numbers only.
- A run whose environment failed resumes, once fixed, to the same metrics as a run
  that never failed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_py
from envs_py.interface import Observation, StepResult
from envs_py.toy import DecisiveTokenEnv
from poad_jax.agent.learner import UpdateBatch, UpdateContext, init_train_state, minibatch_step
from poad_jax.bench.adrl_parity import replayed_update
from poad_jax.run import checkpoint as checkpoint_lib
from poad_jax.run import cli as train_cli
from poad_jax.run import config as config_lib
from poad_jax.run.config import learner_config

from test_learner import collect_batch

REPO = pathlib.Path(__file__).resolve().parents[1]
FAULTY_ENV = "test/faulty_toy"
THREADS, LENGTH = 2, 2  # an update is 4 env steps


class FaultyToyEnv:
    """The toy task, whose `fault_at`-th step call (counted per thread, from 1; 0: every call) returns one
    bad field (`fault`) or raises; with `fault_file`, only while that file exists (the fix is deleting it)."""

    def __init__(self, fault: str = "none", fault_at: int = 1, fault_file: str = "", **kwargs):
        self.env = DecisiveTokenEnv(**kwargs)
        self.fault, self.fault_at, self.fault_file = fault, fault_at, fault_file
        self.calls = 0

    def reset(self, seed=None):
        return self.env.reset(seed)

    def _faulty(self) -> bool:
        at = self.fault_at in (0, self.calls)
        return at and (not self.fault_file or pathlib.Path(self.fault_file).exists())

    def step(self, action):
        self.calls += 1
        result = self.env.step(action)
        if not self._faulty():
            return result
        if self.fault == "raise":
            raise RuntimeError("the simulator lost its state")
        if self.fault == "huge":  # a user's reward scale, finite but beyond float32's square
            return dataclasses.replace(result, reward=1e30)
        bad = {"nan": dict(reward=float("nan")), "-inf": dict(reward=-math.inf), "string": dict(reward="1.0"),
               "done_int": dict(done=1),
               "text_int": dict(observation=Observation(7, result.observation.actions)),
               "no_actions": dict(observation=Observation(result.observation.text, ()))}[self.fault]
        return dataclasses.replace(result, **bad)


envs_py.register(FAULTY_ENV, f"{__name__}:FaultyToyEnv", "the toy task with one fault (tests)")


def faulty_config(fault: str, fault_at: int, updates: int = 4, **kwargs):
    config = config_lib.load_config_file(REPO / "configs" / "toy.py")
    config.env.name = FAULTY_ENV
    config.env.kwargs = dict(config.env.kwargs, fault=fault, fault_at=fault_at, **kwargs)
    config.num_threads, config.rollout_length = THREADS, LENGTH
    config.total_env_steps = THREADS * LENGTH * updates
    config.tensorboard = False
    config.plot = False
    return config


def run_command(capsys, config, workdir) -> tuple[int, str]:
    capsys.readouterr()
    status = train_cli.main(config, workdir, compilation_cache=False, show_progress=False)
    return status, capsys.readouterr().err


def assert_checkpoints_finite(workdir: pathlib.Path) -> list[int]:
    """Every checkpoint in `workdir` restored and checked: all its arrays finite.  Returns their steps."""
    steps = checkpoint_lib.checkpoint_steps(workdir)
    for step in steps:
        restored = checkpoint_lib.RunCheckpointer(workdir, create=False).manager.restore(step)
        arrays = [x for x in jax.tree.leaves(restored["state"]) if np.issubdtype(np.asarray(x).dtype, np.inexact)]
        assert arrays and all(np.all(np.isfinite(np.asarray(x))) for x in arrays), step
    return steps


# The faults the boundary catches: (fault, the words of the error line).
BOUNDARY_CASES = [
    ("nan", "reward must be a finite real number, got nan (float)"),
    ("-inf", "reward must be a finite real number, got -inf (float)"),
    ("string", "reward must be a real number (int or float), got '1.0' (str)"),
    ("done_int", "done must be a bool, got 1 (int)"),
    ("text_int", "observation.text must be a string, got 7 (int)"),
    ("no_actions", "observation.actions must be a non-empty sequence of action strings"),
]


@pytest.mark.long
@pytest.mark.parametrize("fault, words", BOUNDARY_CASES, ids=[case[0] for case in BOUNDARY_CASES])
def test_a_bad_env_output_stops_the_run_in_one_line_with_what_is_kept(capsys, tmp_path, fault, words):
    # Thread 0's third step is env step 2 * 2 + 0 + 1 = 5, the first of update 2: update 1 is saved.
    status, err = run_command(capsys, faulty_config(fault, fault_at=3), tmp_path / "w")
    assert status == train_cli.EXIT_RUN_STOPPED, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 2, err
    assert lines[0].startswith(f"error: environment '{FAULTY_ENV}', thread 0, env step 5 (step): "), lines[0]
    assert words in lines[0], lines[0]
    assert lines[1] == (f"checkpoints up to update 1 are intact in {tmp_path / 'w'}; fix the environment and "
                        "re-run the same command to resume")
    assert assert_checkpoints_finite(tmp_path / "w") == [1]


def test_an_environment_that_raises_gets_a_header_line_above_its_own_traceback(capsys, tmp_path):
    status, err = run_command(capsys, faulty_config("raise", fault_at=3), tmp_path / "w")
    assert status == train_cli.EXIT_RUN_STOPPED, err
    lines = err.strip().splitlines()
    assert lines[0] == f"error: environment '{FAULTY_ENV}', thread 0, env step 5 (step) raised RuntimeError; its traceback:"
    assert lines[1] == "Traceback (most recent call last):"
    assert "in step" in err and 'raise RuntimeError("the simulator lost its state")' in err  # the user's frame
    assert lines[-2] == "RuntimeError: the simulator lost its state"
    assert lines[-1].startswith("checkpoints up to update 1 are intact")


def test_a_fault_before_the_first_checkpoint_says_the_run_starts_again(capsys, tmp_path):
    status, err = run_command(capsys, faulty_config("nan", fault_at=1), tmp_path / "w")
    assert status == train_cli.EXIT_RUN_STOPPED
    assert "thread 0, env step 1 (step)" in err
    assert err.strip().splitlines()[-1] == ("no checkpoint had been written yet; fix the environment and re-run "
                                            "the same command to start the run again")


class NoActionsOnReset(DecisiveTokenEnv):
    def reset(self, seed=None):
        return Observation(super().reset(seed).text, [])


envs_py.register("test/no_actions_on_reset", f"{__name__}:NoActionsOnReset", "(tests)")


def test_the_boundary_checks_resets_and_names_the_thread():
    with envs_py.VectorEnv("test/no_actions_on_reset", 2) as envs:
        with pytest.raises(envs_py.EnvOutputError) as error:
            envs.reset()
    assert str(error.value).startswith("environment 'test/no_actions_on_reset', thread 0 (reset): "
                                       "observation.actions must be a non-empty sequence")
    with envs_py.VectorEnv(FAULTY_ENV, 3, fault="done_int", fault_at=1) as envs:
        envs.reset()
        with pytest.raises(envs_py.EnvOutputError) as error:
            envs.step(["walk to the red door"] * 3)
    assert (error.value.field, error.value.value, error.value.thread) == ("done", 1, 0)


def test_a_reward_scale_that_overflows_stops_after_the_allowed_updates_with_finite_checkpoints(capsys, tmp_path):
    # Every step pays 1e30: each update's value loss overflows float32.
    config = faulty_config("huge", fault_at=0, updates=6)
    config.max_nonfinite_updates = 2
    status, err = run_command(capsys, config, tmp_path / "w")
    assert status == train_cli.EXIT_RUN_STOPPED, err
    lines = err.strip().splitlines()
    assert len(lines) == 2, err
    assert lines[0].startswith("error: 2 updates in a row had minibatch steps with a non-finite loss or gradient "
                               "(4 of 4 skipped in update 2), so the run stopped; likely causes: the reward scale "
                               "(|reward| up to 1e+30 in its rollout), the learning rate (ppo.actor_lr=0.003, "
                               "ppo.critic_lr=0.003) or the precision (matmul_dtype="), lines[0]
    assert lines[1].startswith("checkpoints up to update 2 are intact")
    records = [json.loads(line) for line in (tmp_path / "w" / "metrics.jsonl").read_text().splitlines()]
    assert [r["nonfinite_steps"] for r in records] == [4, 4]  # toy: 2 epochs x 2 minibatches
    assert assert_checkpoints_finite(tmp_path / "w") == [1, 2]
    # Every step was skipped: the checkpoint's parameters are the initial ones.
    restored = checkpoint_lib.RunCheckpointer(tmp_path / "w", create=False).manager.restore(2)["state"]
    assert int(np.asarray(restored["actor_opt_state"][1][0]["count"])) == 0


@pytest.mark.long
def test_a_poisoned_minibatch_changes_nothing_and_the_others_step():
    graph, frozen, params, method, batch, _ = collect_batch("poad")
    config = learner_config(gamma=0.95, num_minibatches=2, epochs=1, actor_lr=1e-2, critic_lr=1e-2, target_kl=10.0)
    rows = batch.num_rows
    order = jnp.arange(rows).reshape(1, 2, rows // 2)  # minibatch 0: the first half of the rows, 1: the rest
    state0 = init_train_state(params, config, jax.random.key(0))
    copy = lambda tree: jax.tree.map(jnp.array, tree)
    context = UpdateContext(graph, method, config)
    replayed = replayed_update(context, order)  # the update, minibatch 0 then 1
    update = jax.jit(lambda s, b: replayed(s, frozen, b))
    poisoned = dataclasses.replace(batch, old_logprobs=batch.old_logprobs.at[1].set(jnp.nan))  # in minibatch 0
    state, metrics, details = update(copy(state0), poisoned)
    assert float(metrics["nonfinite_steps"]) == 1 and float(metrics["skipped_minibatches"]) == 0
    assert all(math.isfinite(float(metrics[k])) for k in ("policy_loss", "value_loss", "approx_kl", "entropy"))
    # Minibatch 1's step alone, from the state before the update: the poisoned step changed nothing.
    step_alone = jax.jit(lambda s, data: minibatch_step(s, order[0, 1][None, :], frozen, data, context)[0])
    expected = step_alone(copy(state0), UpdateBatch(poisoned, details["advantages"], details["returns"]))
    changed = lambda s: jax.tree.leaves((s.params, s.actor_opt_state, s.critic_opt_state))
    assert any(not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(changed(state), changed(state0)))
    for got, want in zip(changed(state), changed(expected)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-7)
    # Poisoned in both minibatches: the update leaves the whole state as it was, and says so.
    both = dataclasses.replace(batch, old_logprobs=batch.old_logprobs.at[1].set(jnp.nan).at[rows - 1].set(jnp.inf))
    state, metrics, _ = update(copy(state0), both)
    assert float(metrics["nonfinite_steps"]) == 2 and math.isnan(float(metrics["policy_loss"]))
    for got, want in zip(changed(state), changed(state0)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_a_nonfinite_state_is_never_saved(tmp_path):
    state = {"actor": jnp.ones(3), "opt": (jnp.array([1.0, jnp.inf]),), "rng": jax.random.key(0), "step": jnp.int32(1)}
    checkpointer = checkpoint_lib.RunCheckpointer(tmp_path)
    with pytest.raises(checkpoint_lib.NonFiniteStateError) as error:
        checkpointer.save(1, state, {})
    assert str(error.value).startswith("refused to save update 1: 1 array(s) of the train state are not finite "
                                       "(['opt'][0]); no checkpoint was written before it")
    assert checkpoint_lib.checkpoint_steps(tmp_path) == []
    checkpointer.close()


@pytest.mark.long
def test_a_run_resumed_after_its_environment_is_fixed_matches_a_run_that_never_failed(capsys, tmp_path):
    fault_file = tmp_path / "broken"
    fault_file.write_text("")
    config = faulty_config("raise", fault_at=5, updates=4, fault_file=str(fault_file))
    status, _ = run_command(capsys, config, tmp_path / "failed")
    assert status == train_cli.EXIT_RUN_STOPPED
    assert checkpoint_lib.checkpoint_steps(tmp_path / "failed") == [1, 2]
    fault_file.unlink()  # the fix
    assert run_command(capsys, config, tmp_path / "failed")[0] == 0
    assert run_command(capsys, config, tmp_path / "clean")[0] == 0
    read = lambda w: [json.loads(line) for line in (w / "metrics.jsonl").read_text().splitlines()]
    failed, clean = read(tmp_path / "failed"), read(tmp_path / "clean")
    assert [r["update"] for r in failed] == [1, 2, 3, 4]
    for a, b in zip(failed, clean):
        for key in ("env_steps", "policy_loss", "value_loss", "approx_kl", "episode_return", "entropy"):
            assert a.get(key) == b.get(key), (a["update"], key)
