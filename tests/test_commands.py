"""The commands as a newcomer first meets them: `--help` on every entry point, a benchmark's missing config
file, Ctrl-C at start-up and as the run ends, the summary's continue command, a tiny-random model that cannot
read an environment's actions, a preset's curve panels and the export's base model."""

from __future__ import annotations

import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

from envs_py import Observation, StepResult, register
from poad_jax.run import cli, entry, train
from poad_jax.run import config as config_lib
from poad_jax.run.train import RunResult

pytestmark = pytest.mark.long  # the suite's second tier (scripts/test.sh --long)

REPO = pathlib.Path(__file__).resolve().parents[1]

# Each entry point, a flag its help must name, and what its example runs.
ENTRY_POINTS = {
    "train": ("--config=FILE", "python -m poad_jax.train --config=configs/toy.py"),
    "evaluate": ("--episodes", "python -m poad_jax.evaluate --workdir="),
    "export": ("--base-model", "python -m poad_jax.export --workdir="),
    "study": ("--workers", "python -m poad_jax.study --study=studies/gamma_w.py"),
    "best_program": ("--workdir", "python -m poad_jax.best_program --workdir="),
    "bench": ("backups", "python -m poad_jax.bench backups"),
}


def interruptible() -> None:
    """In the child: SIGINT back to its default (a background test runner ignores it, and children inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_every_entry_point_says_what_it_does_its_flags_and_an_example(name, tmp_path):
    flag, example = ENTRY_POINTS[name]
    done = subprocess.run([sys.executable, "-m", f"poad_jax.{name}", "--help"], cwd=tmp_path,  # not the checkout
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(f"usage: python -m poad_jax.{name} "), done.stdout[:200]
    assert flag in done.stdout and "example" in done.stdout and example in done.stdout
    assert "Traceback" not in done.stderr and "error" not in done.stderr


def test_the_package_lists_every_entry_point_and_runs_one_by_name(tmp_path):
    """`python -m poad_jax` lists the commands (every entry point here, none without a module, each with its
    README example); `python -m poad_jax study --help` is the study command's help; an unknown name is one
    line naming the commands, exit status 2."""
    from poad_jax import __main__ as package_main

    assert [name for name, _, _ in package_main.COMMANDS] == list(ENTRY_POINTS)
    readme = (REPO / "README.md").read_text()
    listed = subprocess.run([sys.executable, "-m", "poad_jax"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=60)
    assert listed.returncode == 0 and listed.stdout.startswith("usage: python -m poad_jax <command>"), listed.stderr
    for name, what, example in package_main.COMMANDS:
        assert (REPO / "poad_jax" / f"{name}.py").is_file() or (REPO / "poad_jax" / name / "__main__.py").is_file()
        assert re.search(rf"^  {name} +{re.escape(what)}$", listed.stdout, re.M) and example in listed.stdout
        assert f"| `{name}` | {what.replace('--config.<field>=', '`--config.<field>=`')} |" in readme, name
    dispatched = subprocess.run([sys.executable, "-m", "poad_jax", "study", "--help"], cwd=tmp_path,
                                capture_output=True, text=True, timeout=300)
    assert dispatched.returncode == 0 and dispatched.stdout.startswith("usage: python -m poad_jax.study ")
    unknown = subprocess.run([sys.executable, "-m", "poad_jax", "trian"], cwd=tmp_path, capture_output=True,
                             text=True, timeout=60)
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1 and "train, evaluate" in unknown.stderr
    assert "Traceback" not in unknown.stderr


@pytest.mark.parametrize("bench", ["backups", "e2e"])  # an argparse benchmark and an absl one
def test_each_benchmark_has_help_too(bench):
    done = subprocess.run([sys.executable, "-m", "poad_jax.bench", bench, "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.startswith(f"usage: python -m poad_jax.bench {bench}"), done.stderr
    assert "--" in done.stdout and "Traceback" not in done.stderr


@pytest.mark.parametrize("bench", ["e2e", "logprob_gap"])  # the absl benchmarks, which take a --config file
def test_a_benchmark_given_a_missing_config_file_says_so_in_one_line(bench, tmp_path):
    missing = tmp_path / "no_such_config.py"
    done = subprocess.run([sys.executable, "-m", "poad_jax.bench", bench, f"--config={missing}"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and str(missing) in done.stderr and done.stderr.startswith("error: ")


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # preexec_fn forks; it only resets SIGINT, then execs
@pytest.mark.parametrize("after_s", [1.0, 4.0])  # while the libraries import; while the run starts
def test_ctrl_c_during_start_up_is_one_line(after_s, tmp_path):
    workdir = tmp_path / "run"
    process = subprocess.Popen([sys.executable, "-m", "poad_jax.train", "--config=configs/toy.py",
                                f"--workdir={workdir}"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, preexec_fn=interruptible)
    time.sleep(after_s)
    assert process.poll() is None, "the run ended before it could be interrupted"
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    lines = [line for line in stderr.replace("\r", "\n").splitlines() if line.strip()]
    assert process.returncode == cli.EXIT_INTERRUPTED, stderr[-2000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert lines[-1].startswith("interrupted"), lines


# A Ctrl-C whose handler runs inside a garbage-collection callback (JAX registers one): the KeyboardInterrupt
# cannot propagate from there.  Prints whether the code after the collection saw it.
CTRL_C_INSIDE_A_GC_CALLBACK = """
import gc, signal, sys, time
from poad_jax.run import entry
if sys.argv[1] == "redelivered":
    entry.restore_ctrl_c(entry.leave_at_once_on_ctrl_c())
