"""`actions.jsonl`: every env step's action and what the env made of it (`config.log_actions`).

One JSON line per env step: the update that sampled it, the env step (1-based, the run's count),
the thread, the action's text, the reward, whether the episode ended, and the env's `info` cut to
JSON-safe values (DataSciCoding: the extracted program, the attempt, the error or the AUC per
split).  It answers "what does the policy write now?", which metrics cannot: e.g. the programs at
the start of a run against those at its end.  A resumed run first drops the lines of updates after
its checkpoint, so no env step is logged twice.
"""

from __future__ import annotations

import json
import math
import pathlib
from typing import Any, Iterable, Sequence

from poad_jax.run.logfiles import read_log_text

ACTIONS_FILE = "actions.jsonl"
TEXT_CHARS = 4000  # an action or info string longer than this is cut (a runaway generation)


def jsonable(value: Any) -> Any:
    """`value` as JSON keeps it: str (cut to TEXT_CHARS), bool, int, finite float (NaN/inf as None),
    lists and dicts of those; anything else as its type's name in angle brackets."""
    if isinstance(value, str):
        return value if len(value) <= TEXT_CHARS else value[:TEXT_CHARS] + f"... [{len(value) - TEXT_CHARS} more]"
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if hasattr(value, "item") and getattr(value, "shape", None) == ():  # a NumPy scalar
        return jsonable(value.item())
    if isinstance(value, (list, tuple)) or hasattr(value, "tolist"):
        return [jsonable(v) for v in (value.tolist() if hasattr(value, "tolist") else value)]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    return f"<{type(value).__name__}>"


def action_lines(update: int, first_env_step: int, actions: Sequence[str], results: Iterable[Any]) -> list[dict]:
    """One line per thread b: env step `first_env_step + b + 1`, its action, reward, done and info."""
    return [{"update": int(update), "env_step": int(first_env_step) + b + 1, "thread": b, "action": jsonable(action),
             "reward": jsonable(float(result.reward)), "done": bool(result.done), "info": jsonable(dict(result.info))}
            for b, (action, result) in enumerate(zip(actions, results, strict=True))]


class ActionLog:
    """Appends `action_lines` to `<workdir>/actions.jsonl` when `enabled`; a process other than 0
    (`primary=False`) touches nothing."""

    def __init__(self, workdir: str | pathlib.Path, enabled: bool, primary: bool = True):
        self.path = pathlib.Path(workdir) / ACTIONS_FILE
        self.enabled, self.primary = enabled, primary

    def append(self, update: int, first_env_step: int, actions: Sequence[str], results: Iterable[Any]) -> None:
        if not (self.enabled and self.primary):
            return
        with open(self.path, "a") as f:
            for line in action_lines(update, first_env_step, actions, results):
                f.write(json.dumps(line) + "\n")

    def truncate_after(self, update: int) -> None:
        """Drops the lines of updates > `update` (a killed run's update in flight), atomically; also
        with logging off, so that a later run that turns it on again repeats no env step."""
        if not self.primary or not self.path.exists():
            return
        lines = self.path.read_text().splitlines()
        kept = [line for line in lines if line.strip() and _update_of(line) <= update]
        if len(kept) != len(lines):
            temporary = self.path.with_name(self.path.name + ".tmp")
            temporary.write_text("".join(line + "\n" for line in kept))
            temporary.replace(self.path)


def _update_of(line: str) -> int:
    """A line's update; a line cut by a kill mid-write counts as after every checkpoint."""
    try:
        return int(json.loads(line)["update"])
    except (ValueError, KeyError, TypeError):
        return 1 << 62


def read_actions(workdir: str | pathlib.Path) -> list[dict]:
    """Every line of a run directory's `actions.jsonl`, or of the `actions.jsonl.gz` a raw snapshot
    keeps (`logfiles.read_log_text`); [] without either."""
    text = read_log_text(pathlib.Path(workdir) / ACTIONS_FILE)
    if text is None:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]
