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
"""

from __future__ import annotations

import dataclasses

import numpy as np

from envs_py.base import Observation, StepAfterDoneError, StepResult
from envs_py.datasci import prompts
from envs_py.datasci.datasets import load_dataset
from envs_py.datasci.extract import extract_program
from envs_py.datasci.sandbox import (CandidateResult, SandboxLimits, evaluate_candidate, require_sandbox,
                                     shared_session, split_indices)

DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_FAILURE_REWARD = -1.0


class DataSciEnv:
    """`datasci/<dataset>`: free-form code actions scored by ROC AUC in a sandbox.

    Args:
      dataset: a name of `envs_py.datasci.DATASET_NAMES`.
      template: "chat" (user message) or "plain" (completion prompt ending
        with the build_model header).
      max_attempts: attempts per episode before it ends in failure.
      timeout_s: wall clock of each of an attempt's 5 fits (start, imports,
        fit, predict); an attempt takes at most 5 x timeout_s.
      failure_reward: reward of a failed attempt.
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
                 code_chars: int = prompts.DEFAULT_CODE_CHARS, allow_unsandboxed: bool = False):
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.dataset = dataset
        self.template = prompts.check_template(template)
        self.max_attempts = max_attempts
        self.failure_reward = float(failure_reward)
        limits = limits or SandboxLimits()
        self.limits = dataclasses.replace(limits, wall_seconds=float(timeout_s),
                                          allow_unsandboxed=bool(allow_unsandboxed or limits.allow_unsandboxed))
        # Refuse (or warn) now, when the trainer starts, not at the first program.
        require_sandbox(self.limits)
        self.error_chars, self.code_chars = error_chars, code_chars
        self.X, self.y = load_dataset(dataset, data_dir)
        self.splits = split_indices(len(self.y))
        self._shape = (dataset, len(self.y), self.X.shape[1], len(np.unique(self.y)))
        self._attempts = 0
        self._done = True

    def _first_observation(self) -> Observation:
        return Observation(prompts.task_prompt(self.template, *self._shape))

    def reset(self, seed: int | None = None) -> Observation:
        """Starts an episode (the task is deterministic; `seed` is accepted for the API)."""
        del seed
        self._attempts = 0
        self._done = False
        return self._first_observation()

    def step(self, action: str) -> StepResult:
        """Runs the code in `action`; see the module docstring for rewards."""
        if self._done:
            raise StepAfterDoneError("episode is done; call reset() first")
        self._attempts += 1
        program = extract_program(action)
        result = self.score_program(program)
        info = {"success": result.success, "attempt": self._attempts, "program": program, "dataset": self.dataset,
                "seconds": result.seconds, "network_isolated": result.network_isolated}
        if result.success:
            self._done = True
            info["auc_per_split"] = result.auc_per_split
            return StepResult(self._first_observation(), result.mean_auc, True, info)
        info["error"] = result.error
        self._done = self._attempts >= self.max_attempts
        retry = prompts.retry_prompt(self.template, *self._shape, previous_code=program,
                                     error=result.error, error_chars=self.error_chars,
                                     code_chars=self.code_chars)
        return StepResult(Observation(retry), self.failure_reward, self._done, info)

    def score_program(self, program: str) -> CandidateResult:
        """Runs `program` (a full program defining build_model, as `info["program"]`
        holds it) in the sandbox on this dataset's five splits; no episode state
        changes.  Re-scores a kept best program exactly as training scored it."""
        session = shared_session() if self.limits.warm else None
        return evaluate_candidate(program, self.X, self.y, self.limits, self.splits, session=session)

    def close(self) -> None:
        """Nothing to release: each attempt's processes are gone when step returns, and the shared warm
        sandbox (`shared_session`) ends 2 s after the last program of any env."""
