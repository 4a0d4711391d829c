"""Every ordinary mistake of the new-user probe (issue 19) ends in one line and exit 2.

Each case runs the command's own entry point (`train_cli.main`, `export.main`,
`evaluate.main`, or the CLI in a subprocess where the mistake is in the
command line itself) and checks: exit status 2, exactly one non-empty
stderr line starting with `error:`, the words that tell the user what to
fix, no traceback, and no run directory left behind.
"""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys
import time

import pytest

from poad_jax.run import checkpoint as checkpoint_lib
from poad_jax.tools import evaluate, export
from poad_jax.run import train
from poad_jax.run import cli as train_cli
from poad_jax.run import config as config_lib
from poad_jax.run import rundir

REPO = pathlib.Path(__file__).resolve().parents[1]


def toy_config(updates: int = 2):
    config = config_lib.load_config_file(REPO / "configs" / "toy.py")
    config.total_env_steps = config.num_threads * config.rollout_length * updates
    config.tensorboard = False
    config.plot = False
    return config


def set_field(config, dotted: str, value) -> None:
    node = config
    *parents, leaf = dotted.split(".")
    for parent in parents:
        node = node[parent]
    node[leaf] = value


def the_error_line(stderr: str) -> str:
    """The single non-empty stderr line (fails if there are more, or a traceback)."""
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr[-3000:]
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def run_main(capsys, config, workdir) -> str:
    """`train_cli.main` must return 2 with one error line; returns the line."""
    capsys.readouterr()
    assert train_cli.main(config, workdir, compilation_cache=False, show_progress=False) == 2
    return the_error_line(capsys.readouterr().err)


def cli(*args: str, env=None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "poad_jax.train", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=env)


# ---------------------------------------------------------------------------
# Command-line mistakes (the CLI parses them: subprocesses).


@pytest.mark.long
@pytest.mark.parametrize(
    "args, words",
    [
        (["--config=configs/no_such_config.py"], ["no config file at configs/no_such_config.py"]),
        (["--config=configs/toy.py", "--config.ppo.actor_lrr=1"],
         ["unknown config field ppo.actor_lrr", "did you mean ppo.actor_lr?"]),
        (["--config=configs/toy.py", "--config.envv.name=x"], ["unknown config field envv.name", "did you mean env?"]),
        (["--config=configs/toy.py", "--config.ppo.actor_lr=abc"], ["--config.ppo.actor_lr=abc", "float"]),
        ([], ["--config is required"]),
        (["--config=configs/toy.py:poad"], ["configs/toy.py takes no :argument", "use --config=configs/toy.py"]),
    ],
    ids=["missing-config-file", "misspelled-field", "misspelled-parent", "bad-value", "no-config",
         "argument-to-a-file-without-one"],
)
def test_command_line_mistakes_are_one_line(tmp_path, args, words):
    result = cli(*args, f"--workdir={tmp_path / 'w'}")
    assert result.returncode == 2, result.stderr[-2000:]
    line = the_error_line(result.stderr)
    for word in words:
        assert word in line, line
    assert not (tmp_path / "w").exists()


# ---------------------------------------------------------------------------
# Values that were accepted silently or crashed later.


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("sampling.max_new_tokens", 0, "sampling.max_new_tokens must be >= 1"),
        ("lora.rank", 0, "lora.rank must be >= 1"),
        ("ppo.clip_eps", 0.0, "ppo.clip_eps must be > 0"),
        ("ppo.clip_eps", -0.2, "ppo.clip_eps must be > 0"),
        ("ppo.epochs", 0, "ppo.epochs must be >= 1"),
        ("ppo.actor_lr", -1e-6, "ppo.actor_lr must be >= 0"),
        ("ppo.critic_lr", -1e-6, "ppo.critic_lr must be >= 0"),
        ("keep_checkpoints", 0, "keep_checkpoints must be >= 1"),
        ("checkpoint_every", 0, "checkpoint_every must be >= 1"),
        ("sampling.top_p", 0.0, "sampling.top_p must be in (0, 1]"),
        ("env.vector_mode", "fork", "env.vector_mode must be"),
    ],
)
def test_bad_values_are_refused_before_anything_is_written(capsys, tmp_path, field, value, words):
    config = toy_config()
    set_field(config, field, value)
    assert words in run_main(capsys, config, tmp_path / "w")
    assert not (tmp_path / "w").exists()


