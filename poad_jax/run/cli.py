"""`python -m poad_jax.train --config=configs/datasci.py [--workdir=W] [--config.x=y ...]`

Trains POAD, NTPO, TWOSOME, GRPO or GiGPO (`poad_jax.run.train.run`).  Re-running the same
command with the same `--workdir` resumes from the latest checkpoint; see
`poad_jax.run.train` for what the run writes and `poad_jax.run.rundir` for
what a re-run may change.

This module is the command around it: the command line (absl flags and
`ml_collections` config files, with one line for any mistake), the exit
statuses (0; 2 for a user mistake, printed as one line on stderr; 3 for a run
that stopped on a misbehaving environment or non-finite numbers, with what it
keeps; 130 for Ctrl-C), and the end-of-run summary with the command that continues the run.
"""

from __future__ import annotations

import logging
import os
import pathlib
import shlex
import signal
import sys
import textwrap
import traceback
from typing import Any

import jax
import ml_collections
from absl import flags
from absl import logging as absl_logging
from ml_collections import config_flags

import envs_py
from poad_jax.agent.methods import UnknownMethodError
from poad_jax.agent.rollout import FreeFormActionsError, GroupResetError
from poad_jax.parallel import hosts
from poad_jax.run import best_program as best_lib
from poad_jax.run import checkpoint as checkpoint_lib
from poad_jax.run import config as config_lib
from poad_jax.run import metrics as run_logging
from poad_jax.run.config import load_config_file, one_line, split_config_argument
from poad_jax.run.entry import EXIT_INTERRUPTED, restore_ctrl_c
from poad_jax.run.rundir import check_cache_dir, default_workdir
from poad_jax.run.train import NonFiniteUpdatesError, RunResult, TrainError, reward_remedies, run


def advice_lines(config: config_lib.Run, episodes: dict[str, Any],
                 records: list[dict[str, Any]] | None = None) -> list[str]:
    """What to try when a run that learns achieved nothing (no step or episode succeeded); when its losses
    were not finite, that first (more steps or a larger rate would not help)."""
    if records and not run_logging.losses_were_finite(records):
        return ["why: some losses or gradients were not finite (those minibatch steps changed nothing); "
                "check the reward scale, a smaller learning rate (ppo.actor_lr, ppo.critic_lr) or "
                "float32 matmuls (--config.matmul_dtype=float32)."]
    steps, ok = int(episodes.get("steps", 0)), int(episodes.get("succeeded_steps", 0))
    if not config.learn or not steps or ok or any(episodes.get("finished_success", [])):
        return []
    if config.env.name.startswith("datasci/"):
        if "smollm2" in config.model.lower():
            return [f"why: SmolLM2-135M rarely writes runnable scikit-learn code (0 of {steps} here); "
                    "the default configs/datasci.py uses a code model (Qwen2.5-Coder-0.5B: about 3 in 4 "
                    "programs run before training)."]
        return ["try: read the failures above; more sampling.max_new_tokens if programs are cut off, "
                "or a longer run (--config.total_env_steps)."]
    if records and all(record.get("groups_with_signal") == 0 for record in records):
        return [f"why: in none of the {len(records)} updates did an episode group have trajectories whose returns "
                f"differ, so every advantage was 0 and the policy loss had no gradient (a larger learning rate "
                f"would not help); try {reward_remedies(config)}."]
    return ["try: a longer run (--config.total_env_steps) or a larger learning rate (ppo.actor_lr)."]


def cut_off_lines(config: config_lib.Run, records: list[dict[str, Any]]) -> list[str]:
    """How many actions (programs) the token limit cut off, when any was (older records lack the count)."""
    cut = sum(int(record.get("actions_cut_off") or 0) for record in records)
    if not cut:
        return []
    return [f"{cut} of {records[-1]['env_steps']} programs were cut off by sampling.max_new_tokens "
            f"({config.sampling.max_new_tokens} tokens)."]


RESUME_OPTIONS = ("--workdir", "--config.total_env_steps")  # what `continue_command` sets itself

