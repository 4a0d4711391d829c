"""The text-environment interface shared by every environment in `envs_py`.

An environment shows a language agent an `Observation` (text, plus the tuple
of valid action strings for restricted environments or `None` for free-form
ones) and takes the agent's action as text.  `StepResult.info` carries
diagnostics (`invalid_action`, `state_vector`, `primitive_steps`, ...).

This package never imports JAX: it is stepped in Python by the trainer's
rollout loop, possibly in worker processes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Protocol, runtime_checkable


@dataclasses.dataclass(frozen=True)
class Observation:
    """What the agent sees.

    Attributes:
      text: the observation rendered as text (the prompt's content).
      actions: valid action strings in this state, or None for free-form
        environments (e.g. code generation).
    """

    text: str
    actions: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True)
class StepResult:
    """The outcome of one `step`: next observation, reward, done, info."""

    observation: Observation
    reward: float
    done: bool
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


def observation_digest(observation: Observation) -> str:
    """A short fingerprint of an observation (its text and valid actions): a resumed run checks that
    replaying an episode's actions led to the observation the checkpoint saw."""
    payload = json.dumps([observation.text, observation.actions], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


class StepAfterDoneError(RuntimeError):
    """Raised when `step` is called on a finished episode without `reset`."""


@runtime_checkable
class TextEnv(Protocol):
    """Protocol of a text environment."""

    def reset(self, seed: int | None = None) -> Observation: ...

    def step(self, action: str) -> StepResult: ...
