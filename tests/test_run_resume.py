"""Resume as a user meets it (issue 19): the run directory's config is its
identity, the metric log agrees with the checkpoint, a damaged checkpoint
falls back to the newest intact one, and a finished run says so.

All runs are the toy config with the tiny random model (seconds each).
"""

from __future__ import annotations

import json
import shutil

import pathlib

import pytest

from poad_jax.run import checkpoint as checkpoint_lib
from poad_jax.tools import export
from poad_jax.run import train
from poad_jax.run import cli
from poad_jax.run import config as config_lib
from poad_jax.run import rundir
from poad_jax.run.metrics import read_metrics

# One xdist worker runs every test of this module (`--dist loadgroup`, scripts/test.sh): its module
# fixture, minutes of training or of subprocesses, is then set up once per suite, not once per worker.
pytestmark = pytest.mark.xdist_group("run_resume")

REPO = pathlib.Path(__file__).resolve().parents[1]
STEPS_PER_UPDATE = 16  # toy: 4 threads x 4 steps


def toy_config(updates: int):
    config = config_lib.load_config_file(REPO / "configs" / "toy.py")
    config.total_env_steps = STEPS_PER_UPDATE * updates
    config.tensorboard = False
    config.plot = False
    return config


def updates_logged(workdir: pathlib.Path) -> list[int]:
    return [r["update"] for r in read_metrics(workdir / "metrics.jsonl")]


@pytest.fixture(scope="module")
def started_run(tmp_path_factory) -> pathlib.Path:
    """A run of 4 updates interrupted after 2 (checkpoints 1 and 2)."""
    workdir = tmp_path_factory.mktemp("started") / "run"
    train.run(toy_config(4), workdir, show_progress=False, max_updates=2)
    assert checkpoint_lib.checkpoint_steps(workdir) == [1, 2]
    return workdir