def test_unknown_model_names_every_choice(capsys, tmp_path):
    config = toy_config()
    config.model = "smollm3"
    line = run_main(capsys, config, tmp_path / "w")
    assert "smollm3" in line and "tiny-random" in line and "smollm2-135m-instruct" in line
    assert not (tmp_path / "w").exists()


# ---------------------------------------------------------------------------
# Places: the run directory, the cache, data files, export's output.


def test_workdir_naming_a_file(capsys, tmp_path):
    target = tmp_path / "a_file"
    target.write_text("mine")
    assert "is a file, not a directory" in run_main(capsys, toy_config(), target)
    assert target.read_text() == "mine"
    assert "is a file" in run_main(capsys, toy_config(), target / "run")


def test_workdir_in_an_unwritable_place(capsys):
    line = run_main(capsys, toy_config(), pathlib.Path("/proc/poad_jax_run"))
    assert "cannot use --workdir /proc/poad_jax_run: /proc is not writable" in line


@pytest.mark.parametrize("where", ["file", "impossible"])
def test_unusable_poad_cache(capsys, tmp_path, monkeypatch, where):
    if where == "file":
        cache = tmp_path / "cache_file"
        cache.write_text("")
    else:
        cache = pathlib.Path("/proc/poad_jax_cache")
    monkeypatch.setenv("POAD_CACHE", str(cache))
    line = run_main(capsys, toy_config(), tmp_path / "w")
    assert f"POAD_CACHE={cache} is not a writable directory" in line
    assert not (tmp_path / "w").exists()


def test_missing_kaggle_csv(capsys, tmp_path):
    config = toy_config()
    config.env.name = "datasci/pharyngitis"
    config.env.kwargs = {"data_dir": str(tmp_path / "data")}
    line = run_main(capsys, config, tmp_path / "w")
    assert "cannot build environment 'datasci/pharyngitis'" in line and "pharyngitis.csv" in line
    assert not (tmp_path / "w").exists()  # a failed start leaves no directory


def test_twosome_on_free_form_actions(capsys, tmp_path):
    """TWOSOME scores offered actions; DataSciCoding offers none (its actions are programs)."""
    config = toy_config()
    config.method = "twosome"
    config.env.name, config.env.kwargs = "datasci/sklearn_wine", {}
    line = run_main(capsys, config, tmp_path / "w")
    assert "TWOSOME chooses among the actions an environment offers" in line and "poad or ntpo" in line
    assert not (tmp_path / "w").exists()


def test_export_out_naming_a_file_and_missing_runs(capsys, tmp_path):
    out = tmp_path / "adapter_file"
    out.write_text("keep me")
    assert export.main(["--workdir", str(tmp_path / "no_run"), "--out", str(out)]) == 2
    assert "is a file" in the_error_line(capsys.readouterr().err)
    assert out.read_text() == "keep me"
    assert export.main(["--workdir", str(tmp_path / "no_run"), "--out", str(tmp_path / "a")]) == 2
    assert "no run directory at" in the_error_line(capsys.readouterr().err)
    assert export.main(["--workdir", str(out), "--out", str(tmp_path / "a")]) == 2
    assert f"{out} is a file, not a run directory" in the_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("command", ["export --workdir=w --out=o", "evaluate --workdir=w", "best_program --workdir=w",
                                     "study --study=s.py", "bench backups", "study"])
