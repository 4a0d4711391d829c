"""A synthetic language task that isolates credit assignment: save now or take now.

What it models.  Each episode has `horizon` steps.  At every step the agent
writes one action of exactly `action_length` words (one token each under the
tiny model's word tokenizer) from a small restricted set.  The actions share
every word but one, the *deciding word*, placed at `deciding_position`:

- `red`   (take): pays `take_reward` at the end of this action;
- `blue`  (save): pays `save_reward` later, at the end of the episode's last
  action (every saved coin is paid then);
- `green` (decoy, `num_decoys=1`): pays nothing.

Rewards only ever arrive at an action's last token, as in the paper's tasks.
Undiscounted, saving is best (return `horizon * save_reward`).  But an agent
whose per-action discount is `g` values a save at step t (0-based) as
`save_reward * g**(horizon - 1 - t)` and a take as `take_reward`, so it
takes whenever `g**(horizon - 1 - t) < take_reward / save_reward`.

Why it separates the methods.  POAD's backup (discount 1 inside an action,
gamma_a at its end) and TWOSOME's action-level backup both discount one
action by `g = gamma_a`.  NTPO discounts every token, so one action costs
`g = gamma_a * gamma_w**(action_length - 1)`: its optimal policy turns myopic
as actions lengthen and as gamma_w falls, which is the paper's claim (§4.2,
Eq. 11-12) made measurable.  `optimal_return(g)` gives the closed form, so a
study can draw the theory's prediction beside the learning curves.

`slip` adds stochastic transitions: with that probability the action carried
out is drawn uniformly from the valid ones instead of the one written.

Words come from the tiny model's vocabulary (`poad_jax.models.tiny`) so each
is one token there; other tokenizers may split some words (the action length
is then counted in words, not tokens).  No JAX here: this package is stepped
in Python by the trainer.
"""

from __future__ import annotations

import random

from envs_py.interface import Observation, StepAfterDoneError, StepResult
from envs_py.registry import register

TAKE, SAVE, DECOY = "red", "blue", "green"
FILLER_WORDS = ("walk", "to", "the", "door", "go", "on", "open", "close", "turn", "off", "pick", "up", "put", "heat")
DECIDING_POSITIONS = ("first", "middle", "last")


def action_text(deciding_word: str, action_length: int, deciding_position: str) -> str:
    """The action of `action_length` words with `deciding_word` at `deciding_position`.

    Filler words cycle through FILLER_WORDS, so the words around the deciding
    one are the same in every action of a state.
    """
    index = {"first": 0, "middle": (action_length - 1) // 2, "last": action_length - 1}[deciding_position]
    fillers = iter(FILLER_WORDS[i % len(FILLER_WORDS)] for i in range(action_length))
    return " ".join(deciding_word if i == index else next(fillers) for i in range(action_length))


def optimal_return(per_action_discount: float, horizon: int, take_reward: float = 0.5,
                   save_reward: float = 1.0) -> float:
    """Undiscounted return of the policy optimal under a per-action discount `g`.

        a_t* = save  if  save_reward * g**(horizon - 1 - t) >= take_reward  else take
        return = sum_t  [save_reward if a_t* = save else take_reward]

    Deterministic transitions (slip = 0).  Ties go to save.  For NTPO,
    g = gamma_a * gamma_w**(action_length - 1); for POAD and TWOSOME, g = gamma_a.
    """
    total = 0.0
    for t in range(horizon):
        saves = save_reward * per_action_discount ** (horizon - 1 - t) >= take_reward
        total += save_reward if saves else take_reward
    return total


class SaveOrTakeEnv:
    """Each step: write `take` (paid now), `save` (paid at the end) or a decoy (nothing)."""

    def __init__(
        self,
        action_length: int = 4,
        horizon: int = 4,
        deciding_position: str = "first",
        take_reward: float = 0.5,
        save_reward: float = 1.0,
        num_decoys: int = 1,
        slip: float = 0.0,
    ):
        if action_length < 1:
            raise ValueError(f"action_length must be >= 1, got {action_length}")
        if not 1 <= horizon <= 9:
            raise ValueError(f"horizon must be in 1..9 (one digit in the prompt), got {horizon}")
        if deciding_position not in DECIDING_POSITIONS:
            raise ValueError(f"deciding_position must be one of {', '.join(DECIDING_POSITIONS)}, "
                             f"got {deciding_position!r}")
        if num_decoys not in (0, 1):
            raise ValueError(f"num_decoys must be 0 or 1, got {num_decoys}")
        if not 0.0 <= slip <= 1.0:
            raise ValueError(f"slip must be in [0, 1], got {slip}")
        if not 0.0 < take_reward < save_reward:
            raise ValueError(f"need 0 < take_reward < save_reward (saving must pay more), "
                             f"got take {take_reward}, save {save_reward}")
        self.action_length = action_length
        self.horizon = horizon
        self.take_reward = float(take_reward)
        self.save_reward = float(save_reward)
        self.slip = float(slip)
        words = (TAKE, SAVE) + ((DECOY,) if num_decoys else ())
        self.actions = tuple(action_text(word, action_length, deciding_position) for word in words)
        self._meaning = dict(zip(self.actions, words))
        self._rng = random.Random(0)
        self._step = 0
        self._saved = 0
        self._done = True

    def _observation(self) -> Observation:
        # Step index and coins saved so far: enough for a Markov state.
        text = f"you are in a hall with doors . step {self._step + 1} : {self.horizon} , blue {self._saved} ."
        return Observation(text, self.actions)

    def reset(self, seed: int | None = None) -> Observation:
        if seed is not None:
            self._rng.seed(seed)
        self._step = 0
        self._saved = 0
        self._done = False
        return self._observation()

    def step(self, action: str) -> StepResult:
        if self._done:
            raise StepAfterDoneError("episode is over: call reset() first")
        invalid = action not in self._meaning
        if self.slip and self._rng.random() < self.slip:
            action = self._rng.choice(self.actions)
        word = self._meaning.get(action, DECOY)
        reward = self.take_reward if word == TAKE else 0.0
        self._saved += word == SAVE
        self._step += 1
        self._done = self._step >= self.horizon
        info = {"invalid_action": invalid, "chose": word}
        if self._done:
            reward += self.save_reward * self._saved
            info["success"] = self._saved == self.horizon
        return StepResult(self._observation(), reward, self._done, info)


register(
    "synthetic/save_or_take",
    "envs_py.synthetic:SaveOrTakeEnv",
    "Synthetic: n-token actions, one deciding word; saving pays more but later (credit assignment).",
)