def ctrl_c_inside(phase, info):
    if phase == "start":
        gc.callbacks.remove(ctrl_c_inside)
        signal.raise_signal(signal.SIGINT)
gc.callbacks.append(ctrl_c_inside)
try:
    gc.collect()
    time.sleep(3)
    print("lost")
except KeyboardInterrupt:
    print("delivered")
"""


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")
@pytest.mark.parametrize("handling, expected", [("python", "lost"), ("redelivered", "delivered")])
def test_a_ctrl_c_that_lands_in_a_gc_callback_is_delivered_again(handling, expected):
    """Python alone loses it (what made a Ctrl-C during the toy run's first compilations end in status 0 on
    a fast machine); the commands' handling (`entry.restore_ctrl_c`) delivers it again once outside."""
    done = subprocess.run([sys.executable, "-c", CTRL_C_INSIDE_A_GC_CALLBACK, handling], cwd=REPO,
                          capture_output=True, text=True, timeout=60, preexec_fn=interruptible)
    assert done.stdout.split() == [expected], done.stderr[-2000:]
    assert ("Exception ignored" in done.stderr) == (handling == "python"), done.stderr[-2000:]


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")
@pytest.mark.parametrize("name", ["evaluate", "export"])  # `study` and `best_program` load JAX only once running
def test_ctrl_c_while_another_command_loads_is_one_line(name):
    """The other commands start as `train` does (`poad_jax.run.entry`): a Ctrl-C while JAX loads leaves at
    once with one line and status 130.  The signal goes early, while the libraries still import; a command
    that was already done (a fast machine) is tried again with an earlier signal."""
    for after_s in (0.6, 0.3, 0.15):
        process = subprocess.Popen([sys.executable, "-m", f"poad_jax.{name}", "--help"], cwd=REPO,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   preexec_fn=interruptible)
        time.sleep(after_s)
        if process.poll() is None:
            break
        process.communicate()
    else:
        pytest.fail(f"{name} --help ended within 0.15 s, before it could be interrupted")
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == cli.EXIT_INTERRUPTED, stderr[-2000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr and not stdout
    assert [line for line in stderr.splitlines() if line.strip()] == [entry.INTERRUPTED_WHILE_STARTING]


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")
def test_ctrl_c_as_the_run_ends_is_one_line(tmp_path):
    """Interrupted while the summary prints or the interpreter exits (Orbax's threads are joined then)."""
    workdir = tmp_path / "run"
    process = subprocess.Popen([sys.executable, "-m", "poad_jax.train", "--config=configs/toy.py",
                                f"--workdir={workdir}", "--config.total_env_steps=16", "--config.plot=False"],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=interruptible)
    for line in process.stdout:
        if line.startswith("1 PPO updates over 16 env steps") or line.startswith("run directory:"):
            process.send_signal(signal.SIGINT)
            break
    stdout, stderr = process.communicate(timeout=120)
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-2000:]
    if process.returncode == cli.EXIT_INTERRUPTED:  # the signal landed before the process was gone
        last = [line for line in stderr.splitlines() if line.strip()][-1]
        assert last == f"interrupted after the run ended; {workdir} holds all of it"
    else:
        assert process.returncode == 0
    assert (workdir / "finished.json").exists()


