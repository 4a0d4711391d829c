"""The one error a user's mistake raises (`ConfigError`, the trainer's `TrainError`),
`one_line`, which folds any error's message onto the one line a user is told, and the
`ArgumentParser` every argparse command uses, whose flag mistakes end the same way."""

from __future__ import annotations

import argparse
import pathlib


class ConfigError(Exception):
    """A user mistake in the run's configuration or inputs, told in one line.

    The trainer prints it as `error: <line>` and exits with status 2
    (`TrainError` is this class)."""


TrainError = ConfigError  # the trainer's name: a user mistake, one line, exit status 2


def one_line(error: BaseException | str) -> str:
    """An error message folded onto one line."""
    return " ".join(str(error).split())


def missing_run_directory(workdir: pathlib.Path) -> str | None:
    """The line for a `--workdir` naming a run to read (evaluate, export, best_program) that is not a
    directory: a file, or nothing at all; None for a directory."""
    if workdir.is_dir():
        return None
    return f"{workdir} is a file, not a run directory" if workdir.exists() else f"no run directory at {workdir}"


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, except that a flag mistake ends as every user mistake does: one
    `error:` line (naming `--help`) and exit status 2, instead of a usage block."""

    def error(self, message: str):
        self.exit(2, f"error: {one_line(message)} (`{self.prog} --help` lists the flags)\n")
