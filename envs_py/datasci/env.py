"""The DataSciCoding environment: write `build_model`, get its ROC AUC.

An episode is one dataset.  The observation asks for the body of
`build_model(x_train, y_train)`; the action is free text (code).  Each step
extracts a program from the text and runs it on 5 shuffled 50/50 splits
(random_state 0..4), each split in a sandbox of its own that holds only that
split's training rows and labels and its test rows' features.  Success: reward = mean ROC AUC, episode
done, `info["success"] = True`, `info["auc_per_split"]`.  Failure: reward
`failure_reward` (-1), the next observation is a retry prompt with the
truncated error and the previous code; the episode ends after
`max_attempts` attempts.  Data is loaded when the env is made.

Two options beyond the paper, both off by default (docs/datasci.md, "Options beyond the paper"):
`graded_failures` gives a failure the penalty of the stage it reached
(`envs_py.datasci.stages`) instead of `failure_reward`; `improve_attempts=k`
goes on after the first program that runs for k more attempts, each shown
the episode's best program and its AUC, each running one earning its gain
over that best (0 if none), so that the rewards of an episode's running
programs sum to its best AUC.

Every step's `info` also says the attempt's kind ("first", "retry" or
"improve"), the program's AUC (`auc`, on success), the stage a failure
reached (`failure_stage`, None on success) and the estimator class the
program returns (`estimator`, `envs_py.datasci.estimators`); improvement
episodes add the episode's best AUC so far (`episode_best_auc`) and whether
a program of the episode has run (`episode_success`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from envs_py.interface import Observation, StepAfterDoneError, StepResult
from envs_py.datasci import prompts
from envs_py.datasci.datasets import load_dataset
from envs_py.datasci.estimators import estimator_class
from envs_py.datasci.extract import extract_program
from envs_py.datasci.sandbox import (CandidateResult, SandboxLimits, evaluate_candidate, require_sandbox,
                                     shared_session, split_indices)
from envs_py.datasci.stages import stage_rewards

DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_FAILURE_REWARD = -1.0


@dataclasses.dataclass
class Episode:
    """What an episode in progress holds: all its next observation and rewards depend on.

    `attempts` counts every step; `improvements` the steps after the first
    program that ran; `best_program`/`best_auc` the episode's best running
    program (improvement episodes only); `last_program`/`last_error` the last
    failed attempt, `last_auc` the last running one that was not better (what
    the next observation reports).
    """

    attempts: int = 0
    improvements: int = 0
    best_program: str | None = None
    best_auc: float | None = None
    last_program: str | None = None
    last_error: str | None = None
    last_auc: float | None = None


class DataSciEnv:
    """`datasci/<dataset>`: free-form code actions scored by ROC AUC in a sandbox.

    Args:
      dataset: a name of `envs_py.datasci.DATASET_NAMES`.
      template: "chat" (user message) or "plain" (completion prompt ending
        with the build_model header).
      max_attempts: attempts per episode before it ends in failure (those
        before a program runs; improvement attempts are counted apart).
      timeout_s: wall clock of each of an attempt's 5 fits (start, imports,
        fit, predict); an attempt takes at most 5 x timeout_s.
      failure_reward: reward of a failed attempt (the paper's -1).
      graded_failures: a failure earns its stage's penalty instead, between
        failure_reward and 0 (`envs_py.datasci.stages.DEFAULT_LADDER` times
        failure_reward).
      failure_rewards: with graded_failures, {stage: reward} (or a string
        "stage=reward,...") in place of the ladder's for the stages named.
      improve_attempts: after the first program that runs, k more attempts
        at a better one (0: the episode ends there, the paper's).
      data_dir: data directory (else $POAD_DATA_DIR, else the user cache).
      limits: other sandbox limits; its wall_seconds is replaced by timeout_s.
      allow_unsandboxed: run candidates even where the bubblewrap sandbox
        cannot be used (unsafe; a warning line at every start).  Otherwise
        the env refuses to be built there (SandboxUnavailableError).
      error_chars / code_chars: truncation of the retry prompt's parts.
    """

    def __init__(self, dataset: str = "balance_scale", template: str = "chat",
                 max_attempts: int = DEFAULT_MAX_ATTEMPTS, timeout_s: float = DEFAULT_TIMEOUT_S,
                 failure_reward: float = DEFAULT_FAILURE_REWARD, data_dir=None,
                 limits: SandboxLimits | None = None,
                 error_chars: int = prompts.DEFAULT_ERROR_CHARS,
                 code_chars: int = prompts.DEFAULT_CODE_CHARS, allow_unsandboxed: bool = False,
                 graded_failures: bool = False, failure_rewards: Mapping[str, float] | str | None = None,
                 improve_attempts: int = 0):
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        if not isinstance(improve_attempts, int) or isinstance(improve_attempts, bool) or improve_attempts < 0:
            raise ValueError(f"improve_attempts must be an integer >= 0, got {improve_attempts!r}")
        self.dataset = dataset
        self.template = prompts.check_template(template)
        self.max_attempts = max_attempts
        self.failure_reward = float(failure_reward)
        self.stage_rewards = stage_rewards(self.failure_reward, bool(graded_failures), failure_rewards)
        self.improve_attempts = improve_attempts
        limits = limits or SandboxLimits()
        self.limits = dataclasses.replace(limits, wall_seconds=float(timeout_s),
                                          allow_unsandboxed=bool(allow_unsandboxed or limits.allow_unsandboxed))
        # Refuse (or warn) now, when the trainer starts, not at the first program.
        require_sandbox(self.limits)
        self.error_chars, self.code_chars = error_chars, code_chars
        self.X, self.y = load_dataset(dataset, data_dir)
        self.splits = split_indices(len(self.y))
        self._shape = (dataset, len(self.y), self.X.shape[1], len(np.unique(self.y)))
        self._episode = Episode()
        self._done = True

    def _first_observation(self) -> Observation:
        return Observation(prompts.task_prompt(self.template, *self._shape))

    def _observation(self) -> Observation:
        """The observation the episode in progress shows: the task, a retry after a failure, or (once a
        program of an improvement episode ran) its best program with the last attempt's outcome."""
        episode = self._episode
        if episode.best_program is not None:
            return Observation(prompts.improve_prompt(
                self.template, *self._shape, best_code=shown_code(episode.best_program), best_auc=episode.best_auc,
                last_code=None if episode.last_program is None else shown_code(episode.last_program),
                last_error=episode.last_error, last_auc=episode.last_auc, error_chars=self.error_chars,
                code_chars=self.code_chars))
        if episode.last_error is not None:
            return Observation(prompts.retry_prompt(self.template, *self._shape, previous_code=episode.last_program,
                                                    error=episode.last_error, error_chars=self.error_chars,
                                                    code_chars=self.code_chars))
        return self._first_observation()

    def reset(self, seed: int | None = None) -> Observation:
        """Starts an episode (the task is deterministic; `seed` is accepted for the API)."""
        del seed
        self._episode = Episode()
        self._done = False
        return self._first_observation()

    def failure_reward_of(self, stage: str | None) -> float:
        """The reward of a failure that reached `stage`: its graded penalty, or failure_reward."""
        if self.stage_rewards is None:
            return self.failure_reward
        return self.stage_rewards.get(stage, self.failure_reward)

    def step(self, action: str) -> StepResult:
        """Runs the code in `action`; see the module docstring for rewards."""
        if self._done:
            raise StepAfterDoneError("episode is done; call reset() first")
        episode = self._episode
        episode.attempts += 1
        program = extract_program(action)
        result = self.score_program(program)
        kind = "improve" if episode.best_program is not None else ("first" if episode.attempts == 1 else "retry")
        info = {"success": result.success, "attempt": episode.attempts, "program": program, "dataset": self.dataset,
                "seconds": result.seconds, "network_isolated": result.network_isolated, "attempt_kind": kind,
                "failure_stage": result.failure_stage, "estimator": estimator_class(program)}
        if result.success:
            info["auc_per_split"] = result.auc_per_split
            info["auc"] = result.mean_auc
        else:
            info["error"] = result.error
        if kind == "improve":
            reward = self._improvement_step(program, result)
        elif result.success and self.improve_attempts == 0:  # the paper's episode: the first program that runs ends it
            self._done = True
            return StepResult(self._first_observation(), result.mean_auc, True, info)
        elif result.success:
            reward = result.mean_auc
            episode.best_program, episode.best_auc = program, result.mean_auc
            episode.last_program = episode.last_error = None
        else:
            reward = self.failure_reward_of(result.failure_stage)
            self._done = episode.attempts >= self.max_attempts
            episode.last_program, episode.last_error = program, result.error
        if self.improve_attempts:
            info["episode_best_auc"] = episode.best_auc
            info["episode_success"] = episode.best_program is not None
        return StepResult(self._observation(), reward, self._done, info)

    def _improvement_step(self, program: str, result: CandidateResult) -> float:
        """An attempt after the episode's first running program: its reward (the gain over the best so
        far, 0 if none, or the failure's penalty); updates the best and what the next observation reports."""
        episode = self._episode
        episode.improvements += 1
        self._done = episode.improvements >= self.improve_attempts
        episode.last_program = episode.last_error = episode.last_auc = None
        if not result.success:
            episode.last_program, episode.last_error = program, result.error
            return self.failure_reward_of(result.failure_stage)
        gain = result.mean_auc - episode.best_auc
        if gain > 0:
            episode.best_program, episode.best_auc = program, result.mean_auc
            return gain
        episode.last_auc = result.mean_auc
        return 0.0

    def episode_state(self) -> dict[str, Any] | None:
        """The episode in progress as JSON-able values, for a checkpoint (`restore_episode` puts it back
        exactly, without running its programs again); None for the paper's episodes
        (improve_attempts 0), which a resumed run replays as before."""
        if not self.improve_attempts:
            return None
        return {"done": self._done, **dataclasses.asdict(self._episode)}

    def restore_episode(self, state: Mapping[str, Any]) -> Observation:
        """Puts back an `episode_state()` and returns its observation."""
        state = dict(state)
        self._done = bool(state.pop("done"))
        self._episode = Episode(**state)
        return self._observation()

    def score_program(self, program: str) -> CandidateResult:
        """Runs `program` (a full program defining build_model, as `info["program"]`
        holds it) in the sandbox on this dataset's five splits; no episode state
        changes.  Re-scores a kept best program exactly as training scored it."""
        session = shared_session() if self.limits.warm else None
        return evaluate_candidate(program, self.X, self.y, self.limits, self.splits, session=session)

    def close(self) -> None:
        """Nothing to release: each attempt's processes are gone when step returns, and the shared warm
        sandbox (`shared_session`) ends 2 s after the last program of any env."""


def shown_code(program: str) -> str:
    """`program` without the imports every extracted program starts with (`prompts.PRELUDE`)."""
    return program[len(prompts.PRELUDE):] if program.startswith(prompts.PRELUDE) else program