def test_the_continue_command_counts_from_the_env_steps_run(tmp_path):
    """A run resumed with a smaller total than it had reached (asked 320, at 640) continues to twice what
    it ran, never to where it already is."""
    config = config_lib.load_config_file(REPO / "configs" / "toy.py")
    config.total_env_steps = 320
    result = RunResult(tmp_path, [{"update": 40, "env_steps": 640}], None, finished=True)
    lines = cli.continue_lines(config, result, ["train.py", "--config=configs/toy.py"])
    assert lines[0] == "to continue training (it resumes from update 40, up to 1280 env steps):"
    assert lines[1].endswith("--config.total_env_steps=1280")
    stopped = RunResult(tmp_path, [{"update": 4, "env_steps": 64}], None, finished=False)
    assert "up to 320 env steps" in cli.continue_lines(config, stopped, ["train.py"])[0]


class YesNo:
    """One step: "yes" pays 1 (the issue's environment: its action words are outside tiny-random's vocabulary)."""

    def __init__(self, actions=("yes", "no")):
        self.actions = tuple(actions)

    def reset(self, seed=None):
        return Observation("you are in a hall . your next step is to", self.actions)

    def step(self, action):
        reward = float(action == "yes")
        return StepResult(self.reset(), reward, True, {"success": reward > 0})


register("test/yes_no", f"{__name__}:YesNo", "Answer yes.")


def test_tiny_random_warns_in_one_line_when_it_cannot_read_the_actions(tmp_path, capsys):
    config = config_lib.load_config_file(REPO / "configs" / "toy.py")
    config.env.name, config.env.kwargs = "test/yes_no", {}
    config.total_env_steps, config.tensorboard, config.plot = 16, False, False
    train.run(config, tmp_path / "run", show_progress=False)
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1
    assert "lacks 2 word(s) of this environment's actions ('yes', 'no')" in warnings[0]
    assert "actions 'yes', 'no' look the same to the model" in warnings[0]
    config.env.kwargs = {"actions": ("turn on", "turn off")}  # words it knows: no warning
    train.run(config, tmp_path / "known", show_progress=False)
    assert "warning:" not in capsys.readouterr().err


def test_every_curve_panel_title_fits_its_panel(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from poad_jax.run import metrics

    records = [{"update": 1, "env_steps": 16, **{key: 0.5 for key, _ in metrics.CURVES}}]
    captured = {}
    real_close = plt.close

    def keep(fig):  # look at the figure plot_curves drew before it is closed
        captured["fig"] = fig

    plt.close = keep
    try:
        metrics.plot_curves(records, tmp_path / "curves.png")
    finally:
        plt.close = real_close
    fig = captured["fig"]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    width = fig.bbox.width
    for ax in fig.axes:
        box = ax.title.get_window_extent(renderer)
        assert box.x0 >= 0 and box.x1 <= width, ax.get_title()
        neighbours = [other for other in fig.axes if other is not ax
                      and abs(other.get_position().y0 - ax.get_position().y0) < 1e-6]
        for other in neighbours:  # no title runs into the panel beside it
            theirs = other.title.get_window_extent(renderer)
            assert box.x1 <= theirs.x0 or theirs.x1 <= box.x0, (ax.get_title(), other.get_title())
    real_close(fig)


def test_an_exported_adapter_names_the_embedded_models_directory_not_its_name(monkeypatch, tmp_path):
    from poad_jax.tools import export

    monkeypatch.setattr(export, "embedded_model_directory", lambda name: tmp_path / "cache" / name)
    assert export.peft_base_model("smollm2-135m-instruct", tmp_path) == (
        str(tmp_path / "cache" / "smollm2-135m-instruct"), None)
    (tmp_path / "my-model").mkdir()
    monkeypatch.chdir(tmp_path)
    assert export.peft_base_model("my-model", tmp_path / "runs" / "r") == (str(tmp_path / "my-model"), None)
    name, note = export.peft_base_model("tiny-random", tmp_path)
    assert name == "tiny-random" and "no Hugging Face form" in note
