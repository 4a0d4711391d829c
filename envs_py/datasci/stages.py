"""How far a failing program got (its stage), and the graded penalty of each stage.

A program's path through the sandbox, in order, and the stage a failure on
it is reported as (`CandidateResult.failure_stage`, `info["failure_stage"]`):

  extract        the text holds no program that compiles, or it defines no
                 `build_model` function
  import         the module-level code (its imports among it) raised
  build          `build_model` raised, or returned None
  limit          a limit ended it: the wall clock, CPU time, memory
                 (MemoryError), the output cap, or the process died without
                 a result (killed); wherever it happened
  predict_proba  the returned object has no `predict_proba`, or it raised
  proba          the probabilities are malformed: not a numeric array of one
                 row per test row and one column per class the model knows,
                 a class the data does not have, NaN or infinite values, or
                 more bytes than such an array

The runner (`_runner.py`, which imports nothing of this package) names the
stage it failed in; this module is the list a reported name is checked
against.  A status that names none of them counts as `extract`, the
harshest.

The graded penalties (`graded_failures=True`) are fractions of the
paper's constant `failure_reward` (-1): a program earns less of a penalty the
further it got, in even steps along the path.  A limit counts as a failure
while building: limits are almost always hit in the fit, and a program that
runs past its clock must not earn more than one that raises (it also costs the
most wall time).  The malformed probabilities of a dummy classifier earn
-0.2, less than any program that runs (its ROC AUC is >= 0 and a constant
classifier's is 0.5).
"""

from __future__ import annotations

from typing import Mapping

STAGES = ("extract", "import", "build", "limit", "predict_proba", "proba")
# Each stage's penalty as a fraction of `failure_reward` (with the paper's -1: -1, -0.8, ..., -0.2).
DEFAULT_LADDER = {"extract": 1.0, "import": 0.8, "build": 0.6, "limit": 0.6, "predict_proba": 0.4, "proba": 0.2}


def known_stage(name) -> str:
    """`name` when it is one of STAGES, else "extract" (a status that names no stage we know)."""
    return name if name in STAGES else "extract"


def parse_failure_rewards(value: Mapping[str, float] | str | None) -> dict[str, float]:
    """{stage: reward} from a mapping, or from a string such as "limit=-0.5,proba=-0.1" (what a
    command-line override can hold); "" and None give {}.  Raises ValueError (one line) for an
    unknown stage or a value that is not a number."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        pairs = [part.split("=", 1) for part in value.split(",") if part.strip()]
        if any(len(pair) != 2 for pair in pairs):
            raise ValueError(f"failure_rewards {value!r} must read stage=reward[,stage=reward...]")
        value = {stage.strip(): reward.strip() for stage, reward in pairs}
    unknown = sorted(str(stage) for stage in value if stage not in STAGES)
    if unknown:
        raise ValueError(f"failure_rewards names unknown stage(s) {', '.join(unknown)}; "
                         f"the stages are {', '.join(STAGES)}")
    try:
        return {stage: float(reward) for stage, reward in value.items()}
    except (TypeError, ValueError):
        raise ValueError(f"failure_rewards {dict(value)!r} must map stages to numbers") from None


def stage_rewards(failure_reward: float, graded: bool,
                  overrides: Mapping[str, float] | str | None = None) -> dict[str, float] | None:
    """{stage: reward of a failure there}, or None when failures are not graded (each earns
    `failure_reward`).  Graded: DEFAULT_LADDER times `failure_reward`, with `overrides` (absolute
    rewards) in place of the stages they name; each must lie between `failure_reward` and 0.
    Raises ValueError (one line) for overrides without `graded`, unknown stages, or rewards out of range."""
    named = parse_failure_rewards(overrides)
    if not graded:
        if named:
            raise ValueError("failure_rewards needs graded_failures=True (without it every failure "
                             "earns failure_reward)")
        return None
    rewards = {stage: fraction * failure_reward for stage, fraction in DEFAULT_LADDER.items()}
    rewards.update(named)
    low = min(failure_reward, 0.0)
    outside = sorted(f"{stage}={reward:g}" for stage, reward in rewards.items() if not low <= reward <= 0.0)
    if outside:
        raise ValueError(f"failure rewards must lie between failure_reward ({failure_reward:g}) and 0; "
                         f"got {', '.join(outside)}")
    return rewards