def copy_of(run: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    target = tmp_path / "run"
    shutil.copytree(run, target)
    return target


# ---------------------------------------------------------------------------
# Identity.


@pytest.mark.parametrize(
    "field, value",
    [
        ("method", "ntpo"),
        ("env.kwargs.horizon", 3),
        ("model", "smollm2-135m-instruct"),
        ("lora.rank", 4),
        ("critic.kind", "lora"),
        ("num_threads", 2),
        ("seed", 1),
    ],
)
def test_a_rerun_that_changes_what_the_checkpoint_means_is_refused(started_run, tmp_path, capsys, field, value):
    workdir = copy_of(started_run, tmp_path)
    before = {p.name: p.read_bytes() for p in workdir.iterdir() if p.is_file()}
    config = toy_config(4)
    node = config
    *parents, leaf = field.split(".")
    for parent in parents:
        node = node[parent]
    node[leaf] = value
    assert cli.main(config, workdir, compilation_cache=False, show_progress=False) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and field in err[0], err
    assert "different configuration" in err[0] and "new --workdir" in err[0]
    after = {p.name: p.read_bytes() for p in workdir.iterdir() if p.is_file()}
    assert after == before  # config.json and the log untouched: nothing written before the check
    assert checkpoint_lib.checkpoint_steps(workdir) == [1, 2]


def test_safe_changes_resume_and_are_recorded(started_run, tmp_path):
    workdir = copy_of(started_run, tmp_path)
    config = toy_config(5)
    config.checkpoint_every = 2
    config.tensorboard = True
    result = train.run(config, workdir, show_progress=False)
    assert [r["update"] for r in result.records] == [1, 2, 3, 4, 5]
    stored = json.loads((workdir / rundir.CONFIG_FILE).read_text())
    assert stored["total_env_steps"] == 5 * STEPS_PER_UPDATE and stored["checkpoint_every"] == 2
    changes = [json.loads(line) for line in (workdir / rundir.CHANGES_FILE).read_text().splitlines()]
    assert changes[-1]["changes"] == {
        "total_env_steps": [4 * STEPS_PER_UPDATE, 5 * STEPS_PER_UPDATE],
        "checkpoint_every": [1, 2],
        "tensorboard": [False, True],
    }


def test_config_differences_classifies_fields():
    stored = {"method": "poad", "total_env_steps": 10, "ppo": {"actor_lr": 1e-6}, "mesh": {"data": 1}}
    new = {"method": "ntpo", "total_env_steps": 20, "ppo": {"actor_lr": 2e-6}, "mesh": {"data": 2}, "added": 1}
    refused, safe = rundir.config_differences(stored, new)
    assert refused == ["method", "ppo.actor_lr"]
    assert safe == {"total_env_steps": [10, 20], "mesh.data": [1, 2], "added": [None, 1]}
    # a setting the stored config predates stands at its default there: the default is no change, another
    # value one like any other
    assert rundir.config_differences(stored, {**stored, "learn": True}) == ([], {})
    assert rundir.config_differences(stored, {**stored, "learn": False})[0] == ["learn"]
    assert rundir.config_differences(stored, {**stored, "plot": False}) == ([], {"plot": [True, False]})


# ---------------------------------------------------------------------------
# The metric log agrees with the checkpoint.


def test_a_kill_before_the_first_checkpoint_logs_each_update_once(tmp_path):
    workdir = tmp_path / "run"
    config = toy_config(4)
    config.checkpoint_every = 10  # the first checkpoint is the final one
    train.run(config, workdir, show_progress=False, max_updates=2)  # as if killed after update 2
    assert updates_logged(workdir) == [1, 2] and not checkpoint_lib.checkpoint_steps(workdir)
    train.run(config, workdir, show_progress=False)
    assert updates_logged(workdir) == [1, 2, 3, 4]


def test_updates_after_the_last_checkpoint_are_logged_once(tmp_path):
    workdir = tmp_path / "run"
    config = toy_config(5)
    config.checkpoint_every = 2
    whole = train.run(toy_config(5), tmp_path / "whole", show_progress=False)
    train.run(config, workdir, show_progress=False, max_updates=3)  # checkpoint at 2, update 3 logged
    assert updates_logged(workdir) == [1, 2, 3] and checkpoint_lib.checkpoint_steps(workdir) == [2]
    train.run(config, workdir, show_progress=False)
    records = read_metrics(workdir / "metrics.jsonl")
    assert [r["update"] for r in records] == [1, 2, 3, 4, 5]
    assert [r["episode_return"] for r in records] == [r["episode_return"] for r in whole.records]


def test_a_deleted_metric_log_is_restored_from_the_checkpoint(started_run, tmp_path):
    workdir = copy_of(started_run, tmp_path)
    original = read_metrics(workdir / "metrics.jsonl")
    (workdir / "metrics.jsonl").unlink()
    train.run(toy_config(4), workdir, show_progress=False)
    records = read_metrics(workdir / "metrics.jsonl")
    assert [r["update"] for r in records] == [1, 2, 3, 4]
    assert records[:2] == original


def test_update_and_env_steps_are_integers(started_run):
    for line in (started_run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        assert type(record["update"]) is int and type(record["env_steps"]) is int
        assert type(record["episodes"]) is int


# ---------------------------------------------------------------------------
# Damage.


def _truncate_largest_array(step_dir: pathlib.Path) -> None:
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and "/d/" in str(p)]
    largest = max(files, key=lambda p: p.stat().st_size)
    largest.write_bytes(largest.read_bytes()[: largest.stat().st_size // 3])


@pytest.mark.parametrize("damage", ["truncated-array", "no-meta", "no-state"])
def test_a_damaged_latest_checkpoint_falls_back_with_one_warning(started_run, tmp_path, capsys, damage):
    workdir = copy_of(started_run, tmp_path)
    latest = workdir / "checkpoints" / "2"
    if damage == "truncated-array":
        _truncate_largest_array(latest)
    else:
        shutil.rmtree(latest / damage.removeprefix("no-"))
    capsys.readouterr()
    result = train.run(toy_config(4), workdir, show_progress=False)
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(warnings) == 1 and warnings[0].startswith("warning: checkpoint 2 is damaged"), warnings
    assert [r["update"] for r in result.records] == [1, 2, 3, 4]
    assert updates_logged(workdir) == [1, 2, 3, 4]
    assert (workdir / checkpoint_lib.DAMAGED_DIR / "2").is_dir()
    assert checkpoint_lib.checkpoint_steps(workdir)[-1] == 4


def test_no_intact_checkpoint_is_one_line(started_run, tmp_path, capsys):
    workdir = copy_of(started_run, tmp_path)
    for step in (1, 2):
        shutil.rmtree(workdir / "checkpoints" / str(step) / "meta")
    assert cli.main(toy_config(4), workdir, compilation_cache=False, show_progress=False) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines[-1].startswith("error: no intact checkpoint in") and len(lines) == 3  # two warnings, one error


def test_export_reads_past_a_damaged_checkpoint_without_moving_it(started_run, tmp_path):
    workdir = copy_of(started_run, tmp_path)
    shutil.rmtree(workdir / "checkpoints" / "2" / "meta")
    assert export.main(["--workdir", str(workdir), "--out", str(tmp_path / "adapter")]) == 0
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()
    assert (workdir / "checkpoints" / "2").is_dir()  # export only reads


# ---------------------------------------------------------------------------
# Finished.


def test_finished_marker(started_run, tmp_path):
    workdir = copy_of(started_run, tmp_path)
    assert not (workdir / rundir.FINISHED_FILE).exists()  # stopped after 2 of 4 updates
    result = train.run(toy_config(4), workdir, show_progress=False)
    assert result.finished
    marker = json.loads((workdir / rundir.FINISHED_FILE).read_text())
    assert marker["update"] == 4 and marker["env_steps"] == marker["total_env_steps"] == 4 * STEPS_PER_UPDATE
    assert result.records[-1]["env_steps"] >= marker["total_env_steps"]
    # Extending a finished run removes the marker until the new total is reached.
    train.run(toy_config(5), workdir, show_progress=False, max_updates=0)
    assert not (workdir / rundir.FINISHED_FILE).exists()
    # A re-run of a finished run trains nothing and keeps its history.
    again = train.run(toy_config(5), workdir, show_progress=False)
    assert [r["update"] for r in again.records] == [1, 2, 3, 4, 5] and again.finished


def test_cli_after_a_truncated_array_prints_one_warning_and_no_traceback(started_run, tmp_path):
    """The abandoned reads of the damaged checkpoint must not print tracebacks later in the run."""
    import subprocess
    import sys

    workdir = copy_of(started_run, tmp_path)
    _truncate_largest_array(workdir / "checkpoints" / "2")
    result = subprocess.run(
        [sys.executable, "-m", "poad_jax.train", "--config=configs/toy.py", f"--workdir={workdir}",
         f"--config.total_env_steps={4 * STEPS_PER_UPDATE}", "--config.tensorboard=False", "--config.plot=False"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stderr.replace("\r", "\n").splitlines()
             if line.strip() and not line.startswith("poad toy/")]  # the progress bar
    assert len(lines) == 1 and lines[0].startswith("warning: checkpoint 2 is damaged"), lines[:20]
    assert updates_logged(workdir) == [1, 2, 3, 4]


def test_reads_a_damaged_checkpoint_abandons_stay_quiet_whenever_they_finish(tmp_path, monkeypatch):
    """The race behind the CLI test above, made deterministic: the reads that Orbax's failed
    restore abandons finish only after the failure (as on a loaded machine), so each one
    delivers its result to a closed event loop before the trainer has even seen the failure."""
    import gc
    import sys

    import jax.numpy as jnp
    import tensorstore as ts
    from orbax.checkpoint._src.serialization import serialization

    state = {"big": jnp.arange(4096, dtype=jnp.float32).reshape(64, 64),  # in the data file
             **{f"small{i}": jnp.full((2,), i, jnp.float32) for i in range(8)}}  # inlined in the index
    checkpointer = checkpoint_lib.RunCheckpointer(tmp_path)
    for step in (1, 2):
        checkpointer.save(step, state, {"update": step})
    checkpointer.close()
    _truncate_largest_array(tmp_path / "checkpoints" / "2")

    in_flight, holding = [], [True]  # only the first restore (of the damaged step) is held
    real_read = serialization._read_shard

    async def read_that_finishes_late(*args, **kwargs):
        shard = await real_read(*args, **kwargs)
        if holding:
            promise, finished = ts.Promise.new()
            in_flight.append(promise)
            await finished
        return shard

    checkpointer = checkpoint_lib.RunCheckpointer(tmp_path)
    real_restore = checkpointer.restore

    def restore_whose_reads_finish_after_it_failed(*args, **kwargs):
        try:
            return real_restore(*args, **kwargs)
        except Exception:
            holding.clear()
            assert in_flight, "no read was in flight when the restore failed"
            for promise in in_flight:
                promise.set_result(None)
            raise

    reports = []
    monkeypatch.setattr(sys, "unraisablehook", reports.append)
    monkeypatch.setattr(serialization, "_read_shard", read_that_finishes_late)
    monkeypatch.setattr(checkpointer, "restore", restore_whose_reads_finish_after_it_failed)
    warnings = []
    _, meta, step = checkpointer.restore_newest_intact(state, warn=warnings.append)
    checkpointer.close()
    gc.collect()  # the abandoned reads' coroutines, closed now rather than in a later test
    assert step == 1 and meta["update"] == 1
    assert len(warnings) == 1 and warnings[0].startswith("warning: checkpoint 2 is damaged"), warnings
    assert [f"{r.exc_type.__name__}: {r.exc_value}" for r in reports] == []
