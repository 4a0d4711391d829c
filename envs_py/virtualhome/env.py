"""`VirtualHomeEnv`: the text-environment wrapper around the symbolic dynamics.

One class serves food preparation (v1), its six renamed variants and
entertainment (v2): a `Task` bundles the pure functions of one dynamics
module with its labels and prompt renderer.
"""

from __future__ import annotations

import numbers

import dataclasses
import functools
from typing import Any, Callable, Sequence

from envs_py.interface import Observation, StepAfterDoneError, StepResult
from envs_py.virtualhome import entertainment, food_preparation, text

# Episode length of the original environments (the originals' specification, docs/envs.md, B.1).
DEFAULT_MAX_STEPS = 50
SUCCESS_REWARD = 1.0
NO_REWARD = 0.0

# Variant name -> (object word, appliance word) of the originals' specification, docs/envs.md, B.4.
FOOD_PREPARATION_VARIANTS = {
    None: text.Wording(),
    "cheese": text.Wording("cheese", "microwave"),
    "hamburger": text.Wording("hamburger", "microwave"),
    "apple_pie": text.Wording("apple pie", "microwave"),
    "pizza": text.Wording("pizza", "microwave"),
    "washing_plate": text.Wording("dishes", "dishwasher"),
    "laundry": text.Wording("clothes", "washing machine"),
}


@dataclasses.dataclass(frozen=True)
class Task:
    """Everything that distinguishes one VirtualHome task from another."""

    name: str
    initial_state: Any
    next_state: Callable[[Any, int], Any]
    observation_vector: Callable[[Any], tuple[int, ...]]
    valid_action_ids: Callable[[Sequence[int]], tuple[int, ...]]
    is_success: Callable[[Any], bool]
    action_labels: tuple[str, ...]
    prompt: Callable[[tuple[int, ...]], str]


def food_preparation_task(variant: str | None = None) -> Task:
    """The v1 task, with the words of `variant` (None = pancake / microwave)."""
    if variant not in FOOD_PREPARATION_VARIANTS:
        known = ", ".join(repr(v) for v in FOOD_PREPARATION_VARIANTS if v is not None)
        raise ValueError(f"unknown food-preparation variant {variant!r}; known: None, {known}")
    wording = FOOD_PREPARATION_VARIANTS[variant]
    return Task(
        name="food_preparation" + (f"_{variant}" if variant else ""),
        initial_state=food_preparation.INITIAL_STATE,
        next_state=food_preparation.next_state,
        observation_vector=food_preparation.observation_vector,
        valid_action_ids=food_preparation.valid_action_ids,
        is_success=food_preparation.is_success,
        action_labels=wording.action_labels(),
        prompt=functools.partial(_food_prompt, wording=wording),
    )


def _food_prompt(obs: tuple[int, ...], wording: text.Wording) -> str:
    return text.food_preparation_prompt(obs, wording)


def entertainment_task() -> Task:
    """The v2 task: chips and milk to the coffee table, TV on, sit on the sofa."""
    return Task(
        name="entertainment",
        initial_state=entertainment.INITIAL_STATE,
        next_state=entertainment.next_state,
        observation_vector=entertainment.observation_vector,
        valid_action_ids=entertainment.valid_action_ids,
        is_success=entertainment.is_success,
        action_labels=entertainment.ACTION_LABELS,
        prompt=text.entertainment_prompt,
    )


@dataclasses.dataclass(frozen=True)
class _View:
    """What the agent sees in one state (cached per state: the state space is tiny)."""

    obs: tuple[int, ...]
    valid: tuple[int, ...]
    observation: Observation
    success: bool


