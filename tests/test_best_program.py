"""The best program of a DataSciCoding run: written as training goes, atomic,
kept across kill -9 and resume, re-scored to the same AUC, named in the summary.

Fast path: a tiny random model cannot write scikit-learn code, so the runs
here use `ScriptedDataSciEnv`, the real DataSciCoding env (real sandbox,
real AUCs on balance_scale) whose actions are replaced by a fixed script of
programs.  Everything from the env's StepResults on (the trainer's keeper,
the files, resume, re-scoring) is the production path.

Run as a script (`python tests/test_best_program.py --config=... `), this
file registers the scripted env and runs the training CLI, so a test can
kill -9 a real training process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import envs_py  # noqa: E402
from envs_py.datasci.env import DataSciEnv  # noqa: E402

SCRIPTED_ENV = "test/scripted_datasci"
# A failing program first, then three classifiers with different AUCs
# (deterministic: the re-scored AUC must equal the recorded one).
PROGRAMS = (
    "def build_model(x_train, y_train):\n    return no_such_model\n",
    "from sklearn.tree import DecisionTreeClassifier\n\ndef build_model(x_train, y_train):\n"
    "    return DecisionTreeClassifier(max_depth=1, random_state=0).fit(x_train, y_train)\n",
    "from sklearn.linear_model import LogisticRegression\n\ndef build_model(x_train, y_train):\n"
    "    return LogisticRegression(max_iter=500).fit(x_train, y_train)\n",
    "from sklearn.tree import DecisionTreeClassifier\n\ndef build_model(x_train, y_train):\n"
    "    return DecisionTreeClassifier(max_depth=3, random_state=0).fit(x_train, y_train)\n",
)


class ScriptedDataSciEnv(DataSciEnv):
    """DataSciCoding on balance_scale whose k-th step (per instance) runs PROGRAMS[k % 4]."""

    def __init__(self, **kwargs):
        super().__init__(dataset="balance_scale", template="plain", **kwargs)
        self.calls = 0

    def step(self, action: str):
        del action  # the script replaces the model's text
        program = PROGRAMS[self.calls % len(PROGRAMS)]
        self.calls += 1
        return super().step(f"```python\n{program}```")


envs_py.register(SCRIPTED_ENV, f"{__name__}:ScriptedDataSciEnv", "DataSciCoding with scripted programs (tests)")

if __name__ == "__main__":  # the training CLI; the config file (see `write_config_file`) registers the env
    sys.path.insert(0, str(REPO / "tests"))
    from poad_jax.run import cli

    cli.cli()

import pytest  # noqa: E402

from poad_jax.run import best_program, hardware, train  # noqa: E402
from poad_jax.run import checkpoint as checkpoint_lib  # noqa: E402
from poad_jax.run import cli  # noqa: E402
from poad_jax.run import config as config_lib  # noqa: E402
from poad_jax.run.metrics import read_metrics  # noqa: E402

OVERRIDES = {
    "env.name": SCRIPTED_ENV, "env.kwargs": {"max_attempts": 4, "timeout_s": 60.0},
    "env.vector_mode": "inline", "num_threads": 2, "rollout_length": 2, "sampling.max_new_tokens": 4,
    "tensorboard": False, "plot": False,
}


def write_config_file(directory: pathlib.Path, updates: int) -> pathlib.Path:
    """A config file for the CLI: `scripted_config(updates)` (importing this module registers the env)."""
    path = directory / "scripted_config.py"
    path.write_text(
        f"import sys\nsys.path.insert(0, {str(REPO / 'tests')!r})\n"
        "from test_best_program import scripted_config\n\n"
        f"def get_config():\n    return scripted_config({updates})\n"
    )
    return path


def scripted_config(updates: int):
    config = config_lib.load_config_file(REPO / "configs" / "toy.py")
    for key, value in OVERRIDES.items():
        node = config
        *parents, leaf = key.split(".")
        for parent in parents:
            node = node[parent]
        node[leaf] = value
    config.total_env_steps = 4 * updates
    return config


@pytest.fixture(scope="module")
def program_scores():
    """Each scripted program's mean AUC (None when it fails), scored by the env directly."""
    env = ScriptedDataSciEnv()
    scores = []
    for program in PROGRAMS:
        result = env.score_program(program)
        scores.append(result.mean_auc if result.success else None)
    return scores


def test_script_has_distinct_scores(program_scores):
    """Guards the other tests: one failure, three different successful AUCs."""
    assert program_scores[0] is None
    successes = [s for s in program_scores if s is not None]
    assert len(successes) == 3 and len(set(successes)) == 3


