"""A study report's section on what its cells' policies wrote, from each cell's `actions.jsonl`
(`config.log_actions`): per cell, the first and the last part of its env steps side by side (how
many steps succeeded, their mean reward, the commonest errors, how long the actions were and, for
DataSciCoding's programs, the scikit-learn classes the runnable ones call) and one
action of each kind from each part, e.g. a program that ran and one that failed, with its AUC or
its error."""

from __future__ import annotations

import collections
import pathlib
from typing import Any

import numpy as np

from poad_jax.agent.episodes import failure_kind
from poad_jax.run.action_log import read_actions
from poad_jax.tools.study.programs import sklearn_classes
from poad_jax.tools.study.scheduler import seed_major
from poad_jax.tools.study.spec import StepNames, Study, grid, log_dir

SHOWN_LINES = 30  # an example action longer than this is cut in the report


def error_kind(error: str | None) -> str:
    """The exception's name of an error text, as the run's metrics count it (`episodes.failure_kind`:
    the last line naming one, as a traceback ends); where none is named, the text's first line cut to
    60 characters instead of "other"; "" for no error."""
    if not error:
        return ""
    kind = failure_kind(str(error))
    if kind != "other":
        return kind
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0][:60] if lines else ""


def succeeded(line: dict[str, Any]) -> bool:
    """Whether an env step succeeded, as the run's metrics count it (`steps_succeeded`): its info's
    `success` (DataSciCoding: the program ran)."""
    return bool((line.get("info") or {}).get("success", False))


def windows(lines: list[dict[str, Any]], fraction: float) -> tuple[list[dict], list[dict]]:
    """(the lines of the first `fraction` of the logged env steps, those of the last `fraction`), by
    env step; the two do not overlap (a short log gives each half at most)."""
    ordered = sorted(lines, key=lambda line: line["env_step"])
    count = max(1, min(len(ordered) // 2, int(round(fraction * len(ordered))))) if ordered else 0
    return ordered[:count], ordered[len(ordered) - count:] if count else []


def step_score(line: dict[str, Any]) -> float | None:
    """A successful step's own score: the env's `info["auc"]` where it reports one (DataSciCoding; in an
    improvement episode the reward is the gain over the episode's best so far, not the program's AUC),
    else its reward."""
    auc = (line.get("info") or {}).get("auc")
    return float(auc) if auc is not None else line.get("reward")


def window_row(lines: list[dict[str, Any]], top: int = 3) -> dict[str, Any]:
    """Steps, successes, the successes' mean score (`step_score`), the commonest error kinds, the mean action
    length and the commonest scikit-learn classes the successes' programs call (each counted once per program)."""
    ran = [line for line in lines if succeeded(line)]
    classes = collections.Counter(name for line in ran
                                  for name in sklearn_classes(str((line.get("info") or {}).get("program") or "")))
    errors = collections.Counter(error_kind((line.get("info") or {}).get("error")) for line in lines
                                 if not succeeded(line))
    errors.pop("", None)
    rewards = [score for score in map(step_score, ran) if score is not None]
    return {"steps": len(lines), "succeeded": len(ran), "mean_reward": float(np.mean(rewards)) if rewards else float("nan"),
            "errors": errors.most_common(top), "classes": classes.most_common(top),
            "length": float(np.mean([len(line.get("action") or "") for line in lines])) if lines else float("nan")}


def _shown(line: dict[str, Any]) -> list[str]:
    """One example action as a fenced block with what it earned."""
    info = line.get("info") or {}
    text = str(info.get("program") or line.get("action") or "")
    rows = text.splitlines()
    if len(rows) > SHOWN_LINES:
        rows = rows[:SHOWN_LINES] + [f"# ... {len(rows) - SHOWN_LINES} more lines"]
    outcome = (f"reward {line['reward']:.3f}" if succeeded(line) and line.get("reward") is not None
               else f"failed: {error_kind(info.get('error')) or 'reward ' + str(line.get('reward'))}")
    return [f"env step {line['env_step']} (update {line['update']}), {outcome}:", "", "```python", *rows, "```", ""]


def actions_section(study: Study, workdir: pathlib.Path, fraction: float) -> list[str]:
    """Markdown lines: a table of each logged cell's first and last `fraction` of env steps, then per
    cell one action that succeeded and one that failed from each part; [] when no cell logged actions."""
    names = study.report_options.steps or StepNames()
    done, reward = names.succeeded, names.reward
    logs = {cell.name: lines for cell in seed_major(grid(study), study.seeds)
            if (lines := read_actions(log_dir(study, workdir, cell.name)))}
    programs = any((line.get("info") or {}).get("program") for lines in logs.values() for line in lines)
    table = [f"What the policies wrote (`actions.jsonl`): each cell's first and last {fraction:.0%} of logged env "
             "steps:", "", f"| cell | part | env steps | {done} | mean {reward} of {done} | commonest errors | "
             "mean length (chars) |" + (f" classes the {done} programs call |" if programs else ""),
             "|" + "---|" * (8 if programs else 7)]
    examples: list[str] = []
    for name, lines in logs.items():
        first, last = windows(lines, fraction)
        shown = []
        for part, chosen in (("first", first), ("last", last)):
            row = window_row(chosen)
            span = f"{chosen[0]['env_step']:,}-{chosen[-1]['env_step']:,}"
            errors = ", ".join(f"{kind} ({count})" for kind, count in row["errors"]) or "-"
            mean = "-" if np.isnan(row["mean_reward"]) else f"{row['mean_reward']:.3f}"
            classes = ", ".join(f"{cls} ({count})" for cls, count in row["classes"]) or "-"
            table.append(f"| {name} | {part} | {span} | {row['succeeded']} of {row['steps']} | {mean} | "
                         f"{errors} | {row['length']:.0f} |" + (f" {classes} |" if programs else ""))
            for wanted in (True, False):
                example = next((line for line in chosen if succeeded(line) == wanted), None)
                if example is not None:
                    shown += _shown(example)
        examples += ["<details><summary>" + name + ": examples from its first and last part</summary>", "",
                     *shown, "</details>", ""]
    return table + [""] + examples if examples else []