def continue_command(argv: list[str], workdir: pathlib.Path, total_env_steps: int) -> str:
    """The command line `argv` (the one that ran) with this run directory and `total_env_steps`:
    the command that trains the same run further (it resumes from the last checkpoint)."""
    kept, skip_value = [], False
    for arg in argv[1:]:
        if skip_value:
            skip_value = False
        elif arg.split("=", 1)[0] in RESUME_OPTIONS:
            skip_value = "=" not in arg  # `--workdir W`: its value is the next argument
        else:
            kept.append(arg)
    python = sys.executable or "python"
    relative = os.path.relpath(python)
    python = python if relative.startswith("..") else relative  # `.venv/bin/python` when run from its checkout
    return shlex.join([python, "-m", "poad_jax.train", *kept, f"--workdir={workdir}",
                       f"--config.total_env_steps={total_env_steps}"])


def continue_lines(config: config_lib.Run, result: RunResult, argv: list[str] | None = None) -> list[str]:
    """How to go on: a finished run trains further with more env steps (twice the env steps it has
    run: a run resumed with a smaller total may already be past it), a run stopped early resumes; shown as
    the full command when `argv` (the command that ran) is known."""
    if not result.records:
        return []
    ran = int(result.records[-1].get("env_steps") or 0)
    more = 2 * ran if result.finished else config.total_env_steps
    what = "to continue training" if result.finished else "to finish the run"
    update = result.records[-1]["update"]
    if argv is None:
        return [f"{what}: re-run with --workdir={result.workdir} --config.total_env_steps={more} "
                f"(it resumes from update {update})."]
    return [f"{what} (it resumes from update {update}, up to {more} env steps):",
            f"  {continue_command(argv, result.workdir, more)}"]


def summary_text(config: config_lib.Run, result: RunResult, argv: list[str] | None = None) -> str:
    """The end-of-run summary: the metric table, what the run achieved in words, the best program,
    what to try if nothing succeeded, and how to continue (`continue_lines`)."""
    datasci = config.env.name.startswith("datasci/") or result.best is not None  # an env with programs
    unit = ("programs", "ran", "AUC") if datasci else ("steps", "succeeded", "reward")
    lines = [run_logging.summary_table(result.records), ""]
    lines += run_logging.run_summary_lines(result.records, result.episodes, config.total_env_steps, *unit,
                                           learned=config.learn)
    if datasci:
        lines += cut_off_lines(config, result.records)
        lines += best_lib.summary_lines(result.best, result.workdir)
    lines += advice_lines(config, result.episodes, result.records)
    lines += continue_lines(config, result, argv)
    return "\n".join(lines)