def test_an_unknown_flag_is_one_line(command):
    """argparse's own mistakes (an unknown flag; a required one missing) end as ours do: one `error:` line
    naming --help, status 2."""
    name, *args = command.split()
    result = subprocess.run([sys.executable, "-m", f"poad_jax.{name}", *args, "--no-such-flag=1"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    line = the_error_line(result.stderr)
    assert ("--study" if command == "study" else "--no-such-flag") in line and "--help` lists the flags" in line


def test_evaluate_that_finishes_no_episode(capsys, tmp_path):
    workdir = tmp_path / "run"
    train.run(toy_config(1), workdir, show_progress=False)
    capsys.readouterr()
    # Toy episodes last 2 steps: one step per thread finishes none.
    assert evaluate.main(["--workdir", str(workdir), "--episodes", "2", "--max-steps", "1", "--mode", "greedy"]) == 2
    captured = capsys.readouterr()
    assert "nan" not in captured.out.lower()
    assert "no episode finished within --max-steps 1" in the_error_line(captured.err)


# ---------------------------------------------------------------------------
# Ctrl-C.


def interruptible() -> None:
    """In the child before exec: SIGINT back to its default disposition. A test
    runner started in the background (`cmd &` in a script, pytest-xdist workers
    under it) ignores SIGINT, children inherit that, and Python then installs
    no KeyboardInterrupt handler: Ctrl-C could not be tested at all."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.long
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # preexec_fn forks; it only resets SIGINT, then execs
def test_ctrl_c_is_one_line_leaves_no_temporary_directory_and_resumes(tmp_path):
    workdir = tmp_path / "interrupted"
    common = ["--config=configs/toy.py", f"--workdir={workdir}", "--config.tensorboard=False", "--config.plot=False"]
    args = common + [f"--config.total_env_steps={16 * 100_000}"]  # far more than the test waits for
    process = subprocess.Popen([sys.executable, "-m", "poad_jax.train", *args], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=interruptible)
    deadline = time.time() + 240
    while time.time() < deadline and not checkpoint_lib.checkpoint_steps(workdir):
        if process.poll() is not None:
            pytest.fail("training ended before it could be interrupted")
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == train_cli.EXIT_INTERRUPTED
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    last = [line for line in stderr.replace("\r", "\n").splitlines() if line.strip()][-1]
    assert last.startswith("interrupted: ") and "re-run the same command" in last
    leftovers = [p.name for p in (workdir / "checkpoints").iterdir() if checkpoint_lib.TMP_MARKER in p.name]
    assert leftovers == []
    # Resume, and end one update later (total_env_steps may change on resume).
    done = checkpoint_lib.checkpoint_steps(workdir)[-1]
    resumed = cli(*common, f"--config.total_env_steps={16 * (done + 1)}", timeout=300)
    assert resumed.returncode == 0 and f"resuming {workdir} from update {done}" in resumed.stdout, resumed.stderr[-2000:]
    assert (workdir / rundir.FINISHED_FILE).exists()


def test_ctrl_c_during_a_save_is_raised_once_the_step_is_committed(tmp_path, monkeypatch):
    """The race behind the test above, made deterministic: Ctrl-C lands while Orbax's writers
    are still at work on a step.  Raised there, it would leave them writing into the step's
    temporary directory while the trainer removes it; held, it is raised once the step is
    committed, with nothing left in flight."""
    import os

    import jax.numpy as jnp

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # even under a background runner
    checkpointer = checkpoint_lib.RunCheckpointer(tmp_path)
    real_save = checkpointer.manager.save

    def save_interrupted_midway(*args, **kwargs):
        started = real_save(*args, **kwargs)  # the step's writers now run in the background
        os.kill(os.getpid(), signal.SIGINT)
        return started

    monkeypatch.setattr(checkpointer.manager, "save", save_interrupted_midway)
    seen = {}
    try:
        with pytest.raises(KeyboardInterrupt):
            try:
                checkpointer.save(1, {"w": jnp.ones((64, 64))}, {"update": 1})
            finally:  # what the trainer finds when the interrupt reaches it
                seen["steps"] = checkpoint_lib.checkpoint_steps(tmp_path)
                seen["temporary"] = [p.name for p in (tmp_path / "checkpoints").iterdir()
                                     if checkpoint_lib.TMP_MARKER in p.name]
        seen["handler"] = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)
        checkpointer.close()
    assert seen == {"steps": [1], "temporary": [], "handler": signal.default_int_handler}


def test_unfinished_saves_are_removed_when_a_run_opens(tmp_path):
    """An Orbax temporary directory (a save cut short by a kill) is removed on the next start."""
    workdir = tmp_path / "run"
    train.run(toy_config(1), workdir, show_progress=False)
    stale = workdir / "checkpoints" / f"2{checkpoint_lib.TMP_MARKER}-123"
    stale.mkdir()
    (stale / "junk").write_text("x")
    train.run(toy_config(2), workdir, show_progress=False)
    assert not stale.exists()
    assert checkpoint_lib.checkpoint_steps(workdir)[-1] == 2


def test_cli_interrupted_line_names_the_update(tmp_path):
    assert "starts the run again" in train_cli.interrupted_line(tmp_path)
    (tmp_path / "checkpoints" / "7").mkdir(parents=True)
    assert "resumes from update 7" in train_cli.interrupted_line(tmp_path)

