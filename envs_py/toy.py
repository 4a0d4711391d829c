"""A toy restricted-action task where one token inside an action decides the reward.

The paper's Figure 1 setting: the valid actions share every word but one
("walk to the red door" / "walk to the blue door"), so only the deciding
token deserves credit.  Each episode has `horizon` steps; choosing the
rewarded colour pays +1, the other 0.  Used by the learner's tests and as a
seconds-long smoke task for the trainer.
"""

from __future__ import annotations

import random

from envs_py.interface import Observation, StepAfterDoneError, StepResult
from envs_py.registry import register

COLOURS = ("red", "blue", "green")


class DecisiveTokenEnv:
    """Pick the door whose colour the reward favours; the colour word decides."""

    def __init__(self, horizon: int = 2, num_colours: int = 2, rewarded: str = "red"):
        if not 1 <= num_colours <= len(COLOURS):
            raise ValueError(f"num_colours must be in 1..{len(COLOURS)}, got {num_colours}")
        if rewarded not in COLOURS[:num_colours]:
            raise ValueError(f"rewarded colour {rewarded!r} is not among {COLOURS[:num_colours]}")
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        self.horizon = horizon
        self.rewarded = rewarded
        self.actions = tuple(f"walk to the {colour} door" for colour in COLOURS[:num_colours])
        self._rng = random.Random(0)
        self._step = 0
        self._done = True

    def _observation(self) -> Observation:
        text = f"You are in a hall with doors. Step {self._step + 1}. Your next step is to"
        return Observation(text, self.actions)

    def reset(self, seed: int | None = None) -> Observation:
        if seed is not None:
            self._rng.seed(seed)
        self._step = 0
        self._done = False
        return self._observation()

    def step(self, action: str) -> StepResult:
        if self._done:
            raise StepAfterDoneError("episode is over: call reset() first")
        invalid = action not in self.actions
        reward = 1.0 if action == f"walk to the {self.rewarded} door" else 0.0
        self._step += 1
        self._done = self._step >= self.horizon
        info = {"invalid_action": invalid}
        if self._done:
            info["success"] = reward > 0
        return StepResult(self._observation(), reward, self._done, info)


register(
    "toy/decisive_token",
    "envs_py.toy:DecisiveTokenEnv",
    "Toy: two doors differ in one word; the colour token alone decides the reward.",
)
