"""The one error a user's mistake raises (`ConfigError`, the trainer's `TrainError`), and
`one_line`, which folds any error's message onto the one line a user is told."""

from __future__ import annotations


class ConfigError(Exception):
    """A user mistake in the run's configuration or inputs, told in one line.

    The trainer prints it as `error: <line>` and exits with status 2
    (`TrainError` is this class)."""


TrainError = ConfigError  # the trainer's name: a user mistake, one line, exit status 2


def one_line(error: BaseException | str) -> str:
    """An error message folded onto one line."""
    return " ".join(str(error).split())
