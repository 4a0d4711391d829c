"""`config.log_actions`: every env step's action and outcome in `actions.jsonl`.

- What is written: JSON-safe values (NaN as null, arrays as lists, long text cut), env steps
  numbered as the run counts them.
- A toy run logs each env step once, its rewards agree with the update's `step_reward_mean`
  in metrics.jsonl, and a resumed run drops a killed update's lines before running it again.
- Off by default: no file; turning it on in a re-run is allowed (an output, not the numbers).
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from envs_py import Observation, StepResult
from poad_jax.run import action_log, rundir, train
from poad_jax.run import config as config_lib
from poad_jax.run.metrics import read_metrics

pytestmark = pytest.mark.long  # the suite's second tier (scripts/test.sh --long)

REPO = pathlib.Path(__file__).resolve().parents[1]
STEPS_PER_UPDATE = 16  # toy: 4 threads x 4 steps


def toy_config(updates: int, log_actions: bool = True):
    config = config_lib.load_config_file(REPO / "configs" / "toy.py")
    config.total_env_steps = STEPS_PER_UPDATE * updates
    config.tensorboard = False
    config.plot = False
    config.log_actions = log_actions
    return config


def test_lines_are_json_safe_and_numbered_as_the_run_counts_steps():
    results = [StepResult(Observation("o"), 0.5, False, {"auc_per_split": np.array([0.9, 0.8]), "error": "x" * 5000}),
               StepResult(Observation("o"), float("nan"), True, {"seconds": np.float32(1.5), "obj": object()})]
    lines = action_log.action_lines(3, 40, ["print(1)", "y"], results)
    assert [line["env_step"] for line in lines] == [41, 42] and [line["thread"] for line in lines] == [0, 1]
    assert lines[0]["info"]["auc_per_split"] == pytest.approx([0.9, 0.8])
    assert lines[0]["info"]["error"].startswith("x" * action_log.TEXT_CHARS + "... [1000 more]")
    assert lines[1]["reward"] is None and lines[1]["done"] is True
    assert lines[1]["info"] == {"seconds": 1.5, "obj": "<object>"}
    assert json.loads(json.dumps(lines)) == lines  # every value survives JSON as it is
    with pytest.raises(ValueError):  # an action without its result (or the reverse) is a bug, not a short log
        action_log.action_lines(1, 0, ["a"], results)


def test_a_run_logs_each_env_step_once_and_a_resume_drops_the_killed_update(tmp_path):
    workdir = tmp_path / "run"
    train.run(toy_config(3), workdir, show_progress=False, max_updates=2)
    logged = action_log.read_actions(workdir)
    assert [line["env_step"] for line in logged] == list(range(1, 2 * STEPS_PER_UPDATE + 1))
    with open(workdir / action_log.ACTIONS_FILE, "a") as f:  # a kill during update 3, after some of its steps
        f.write(json.dumps({"update": 3, "env_step": 33, "thread": 0, "action": "lost"}) + "\n")
        f.write('{"update": 3, "env_st')  # and mid-line
    train.run(toy_config(3), workdir, show_progress=False)
    logged = action_log.read_actions(workdir)
    assert [line["env_step"] for line in logged] == list(range(1, 3 * STEPS_PER_UPDATE + 1))
    assert "lost" not in [line["action"] for line in logged]
    for record in read_metrics(workdir / "metrics.jsonl"):
        rewards = [line["reward"] for line in logged if line["update"] == record["update"]]
        assert len(rewards) == STEPS_PER_UPDATE
        assert np.mean(rewards) == pytest.approx(record["step_reward_mean"], abs=1e-9)
        assert all(isinstance(line["action"], str) and line["action"] for line in logged)


def test_off_by_default_and_turning_it_on_resumes(tmp_path):
    assert config_lib.default_config().log_actions is False
    workdir = tmp_path / "run"
    train.run(toy_config(2, log_actions=False), workdir, show_progress=False, max_updates=1)
    assert not (workdir / action_log.ACTIONS_FILE).exists()
    refused, _ = rundir.config_differences(json.loads((workdir / "config.json").read_text()),
                                           rundir.config_as_json(toy_config(2)))
    assert refused == []
    train.run(toy_config(2), workdir, show_progress=False)  # the second update is logged from here on
    assert [line["update"] for line in action_log.read_actions(workdir)] == [2] * STEPS_PER_UPDATE


def test_truncation_runs_with_logging_off_and_never_on_another_process(tmp_path):
    """A run resumed with logging off still drops a killed update's lines (a later run may turn it on
    again); a process other than 0 neither writes nor rewrites the file."""
    results = [StepResult(Observation("o"), 1.0, True, {})]
    on = action_log.ActionLog(tmp_path, enabled=True)
    for update in (1, 2, 3):
        on.append(update, update - 1, ["a"], results)
    action_log.ActionLog(tmp_path, enabled=True, primary=False).truncate_after(1)
    action_log.ActionLog(tmp_path, enabled=True, primary=False).append(4, 3, ["b"], results)
    assert [line["update"] for line in action_log.read_actions(tmp_path)] == [1, 2, 3]
    action_log.ActionLog(tmp_path, enabled=False).truncate_after(2)
    action_log.ActionLog(tmp_path, enabled=False).append(3, 2, ["c"], results)
    assert [line["update"] for line in action_log.read_actions(tmp_path)] == [1, 2]