def test_keeper_keeps_the_best_and_only_replaces_it_with_a_better_one(tmp_path, program_scores):
    env = ScriptedDataSciEnv()
    keeper = best_program.BestProgramKeeper(tmp_path, SCRIPTED_ENV, {})
    env.reset()
    seen = []
    for k in range(len(PROGRAMS)):
        result = env.step("ignored")
        if result.done:
            env.reset()
        improved = keeper.offer([result], first_env_step=k, update=1)
        if result.info["success"]:
            seen.append(result.reward)
            assert improved == (result.reward >= max(seen))
    best = best_program.read_best(tmp_path)
    assert best.mean_auc == max(s for s in program_scores if s is not None)
    assert PROGRAMS[program_scores.index(best.mean_auc)].strip() in best.program
    assert best.env_steps == program_scores.index(best.mean_auc) + 1
    assert best.dataset == "balance_scale" and len(best.auc_per_split) == 5
    text = (tmp_path / best_program.PROGRAM_FILE).read_text()
    assert best.program.strip() in text and f"{best.mean_auc:.4f}" in text
    # A fresh keeper (a resumed run) starts from the kept program.
    assert best_program.BestProgramKeeper(tmp_path, SCRIPTED_ENV, {}).best == best


def test_a_kill_between_the_two_writes_is_repaired(tmp_path, program_scores):
    """best_program.py is written first; if a kill leaves it stale, reading the JSON rewrites it."""
    env = ScriptedDataSciEnv()
    env.reset()
    env.step("x")
    result = env.step("x")  # the first successful program
    best_program.BestProgramKeeper(tmp_path, SCRIPTED_ENV, {}).offer([result], 0, 1)
    (tmp_path / best_program.PROGRAM_FILE).write_text("# half written")
    best = best_program.read_best(tmp_path)
    assert best.program.strip() in (tmp_path / best_program.PROGRAM_FILE).read_text()
    (tmp_path / best_program.RECORD_FILE).write_text("{not json")
    with pytest.raises(best_program.BestProgramError, match="damaged"):
        best_program.read_best(tmp_path)


@pytest.mark.long
def test_training_writes_the_best_program_and_rescoring_agrees(tmp_path, program_scores, capsys):
    workdir = tmp_path / "run"
    result = train.run(scripted_config(2), workdir, show_progress=False)
    best = best_program.read_best(workdir)
    assert best is not None and best.mean_auc == max(s for s in program_scores if s is not None)
    assert 1 <= best.update <= 2 and 1 <= best.env_steps <= 8
    assert result.best == best
    assert result.records[-1]["best_step_reward"] == pytest.approx(best.mean_auc)
    summary = cli.summary_text(scripted_config(2), result)
    assert "best_program.py" in summary and f"{best.mean_auc:.4f}" in summary
    assert "programs ran" in summary
    assert best_program.main(["--workdir", str(workdir)]) == 0
    out = capsys.readouterr().out
    assert f"re-run:   mean AUC {best.mean_auc:.4f}" in out
    rescored = best_program.rescore(workdir)[1]
    assert rescored.mean_auc == best.mean_auc and rescored.auc_per_split == best.auc_per_split
    # The record names the machine that scored it: here, so a re-score here is compared exactly.
    assert best.machine == hardware.scoring_machine() and "note:" not in out


def test_a_rescore_on_another_machine_says_why_it_may_differ(program_scores):
    """The record of another CPU (or none) explains a moved score; the same machine's record does not."""
    here = hardware.scoring_machine()
    elsewhere = {**here, "cpu": "AMD EPYC", "isa": ["avx", "avx2", "fma"]}
    kept = best_program.BestProgram(program="x", mean_auc=0.7, auc_per_split=(0.7,) * 5, env=SCRIPTED_ENV,
                                    env_kwargs={}, dataset="balance_scale", update=1, env_steps=1, machine=elsewhere)
    moved = (0.7,) * 4 + (0.705,)
    assert "AMD EPYC (avx, avx2, fma)" in best_program.machine_note(kept, moved)
    assert best_program.machine_note(kept, kept.auc_per_split) is None
    assert best_program.machine_note(dataclasses.replace(kept, machine=here), moved) is None
    assert "does not name" in best_program.machine_note(dataclasses.replace(kept, machine=None), moved)