class VirtualHomeEnv:
    """A VirtualHome task as a `TextEnv`.

    `step(label)` takes one of the offered labels; any other string is an
    invalid action: it uses up a step and changes nothing
    (`info["invalid_action"] = True`).  `step_id(action_id)` applies any
    action id of the task's table as the original environment does (the
    oracle tables' path), offered or not.

    Rewards: 1.0 on the step that reaches success, else 0.0.  The episode
    ends at success or after `max_steps` steps (ignored actions included).
    `info`: `state_vector` (the original observation bits), `action_id`
    (None for an invalid label), `invalid_action`, `success`, `truncated`
    (ended by the step limit without success), `elapsed_steps`.
    """

    def __init__(self, task: str = "food_preparation", variant: str | None = None,
                 max_steps: int = DEFAULT_MAX_STEPS):
        if task == "food_preparation":
            self.task = food_preparation_task(variant)
        elif task == "entertainment":
            if variant is not None:
                raise ValueError("the entertainment task has no variants")
            self.task = entertainment_task()
        else:
            raise ValueError(f"unknown VirtualHome task {task!r}; known: 'food_preparation', 'entertainment'")
        if int(max_steps) < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps!r}")
        self.max_steps = int(max_steps)
        self._label_to_id = {label: i for i, label in enumerate(self.task.action_labels)}
        self._views: dict[Any, _View] = {}
        self.state = self.task.initial_state
        self.elapsed_steps = 0
        self.done = False
        self.seed: int | None = None

    def action_labels(self) -> tuple[str, ...]:
        """The label of every action id (index = id); VirtualHome labels never change."""
        return self.task.action_labels

    def _view(self, state: Any) -> _View:
        view = self._views.get(state)
        if view is None:
            obs = self.task.observation_vector(state)
            valid = self.task.valid_action_ids(obs)
            labels = tuple(self.task.action_labels[i] for i in valid)
            view = _View(obs, valid, Observation(self.task.prompt(obs), labels), self.task.is_success(state))
            self._views[state] = view
        return view

    def state_vector(self) -> list[int]:
        """The original observation vector of the current state."""
        return list(self._view(self.state).obs)

    def valid_action_ids(self) -> tuple[int, ...]:
        """Action ids offered in the current state (id order)."""
        return self._view(self.state).valid

    def observation(self) -> Observation:
        return self._view(self.state).observation

    def reset(self, seed: int | None = None) -> Observation:
        """Starts an episode in the initial state (the task is deterministic; `seed` is recorded only)."""
        self.seed = seed
        self.state = self.task.initial_state
        self.elapsed_steps = 0
        self.done = False
        return self.observation()

    def step(self, action: str) -> StepResult:
        """Takes an offered action label; any other string is an invalid, state-preserving step."""
        if self.done:
            raise StepAfterDoneError("step() called after the episode ended; call reset() first")
        if not isinstance(action, str):
            raise TypeError(f"step() takes the action text, got {type(action).__name__}; use step_id() for ids")
        action_id = self._label_to_id.get(action)
        if action_id is None or action_id not in self._view(self.state).valid:
            return self._advance(self.state, None)
        return self._advance(self.task.next_state(self.state, action_id), action_id)

    def step_id(self, action_id: int) -> StepResult:
        """Applies action id `action_id` (any id of the table) exactly as the original does."""
        if self.done:
            raise StepAfterDoneError("step_id() called after the episode ended; call reset() first")
        if isinstance(action_id, bool) or not isinstance(action_id, numbers.Integral):
            raise TypeError(f"step_id() takes an integer id, got {action_id!r}")
        action_id = int(action_id)
        if not 0 <= action_id < len(self.task.action_labels):
            raise ValueError(f"action id must be in 0..{len(self.task.action_labels) - 1}, got {action_id!r}")
        return self._advance(self.task.next_state(self.state, action_id), action_id)

    def _advance(self, state: Any, action_id: int | None) -> StepResult:
        self.state = state
        self.elapsed_steps += 1
        view = self._view(state)
        truncated = self.elapsed_steps >= self.max_steps and not view.success
        self.done = view.success or truncated
        info = {
            "state_vector": list(view.obs),
            "action_id": action_id,
            "invalid_action": action_id is None,
            "success": view.success,
            "truncated": truncated,
            "elapsed_steps": self.elapsed_steps,
        }
        reward = SUCCESS_REWARD if view.success else NO_REWARD
        return StepResult(view.observation, reward, self.done, info)
