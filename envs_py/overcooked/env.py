"""`OvercookedEnv`: a macro-action Overcooked task as a `TextEnv`."""

from __future__ import annotations

import numbers

from envs_py.interface import Observation, StepAfterDoneError, StepResult
from envs_py.overcooked import tasks as T
from envs_py.overcooked import text
from envs_py.overcooked.kitchen import Kitchen
from envs_py.overcooked.macros import MacroController


class OvercookedEnv:
    """Overcooked with macro actions (the originals' specification, docs/envs.md, Part A), one agent, 7x7 map "A".

    `step(label)` takes one of the offered labels (index = macro action);
    `step_id(macro_id)` takes the macro index directly.  Every macro is
    valid in every state; a string that is not offered is an invalid action:
    it runs a single "stay" primitive (the original's no-op: step penalty,
    counts toward the 200-primitive-step limit) and sets
    `info["invalid_action"]`.

    `info`: `state_vector` (the A.7 observation), `primitive_steps` (used by
    this macro step), `primitive_actions` (digit string, 0 right 1 down 2 left
    3 up 4 stay), `macro_action` (None if invalid), `invalid_action`,
    `agent_position` (true cell), `elapsed_primitive_steps`,
    `primitive_return` (episode return so far over primitive steps,
    discounted by 0.99 per primitive step), `success`,
    `truncated` (ended by the step limit without delivering).
    """

    def __init__(self, task: str = "tomato_salad"):
        if task not in T.TASKS:
            raise ValueError(f"unknown Overcooked task {task!r}; known: {', '.join(map(repr, T.TASKS))}")
        self.task = T.TASKS[task]
        self.seed: int | None = None
        self.reset()

    @property
    def macro_actions(self) -> tuple[str, ...]:
        """Names of the macro actions, index = macro id (the spec's A.8 names)."""
        return self.task.macro_actions

    def state_vector(self) -> list[int]:
        return list(self.kitchen.observation_vector())

    def agent_position(self) -> list[int]:
        """The agent's true cell `[x, y]` (row, column)."""
        return list(self.kitchen.agent.pos)

    def action_labels(self) -> tuple[str, ...]:
        """Labels offered now, index = macro id."""
        return text.action_labels(self.kitchen.observation_vector(), self.task)

    def valid_action_ids(self) -> tuple[int, ...]:
        """Every macro action is valid in every state (A.8)."""
        return tuple(range(len(self.task.macro_actions)))

    def observation(self) -> Observation:
        """The current observation (what the last reset/step returned)."""
        return self._observation(self.kitchen.observation_vector())

    def _observation(self, obs: tuple[int, ...]) -> Observation:
        return Observation(text.prompt(obs, self.task), text.action_labels(obs, self.task))

    def reset(self, seed: int | None = None) -> Observation:
        """Restores the initial kitchen (deterministic; `seed` is recorded only)."""
        self.seed = seed
        self.kitchen = Kitchen(self.task)
        self.controller = MacroController(self.kitchen)
        self.done = False
        self.success = False
        return self._observation(self.kitchen.observation_vector())

    def step(self, action: str) -> StepResult:
        """Runs the macro whose label is `action`; other strings are invalid (one stay step)."""
        if self.done:
            raise StepAfterDoneError("step() called after the episode ended; call reset() first")
        if not isinstance(action, str):
            raise TypeError(f"step() takes the action text, got {type(action).__name__}; use step_id() for ids")
        labels = self.action_labels()
        if action in labels:
            return self.step_id(labels.index(action))
        reward, done = self.kitchen.primitive_step(T.STAY)
        return self._result(reward, done, (T.STAY,), None)

    def step_id(self, macro_id: int) -> StepResult:
        """Runs macro action `macro_id` (0 .. len(macro_actions) - 1) to completion."""
        if self.done:
            raise StepAfterDoneError("step_id() called after the episode ended; call reset() first")
        if isinstance(macro_id, bool) or not isinstance(macro_id, numbers.Integral):
            raise TypeError(f"step_id() takes an integer id, got {macro_id!r}")
        macro_id = int(macro_id)
        if not 0 <= macro_id < len(self.task.macro_actions):
            raise ValueError(f"macro id must be in 0..{len(self.task.macro_actions) - 1}, got {macro_id!r}")
        outcome = self.controller.run(macro_id)
        return self._result(outcome.reward, outcome.done, outcome.primitives, macro_id)

    def _result(self, reward: float, done: bool, primitives: tuple[int, ...], macro_id: int | None) -> StepResult:
        self.done = done
        self.success = self.kitchen.plate.pos == self.kitchen.delivery.pos
        obs = self.kitchen.observation_vector()
        info = {
            "state_vector": list(obs),
            "primitive_steps": len(primitives),
            "primitive_actions": "".join(map(str, primitives)),
            "macro_action": macro_id,
            "invalid_action": macro_id is None,
            "agent_position": list(self.kitchen.agent.pos),
            "elapsed_primitive_steps": self.kitchen.steps,
            "primitive_return": self.kitchen.primitive_return,
            "success": self.success,
            "truncated": done and not self.success,
        }
        return StepResult(self._observation(obs), reward, done, info)