@pytest.mark.long
def test_best_program_survives_kill_minus_nine_and_resume(tmp_path, program_scores):
    workdir = tmp_path / "killed"
    updates = 4
    args = [sys.executable, str(REPO / "tests" / "test_best_program.py"),
            f"--config={write_config_file(tmp_path, updates)}", f"--workdir={workdir}"]
    process = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        if (workdir / best_program.RECORD_FILE).exists() and checkpoint_lib.checkpoint_steps(workdir):
            break
        if process.poll() is not None:
            pytest.fail(f"training ended before it could be killed: {process.stderr.read()[-2000:]}")
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    before = best_program.read_best(workdir)
    assert before is not None and before.program.strip() in (workdir / best_program.PROGRAM_FILE).read_text()
    finished = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert "resuming" in finished.stdout and "best program:" in finished.stdout
    after = best_program.read_best(workdir)
    assert after.mean_auc >= before.mean_auc
    assert after.mean_auc == max(s for s in program_scores if s is not None)
    if after.mean_auc == before.mean_auc:
        assert after == before  # kept as it was, not re-found under another update
    assert [r["update"] for r in read_metrics(workdir / "metrics.jsonl")] == list(range(1, updates + 1))
    assert best_program.rescore(workdir)[1].mean_auc == after.mean_auc


def test_rescore_without_a_best_program_is_one_line(tmp_path, capsys):
    """A run directory without a best program, a directory that is no run directory, a missing one and a
    file: each its own line."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    for workdir, said in ((run, f"error: {run} holds no best_program.json (no program has run successfully yet)"),
                          (tmp_path, f"error: {tmp_path} is not a run directory (no config.json)"),
                          (tmp_path / "gone", f"error: no run directory at {tmp_path / 'gone'}"),
                          (run / "config.json", f"error: {run / 'config.json'} is a file, not a run directory")):
        assert best_program.main(["--workdir", str(workdir)]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [said]


def test_a_run_with_improvement_episodes_keeps_its_best_single_program(tmp_path, program_scores, capsys):
    """Improvement episodes with graded failures: rewards are gains, yet the kept best program is the
    best single program with its own AUC; best_program re-scores it, evaluate plays the run, and the
    records and the summary count estimators and failures by stage."""
    from poad_jax.tools import evaluate

    config = scripted_config(2)
    config.env.kwargs = {"max_attempts": 4, "timeout_s": 60.0, "improve_attempts": 2, "graded_failures": True}
    workdir = tmp_path / "improve"
    result = train.run(config, workdir, show_progress=False)
    best = best_program.read_best(workdir)
    assert best.mean_auc == max(s for s in program_scores if s is not None)
    assert best.env_kwargs["improve_attempts"] == 2
    assert result.records[-1]["best_step_reward"] == best.mean_auc
    assert all("distinct_estimators" in r and r["failures_build"] >= 0 for r in result.records)
    assert sum(r["failures_build"] for r in result.records) == result.episodes["failure_stages"]["build"] >= 1
    assert sum(r["distinct_estimators"] for r in result.records) >= 2  # stumps and trees, logistic regressions
    bests = [b for b in result.episodes["finished_best"] if b is not None]
    assert bests and all(b == best.mean_auc for b in bests)  # each episode ends at the script's best program
    summary = cli.summary_text(config, result)
    assert "failures by stage: build" in summary and "best AUC per improvement episode" in summary
    assert best_program.main(["--workdir", str(workdir)]) == 0
    assert f"re-run:   mean AUC {best.mean_auc:.4f}" in capsys.readouterr().out
    assert evaluate.main(["--workdir", str(workdir), "--episodes", "1", "--mode", "sampled", "--max-steps", "8"]) == 0
    row = capsys.readouterr().out.splitlines()[1].split()
    assert row[:3] == [SCRIPTED_ENV, "sampled", "1"] and row[-1] == "1.00"  # a program ran: the episode succeeded
    assert float(row[-2]) == pytest.approx(-0.6 + best.mean_auc, abs=5e-4)  # the graded penalty plus the best AUC (3 digits)


def test_the_untrained_baseline_runs_improvement_episodes_too(tmp_path, program_scores):
    """The honest baseline (docs/datasci.md): `learn=False` in the same scaffold, with the new options."""
    config = scripted_config(2)  # each thread's four steps: a failure, then the script's three programs
    config.learn = False
    config.env.kwargs = {"max_attempts": 4, "timeout_s": 60.0, "improve_attempts": 2, "graded_failures": True}
    result = train.run(config, tmp_path / "untrained", show_progress=False)
    assert best_program.read_best(tmp_path / "untrained").mean_auc == max(s for s in program_scores if s is not None)
    assert [r["failures_build"] for r in result.records] == [2, 0]  # each thread's first program fails
    assert [r["distinct_estimators"] for r in result.records] == [1, 2]  # a tree; a regression and a tree
    summary = cli.summary_text(config, result)
    assert "updates without learning" in summary and "failures by stage: build" in summary
