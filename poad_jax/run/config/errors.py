"""The one error a user's configuration mistake raises."""

from __future__ import annotations


class ConfigError(Exception):
    """A user mistake in the run's configuration or inputs, told in one line.

    The trainer prints it as `error: <line>` and exits with status 2
    (`train.TrainError` is this class)."""
