"""Episode bookkeeping: each thread's running return, the finished episodes'
history, step counters, and their summaries in an update's record.

`EpisodeStats` is kept by the rollout collector across updates and saved in
checkpoints (`state_dict`); over several processes the run's history is every
process's merged (`merge_episode_states`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass
class EpisodeStats:
    """Per-thread running episode return, finished-episode history, and step counters.

    The step counters say what happened before any episode ends (a
    DataSciCoding episode lasts up to 5 attempts): `steps` env steps,
    `succeeded_steps` of them with `info["success"]` (programs that ran),
    `reward_sum` of their rewards, `success_reward_sum` of the successful
    steps' rewards (DataSciCoding: their AUCs), `best_success_reward` the
    best reward of a successful step (the best AUC), and `failure_kinds` how often each
    kind of failure (the error's exception name) occurred.

    A step's score is `info["auc"]` where the env gives one (DataSciCoding: the
    program's ROC AUC, which in improvement episodes is not its reward), else
    its reward; the success sums and the best use the score.  An episode's
    success is its last step's `info["episode_success"]` where given (an
    improvement episode succeeded if any of its programs ran), else that
    step's `info["success"]`.  DataSciCoding's programs also leave
    `failure_stages` (failures by the stage they reached, `info["failure_stage"]`),
    `estimator_counts` (programs by the estimator class they return,
    `info["estimator"]`), `programs` (steps whose info has an `estimator` entry: programs written)
    and `finished_best` (each finished episode's `info["episode_best_auc"]`,
    None where absent).
    """

    running_return: list[float]
    # The paper's metric (Appendix H): sum_k discount^k r_k over an episode's env steps.
    discount: float = 0.95
    running_discounted: list[float] = dataclasses.field(default_factory=list)
    running_length: list[int] = dataclasses.field(default_factory=list)
    finished_discounted: list[float] = dataclasses.field(default_factory=list)
    finished_returns: list[float] = dataclasses.field(default_factory=list)
    finished_success: list[bool] = dataclasses.field(default_factory=list)
    finished_env_steps: list[int] = dataclasses.field(default_factory=list)
    steps: int = 0
    succeeded_steps: int = 0
    reward_sum: float = 0.0
    success_reward_sum: float = 0.0
    best_success_reward: float | None = None
    failure_kinds: dict[str, int] = dataclasses.field(default_factory=dict)
    failure_stages: dict[str, int] = dataclasses.field(default_factory=dict)
    estimator_counts: dict[str, int] = dataclasses.field(default_factory=dict)
    programs: int = 0
    finished_best: list[float | None] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        threads = len(self.running_return)
        self.running_discounted = list(self.running_discounted) or [0.0] * threads
        self.running_length = list(self.running_length) or [0] * threads

    def record_step(self, thread: int, reward: float, done: bool, info: dict[str, Any], env_steps: int) -> None:
        """Adds one env step of `thread` (`env_steps`: the run's count once this step is done)."""
        self.steps += 1
        self.reward_sum += reward
        self.running_return[thread] += reward
        self.running_discounted[thread] += self.discount ** self.running_length[thread] * reward
        self.running_length[thread] += 1
        if info.get("success", False):
            score = float(info.get("auc", reward))
            self.succeeded_steps += 1
            self.success_reward_sum += score
            if self.best_success_reward is None or score > self.best_success_reward:
                self.best_success_reward = score
        elif info.get("error"):
            kind = failure_kind(str(info["error"]))
            self.failure_kinds[kind] = self.failure_kinds.get(kind, 0) + 1
        self._count_program(info)
        if done:
            self._finish(thread, bool(info.get("episode_success", info.get("success", False))), env_steps,
                         info.get("episode_best_auc"))

    def _count_program(self, info: dict[str, Any]) -> None:
        """Counts a program's failure stage and estimator class (DataSciCoding's info; nothing elsewhere)."""
        stage = info.get("failure_stage")
        if stage:
            self.failure_stages[str(stage)] = self.failure_stages.get(str(stage), 0) + 1
        if "estimator" in info:
            self.programs += 1
            if info["estimator"]:
                name = str(info["estimator"])
                self.estimator_counts[name] = self.estimator_counts.get(name, 0) + 1

    def end_episode(self, thread: int, env_steps: int) -> None:
        """Ends `thread`'s episode in progress without a terminal step (an episodic rollout cut it off at
        its length): it counts as finished, unsuccessful, with the return it earned so far."""
        if self.running_length[thread]:
            self._finish(thread, False, env_steps)

    def _finish(self, thread: int, success: bool, env_steps: int, best: float | None = None) -> None:
        self.finished_best.append(None if best is None else float(best))
        self.finished_returns.append(self.running_return[thread])
        self.finished_discounted.append(self.running_discounted[thread])
        self.finished_success.append(success)
        self.finished_env_steps.append(int(env_steps))
        self.running_return[thread] = 0.0
        self.running_discounted[thread] = 0.0
        self.running_length[thread] = 0

    def restore_running(self, returns: list[float], discounted: list[float], lengths: list[int]) -> None:
        """The episodes in progress' running return, discounted return and length (a resume)."""
        self.running_return = [float(r) for r in returns]
        self.running_discounted = [float(r) for r in discounted]
        self.running_length = [int(n) for n in lengths]

    def counters(self) -> tuple[int, int, float, float]:
        """(steps, succeeded_steps, reward_sum, success_reward_sum): a snapshot for `step_summary`."""
        return self.steps, self.succeeded_steps, self.reward_sum, self.success_reward_sum

    def state_dict(self) -> dict[str, Any]:
        """The history a resumed run needs (JSON-able; running returns restart with the episodes)."""
        return {
            "finished_returns": list(self.finished_returns),
            "finished_discounted": list(self.finished_discounted),
            "finished_success": list(self.finished_success),
            "finished_env_steps": list(self.finished_env_steps),
            "steps": self.steps,
            "succeeded_steps": self.succeeded_steps,
            "reward_sum": self.reward_sum,
            "success_reward_sum": self.success_reward_sum,
            "best_success_reward": self.best_success_reward,
            "failure_kinds": dict(self.failure_kinds),
            "failure_stages": dict(self.failure_stages),
            "estimator_counts": dict(self.estimator_counts),
            "programs": self.programs,
            "finished_best": list(self.finished_best),
        }

    def program_tallies(self) -> tuple[int, dict[str, int], dict[str, int]]:
        """(programs, estimator counts, failure stage counts): a snapshot for `program_summary`."""
        return self.programs, dict(self.estimator_counts), dict(self.failure_stages)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores `state_dict()`; fields absent from older checkpoints keep their defaults."""
        self.finished_returns = list(state.get("finished_returns", []))
        # Older checkpoints did not record discounted returns: unknown (NaN, left out of means).
        self.finished_discounted = list(state.get("finished_discounted", [float("nan")] * len(self.finished_returns)))
        self.finished_success = list(state.get("finished_success", []))
        # Older checkpoints did not record where episodes ended: unknown (-1).
        self.finished_env_steps = list(state.get("finished_env_steps", [-1] * len(self.finished_returns)))
        self.steps = int(state.get("steps", 0))
        self.succeeded_steps = int(state.get("succeeded_steps", 0))
        self.reward_sum = float(state.get("reward_sum", 0.0))
        self.success_reward_sum = float(state.get("success_reward_sum", 0.0))
        self.best_success_reward = state.get("best_success_reward")
        self.failure_kinds = dict(state.get("failure_kinds", {}))
        self.failure_stages = dict(state.get("failure_stages", {}))
        self.estimator_counts = dict(state.get("estimator_counts", {}))
        self.programs = int(state.get("programs", 0))
        self.finished_best = list(state.get("finished_best", [None] * len(self.finished_returns)))
        threads = len(self.running_return)
        self.restore_running([0.0] * threads, [0.0] * threads, [0] * threads)



def merge_episode_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's episode history from its processes' `EpisodeStats.state_dict()`s.

    Finished episodes are ordered by the env step they ended at (with env
    step numbers of `RolloutCollector.take_thread_block`, the order one
    process stepping every thread records them; a stable sort, so ties and
    unknown steps keep process order); counters and failure counts are
    summed; the best successful reward is the maximum.  One state comes back
    as it is.
    """
    if len(states) == 1:
        return states[0]
    def column(state, name, default):
        return state.get(name, [default] * len(state.get("finished_returns", [])))

    episodes = [episode for state in states for episode in zip(
        column(state, "finished_env_steps", -1), state.get("finished_returns", []),
        state.get("finished_success", []), column(state, "finished_discounted", float("nan")),
        column(state, "finished_best", None))]
    episodes.sort(key=lambda episode: episode[0])
    bests = [s["best_success_reward"] for s in states if s.get("best_success_reward") is not None]
    return {
        "finished_returns": [e[1] for e in episodes],
        "finished_success": [e[2] for e in episodes],
        "finished_discounted": [e[3] for e in episodes],
        "finished_env_steps": [e[0] for e in episodes],
        "steps": sum(int(s.get("steps", 0)) for s in states),
        "succeeded_steps": sum(int(s.get("succeeded_steps", 0)) for s in states),
        "reward_sum": sum(float(s.get("reward_sum", 0.0)) for s in states),
        "success_reward_sum": sum(float(s.get("success_reward_sum", 0.0)) for s in states),
        "best_success_reward": max(bests) if bests else None,
        "failure_kinds": summed_counts(states, "failure_kinds"),
        "failure_stages": summed_counts(states, "failure_stages"),
        "estimator_counts": summed_counts(states, "estimator_counts"),
        "programs": sum(int(s.get("programs", 0)) for s in states),
        "finished_best": [e[4] for e in episodes],
    }


def summed_counts(states: list[dict[str, Any]], name: str) -> dict[str, int]:
    """The counts `name` ({kind: count}) of every state, summed per kind."""
    total: dict[str, int] = {}
    for state in states:
        for kind, count in state.get(name, {}).items():
            total[kind] = total.get(kind, 0) + int(count)
    return total



def failure_kind(error: str) -> str:
    """The exception name an error message reports ("NameError", "TimeoutError"), else "other".

    Looks for the last line of the form `SomethingError: ...` (a traceback's
    verdict), so a retry prompt can be summarised as counts of kinds.
    """
    for line in reversed(error.strip().splitlines()):
        head = line.split(":", 1)[0].strip().split(".")[-1]
        if head.isidentifier() and (head.endswith("Error") or head.endswith("Exception") or head == "KeyboardInterrupt"):
            return head
    return "other"



def episode_summary(stats: EpisodeStats, since: int, window: int = 100) -> dict[str, float]:
    """Return and success of the episodes finished since index `since` (this
    rollout), and over the last `window` finished episodes."""
    def mean(values):
        known = [v for v in values if not np.isnan(v)]
        return float(np.mean(known)) if known else float("nan")

    return {
        "episodes": len(stats.finished_returns),
        "episode_return": mean(stats.finished_returns[since:]),
        "discounted_return": mean(stats.finished_discounted[since:]),
        "success_rate": mean(stats.finished_success[since:]),
        f"episode_return_last{window}": mean(stats.finished_returns[-window:]),
        f"discounted_return_last{window}": mean(stats.finished_discounted[-window:]),
        f"success_rate_last{window}": mean(stats.finished_success[-window:]),
    }



def step_summary(stats: EpisodeStats, before: tuple[int, int, float]) -> dict[str, Any]:
    """What the env steps since `before = stats.counters()` did: how many, how
    many succeeded (DataSciCoding: programs that ran), the mean reward of all
    of them and of the successful ones (the mean AUC of the programs that
    ran; NaN when none did), and the best successful step's reward so far
    (None before the first success)."""
    steps, succeeded, reward_sum, success_sum = (now - then for now, then in zip(stats.counters(), before))
    return {
        "steps_succeeded": int(succeeded),
        "step_reward_mean": float(reward_sum / steps) if steps else float("nan"),
        "success_reward_mean": float(success_sum / succeeded) if succeeded else float("nan"),
        "steps_succeeded_total": stats.succeeded_steps,
        "best_step_reward": stats.best_success_reward,
    }



def program_summary(stats: EpisodeStats, before: tuple[int, dict[str, int], dict[str, int]]) -> dict[str, Any]:
    """What the programs written since `before = stats.program_tallies()` were (DataSciCoding; {} for
    a run whose env names no estimators): `distinct_estimators`, how many estimator classes they
    returned, and `failures_<stage>` for every stage a failure of the run has reached so far."""
    _, estimators, stages = before
    if not stats.programs:
        return {}
    grew = [name for name, count in stats.estimator_counts.items() if count > estimators.get(name, 0)]
    record: dict[str, Any] = {"distinct_estimators": len(grew)}
    for stage in sorted(stats.failure_stages):
        record[f"failures_{stage}"] = stats.failure_stages[stage] - stages.get(stage, 0)
    return record