def enable_compilation_cache(cache_root: pathlib.Path | None = None) -> None:
    """Persists XLA compilations across runs (a resumed or repeated run skips
    most compile time).  `$JAX_COMPILATION_CACHE_DIR` wins; the default is
    `<cache root>/jax` (`$POAD_CACHE`, else ~/.cache/poad_jax; checked by
    `check_cache_dir` when not given)."""
    cache_root = check_cache_dir() if cache_root is None else cache_root
    if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        jax.config.update("jax_compilation_cache_dir", str(cache_root / "jax"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


USER_ERRORS = (TrainError, UnknownMethodError, envs_py.UnknownEnvError, checkpoint_lib.NoIntactCheckpointError,
               best_lib.BestProgramError, FreeFormActionsError, GroupResetError)
EXIT_USER_ERROR = 2
# The run stopped on what it met while training: a misbehaving environment, or non-finite numbers.  What it
# had saved is intact; the lines say so.
RUN_STOPS = (envs_py.EnvError, NonFiniteUpdatesError, checkpoint_lib.NonFiniteStateError)
EXIT_RUN_STOPPED = 3


def kept_line(workdir: pathlib.Path, error: BaseException) -> str:
    """What a stopped run keeps, and what to do next."""
    steps = checkpoint_lib.checkpoint_steps(workdir)
    fix = "fix the environment" if isinstance(error, envs_py.EnvError) else "change what caused it"
    if steps:
        return f"checkpoints up to update {steps[-1]} are intact in {workdir}; {fix} and re-run the same command to resume"
    return f"no checkpoint had been written yet; {fix} and re-run the same command to start the run again"


def stop_report(workdir: pathlib.Path, error: BaseException) -> str:
    """A stopped run's report: one `error:` line and what is kept; an environment that raised gets its own
    traceback (the user's code) between the two."""
    kept = kept_line(workdir, error)
    if isinstance(error, envs_py.EnvCallError) and error.__cause__ is not None:
        cause = error.__cause__
        trace = "".join(traceback.format_exception(type(cause), cause, cause.__traceback__)).rstrip()
        return f"error: {error.where()} raised {type(cause).__name__}; its traceback:\n{trace}\n{kept}"
    return f"error: {one_line(error)}\n{kept}"


def fail(message: str) -> None:
    """Prints `error: <message>` as one line on stderr and exits with status 2."""
    print(f"error: {one_line(message)}", file=sys.stderr)
    sys.exit(EXIT_USER_ERROR)


def interrupted_line(workdir: pathlib.Path) -> str:
    """The one line a Ctrl-C prints: where a re-run resumes."""
    steps = checkpoint_lib.checkpoint_steps(workdir)
    if steps:
        return f"interrupted: {workdir} resumes from update {steps[-1]} when you re-run the same command"
    return "interrupted before the first checkpoint; re-running the same command starts the run again"


class _DropInterruptTracebacks(logging.Filter):
    """Orbax logs a Ctrl-C that lands while a checkpoint is being finalised as an
    error with a traceback, then re-raises it; `main` reports the interrupt in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and record.exc_info[0] is KeyboardInterrupt)


def _quiet_interrupts_in_orbax_logs() -> None:
    absl_logger = logging.getLogger("absl")
    if not any(isinstance(f, _DropInterruptTracebacks) for f in absl_logger.filters):
        absl_logger.addFilter(_DropInterruptTracebacks())


def main(config: ml_collections.ConfigDict, workdir: pathlib.Path, compilation_cache: bool = True,
         show_progress: bool = True, argv: list[str] | None = None, command: bool = False) -> int:
    """Runs the training command; returns the exit status (0, 2 for a user mistake, 3 for a run stopped by
    its environment or by non-finite numbers, 130 for Ctrl-C).

    `compilation_cache=False` leaves JAX's process-wide cache setting alone
    (tests); the cache directory is checked either way.  `argv`, the
    command line, lets the summary print the command that continues the run.  `command`: this
    process is the command (`cli`), whose Ctrl-C after the run is one line and an immediate exit.
    """
    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax logs every save at INFO
    _quiet_interrupts_in_orbax_logs()
    try:
        cache_root = check_cache_dir()
        if compilation_cache:
            enable_compilation_cache(cache_root)
        result = run(config, workdir, show_progress=show_progress)
    except USER_ERRORS as error:
        print(f"error: {one_line(error)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except RUN_STOPS as error:
        print(stop_report(workdir, error), file=sys.stderr)
        return EXIT_RUN_STOPPED
    except KeyboardInterrupt:
        checkpoint_lib.remove_unfinished_saves(workdir / "checkpoints")
        print(f"\n{interrupted_line(workdir)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if command:  # the run is saved: a Ctrl-C from here on (the summary, the exit) is one line, nothing lost
        exit_quietly_on_interrupt(f"interrupted after the run ended; {result.workdir} holds all of it")
    primary = hosts.is_primary()
    if jax.process_count() > 1:
        jax.distributed.shutdown()  # a barrier: no process leaves while another still needs it
    if primary:
        print()
        print(summary_text(result.settings, result, argv))  # the settings the run typed and trained with
        print(f"\nrun directory: {result.workdir}")
    return 0


# ---------------------------------------------------------------------------
# Command line.


def option_value(argv: list[str], name: str) -> str | None:
    """The value of `--name=V` or `--name V` in argv (the last one wins), else None."""
    value = None
    for i, arg in enumerate(argv):
        if arg.startswith(f"--{name}="):
            value = arg.split("=", 1)[1]
        elif arg == f"--{name}" and i + 1 < len(argv):
            value = argv[i + 1]
    return value


def unknown_override(config: ml_collections.ConfigDict, argv: list[str]) -> str | None:
    """One line for the first `--config.a.b=...` naming no field of `config` (with a close match), else None."""
    for arg in argv:
        if arg.startswith("--config."):
            try:
                config_lib.field_parent(config, arg[len("--config."):].split("=", 1)[0])
            except config_lib.UnknownFieldError as error:
                return str(error)
    return None


HELP = """\
usage: python -m poad_jax.train --config=FILE[:ARGUMENT] [--workdir=DIR] [--config.FIELD=VALUE ...]

Trains a language agent with POAD, NTPO, TWOSOME, GRPO or GiGPO (PPO on a LoRA adapter)
and ends with a summary and the command that trains the same run further.
Re-running the same command with the same --workdir resumes the run.

options:
  -h, --help             show this help message and exit
  --config=FILE          config file (required): a Python file whose get_config() returns the
                         settings; FILE:ARGUMENT passes ARGUMENT to get_config (the paper
                         presets take the method: configs/virtualhome_paper.py:twosome)
  --workdir=DIR          run directory (default ./runs/<name>-<method>-<timestamp>); give the
                         same one again to resume
  --config.FIELD=VALUE   override any setting, dotted (--config.method=ntpo,
                         --config.ppo.actor_lr=1e-4, --config.env.name=toy/decisive_token);
                         every field and its default: poad_jax/run/config/settings.py and the
                         declarations it composes

{configs}

examples:
  python -m poad_jax.train --config=configs/toy.py     # one minute: a tiny random model on a toy task
  python -m poad_jax.train --config=configs/datasci.py --config.method=ntpo --workdir=runs/ds
"""


def help_text() -> str:
    """`--help`: what the command does, its flags, the config files at hand and examples."""
    configs_dir = pathlib.Path(__file__).resolve().parents[2] / "configs"
    names = sorted(p.name for p in configs_dir.glob("*.py")) if configs_dir.is_dir() else []
    where = f" (in {os.path.relpath(configs_dir)})" if names else ""
    listed = textwrap.fill(f"config files{where}: " + (", ".join(names) or "see the repository's configs/"),
                           width=96, subsequent_indent="  ")
    return HELP.format(configs=listed)


def parse_command_line(argv: list[str]) -> tuple[ml_collections.ConfigDict, pathlib.Path]:
    """(config with overrides, workdir) from argv; exits with one line for any mistake."""
    if any(arg in ("-h", "--help", "-help", "--helpfull", "--helpshort") for arg in argv[1:]):
        print(help_text(), end="")
        sys.exit(0)
    config_flags.DEFINE_config_file("config", None, "Path to a config file, e.g. configs/datasci.py.", lock_config=True)
    flags.DEFINE_string("workdir", "", "Run directory (default runs/<config>-<method>-<timestamp>); re-use to resume.")
    path = option_value(argv[1:], "config")
    if path is None:
        fail("--config is required, e.g. --config=configs/datasci.py")
    if split_config_argument(path)[0].is_file():
        try:
            base = load_config_file(path)
        except config_lib.ConfigError as error:  # e.g. a preset file without its method argument
            fail(str(error))
        except Exception as error:  # the user's config file itself fails to run
            fail(f"cannot load config file {path}: {type(error).__name__}: {error}")
        problem = unknown_override(base, argv[1:])
        if problem:
            fail(problem)
    elif ":" not in path:  # config_flags also accepts `file.py:argument`
        fail(f"no config file at {path}")
    try:
        flags.FLAGS(argv)
        config = flags.FLAGS.config
    except flags.Error as error:
        fail(str(error))
    except Exception as error:  # config_flags surfaces override problems as KeyError/AttributeError/...
        fail(f"{type(error).__name__}: {str(error).encode().decode('unicode_escape')}")
    if config is None:
        fail(f"cannot load config file {path}")
    workdir = flags.FLAGS.workdir
    return config, pathlib.Path(workdir) if workdir else default_workdir(config)


def exit_quietly_on_interrupt(line: str) -> None:
    """From now on a Ctrl-C prints `line` and leaves at once with status 130: for the moments
    outside the training loop's own handling (the summary, the interpreter's exit joining
    Orbax's threads), where Python would print a traceback (and, during exit, still return 0)."""
    def leave(signum, frame):
        del signum, frame
        print(f"\n{line}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_INTERRUPTED)

    signal.signal(signal.SIGINT, leave)


def cli(argv: list[str] | None = None, restore_interrupt: bool = False) -> None:
    """The command.  `restore_interrupt`: SIGINT gets Python's KeyboardInterrupt back once the
    command line is read (`poad_jax/train.py` leaves at once on a Ctrl-C before that)."""
    argv = list(sys.argv if argv is None else argv)
    try:
        config, workdir = parse_command_line(argv)
    except KeyboardInterrupt:
        print("\ninterrupted before the run started; nothing was written", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    restore_ctrl_c(restore_interrupt)
    status = main(config, workdir, argv=argv, command=True)
    if status == EXIT_INTERRUPTED:
        # Ctrl-C during a background checkpoint save can leave one of Orbax's worker threads
        # waiting on an executor that was shut down ("cannot schedule new futures after
        # shutdown"), and interpreter exit joins such threads: seen as a hang on a loaded
        # machine. Everything worth keeping is on disk by now (finished checkpoints; unfinished
        # saves removed; metrics and TensorBoard flushed per update), so leave without the join.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


if __name__ == "__main__":
    cli()
