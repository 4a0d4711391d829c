"""What an environment hands the trainer, checked at one place: `VectorEnv`'s calls.

An environment is the user's code; what it returns becomes training data.  A
reward of NaN or a string, a `done` that is not a bool, an observation whose
text is not a string, a restricted environment that offers no action: each
would surface far from its cause (a non-finite loss, a comparison's
TypeError, a layout error) or, worse, train on silently.  `VectorEnv` checks
every `reset` and `step` result here and raises `EnvOutputError`, naming the
environment, the thread, the call, the field and the value received; an
exception the environment's own code raises becomes `EnvCallError`, with the
original as its `__cause__` (its traceback is the user's).  The trainer adds
the env step (`EnvError.env_step`) and says what the run keeps.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from envs_py.interface import Observation, StepResult


class EnvError(Exception):
    """An environment failed inside a vector of them: which environment, thread and call.

    `env_step`: the run's env step the call belonged to, when the caller knows it
    (the rollout sets it; None at the first reset)."""

    def __init__(self, env: str, thread: int, call: str, problem: str):
        super().__init__(problem)
        self.env, self.thread, self.call, self.problem = env, int(thread), call, problem
        self.env_step: int | None = None

    def where(self) -> str:
        """`environment 'x', thread 2, env step 17 (step)`: the header of every report of this error."""
        step = f", env step {self.env_step}" if self.env_step is not None else ""
        return f"environment {self.env!r}, thread {self.thread}{step} ({self.call})"

    def __str__(self) -> str:
        return f"{self.where()}: {self.problem}"


class EnvOutputError(EnvError, ValueError):
    """An environment returned a value the trainer cannot use (`field` names it)."""

    def __init__(self, env: str, thread: int, call: str, field: str, value: Any, expected: str):
        self.field, self.value = field, value
        super().__init__(env, thread, call, f"{field} must be {expected}, got {describe(value)}")


class EnvCallError(EnvError, RuntimeError):
    """The environment's own code raised; `__cause__` is its exception."""

    def __init__(self, env: str, thread: int, call: str, error: BaseException):
        super().__init__(env, thread, call, f"raised {type(error).__name__}: {error}")


def describe(value: Any) -> str:
    """A received value as a reader wants it: its repr (cut at 80 characters) and its type."""
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} ({type(value).__name__})"


def reward_problem(reward: Any) -> str | None:
    """None for a finite real number (a bool is not one: `True` as a reward is a slip); else what it must be."""
    if isinstance(reward, (bool, np.bool_)) or not isinstance(reward, numbers.Real):
        return "a real number (int or float)"
    if not math.isfinite(float(reward)):
        return "a finite real number"
    return None


def actions_problem(actions: Any) -> str | None:
    """None for None (free-form text) or a non-empty sequence of non-empty strings; else what it must be."""
    if actions is None:
        return None
    if isinstance(actions, (str, bytes)) or not isinstance(actions, Sequence):
        return "None (free-form) or a sequence of action strings"
    if len(actions) == 0:
        return "a non-empty sequence of action strings (a restricted environment must offer an action)"
    if not all(isinstance(action, str) and action for action in actions):
        return "a sequence of non-empty strings"
    return None


def check_observation(observation: Any, env: str, thread: int, call: str, field: str = "observation") -> None:
    """Raises EnvOutputError unless `observation` is an Observation with a string text and valid actions."""
    if not isinstance(observation, Observation):
        raise EnvOutputError(env, thread, call, field, observation, "an envs_py.Observation")
    if not isinstance(observation.text, str):
        raise EnvOutputError(env, thread, call, f"{field}.text", observation.text, "a string")
    problem = actions_problem(observation.actions)
    if problem:
        raise EnvOutputError(env, thread, call, f"{field}.actions", observation.actions, problem)


def check_step_result(result: Any, env: str, thread: int) -> None:
    """Raises EnvOutputError unless `result` is a StepResult whose reward is a finite real number, `done` a
    bool, observation valid (`check_observation`) and `info` a mapping."""
    if not isinstance(result, StepResult):
        raise EnvOutputError(env, thread, "step", "the step's result", result, "an envs_py.StepResult")
    problem = reward_problem(result.reward)
    if problem:
        raise EnvOutputError(env, thread, "step", "reward", result.reward, problem)
    if not isinstance(result.done, (bool, np.bool_)):
        raise EnvOutputError(env, thread, "step", "done", result.done, "a bool")
    if not isinstance(result.info, Mapping):
        raise EnvOutputError(env, thread, "step", "info", result.info, "a mapping (a dict)")
    check_observation(result.observation, env, thread, "step")
