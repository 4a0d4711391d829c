"""A study report's section on the best program each DataSciCoding cell kept (`best_program.json`,
"POAD-Best" in the paper's Table 4): per cell its mean ROC AUC over the dataset's five splits, where in
training it appeared and the scikit-learn classes it calls; with report option
`best_programs = {"rescore": True}` also the AUC of running it again in the sandbox (what `python -m
poad_jax.best_program` does; with `"repeats": n`, a program whose second run differs from its first is run
n times in all and reported by their mean); per group the mean, std and highest over seeds, of the recorded
and of the re-scored AUCs, beside the published values the option's `reference` names ({label: AUC}); then
the study's best program itself."""

from __future__ import annotations

import ast
import pathlib
from typing import Any

import numpy as np

from poad_jax.run.best_program import BestProgram, BestProgramError, read_best, rescore
from poad_jax.run.config.errors import one_line
from poad_jax.tools.study.scheduler import read_records, seed_major
from poad_jax.tools.study.spec import Study, grid, log_dir


def _dotted(node: ast.AST) -> list[str]:
    """["sklearn", "linear_model", "LogisticRegression"] for `sklearn.linear_model.LogisticRegression`;
    [] for anything but names and attributes."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return head + [node.attr] if head else []
    return []


def sklearn_classes(program: str) -> list[str]:
    """The scikit-learn classes a program calls, once each in the order of their first call
    ("LogisticRegression", "StandardScaler"): names imported from sklearn, or reached through an imported
    sklearn module, that start with a capital (functions such as roc_auc_score are left out); [] for a
    program that does not parse."""
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError):
        return []
    classes: dict[str, str] = {}  # local name -> the sklearn class it is
    modules: set[str] = set()  # local names of sklearn modules
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update((a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] == "sklearn")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sklearn":
            for alias in node.names:
                if alias.name[:1].isupper():
                    classes[alias.asname or alias.name] = alias.name
                else:  # `from sklearn import linear_model`
                    modules.add(alias.asname or alias.name)
    calls = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
    found: list[str] = []
    for call in calls:
        parts = _dotted(call.func)
        if len(parts) == 1 and parts[0] in classes:
            name = classes[parts[0]]
        elif len(parts) > 1 and parts[0] in modules and parts[-1][:1].isupper():
            name = parts[-1]
        else:
            continue
        if name not in found:
            found.append(name)
    return found


def rescored(cell_dir: pathlib.Path, repeats: int = 1) -> tuple[str, float | None]:
    """(what the report says, the AUC) of the cell's best program run again in the sandbox: once, or, when
    `repeats` > 1 and a second run differs from the first, the mean of `repeats` runs; (why, None) when it
    cannot be re-scored."""
    scores = []
    for _ in range(repeats):
        try:
            _, result = rescore(cell_dir)
        except BestProgramError as error:
            return f"not re-scored: {one_line(error)}", None
        if not result.success:
            return f"failed: {one_line(result.error)[:80]}", None
        scores.append(result.mean_auc)
        if len(scores) == 2 and scores[0] == scores[1]:
            break  # deterministic: more runs would repeat it
    if len(scores) > 2:
        mean = float(np.mean(scores))
        return f"{mean:.4f} (mean of {len(scores)}: {min(scores):.4f}-{max(scores):.4f})", mean
    return f"{scores[0]:.4f}", scores[0]


def _cell_row(name: str, best: BestProgram, steps: int | None, again: str | None) -> str:
    splits = " ".join(f"{a:.3f}" for a in best.auc_per_split)
    where = f"{best.env_steps:,}" + (f" of {steps:,}" if steps else "")
    row = [name, f"{best.mean_auc:.4f}", splits, where, ", ".join(sklearn_classes(best.program)) or "-"]
    return "| " + " | ".join(row + ([again] if again is not None else [])) + " |"


def _spread(values: list[float]) -> str:
    """"mean ± std" (sample std) of `values`, the mean alone for one."""
    return f"{np.mean(values):.4f}" + (f" ± {np.std(values, ddof=1):.4f}" if len(values) > 1 else "")


def best_programs_section(study: Study, workdir: pathlib.Path) -> list[str]:
    """Markdown lines on the cells' best programs (module docstring); [] when no cell kept one."""
    options = study.report_options.best_programs
    rescore_them, references = options.rescore, options.reference
    kept: list[tuple[Any, BestProgram]] = []
    for cell in seed_major(grid(study), study.seeds):
        try:
            best = read_best(log_dir(study, workdir, cell.name))
        except BestProgramError:
            best = None  # a damaged record: the row says nothing rather than stopping the report
        if best is not None:
            kept.append((cell, best))
    if not kept:
        return []
    header = ["cell", "best mean AUC", "AUC per split", "found at env step", "scikit-learn classes it calls"]
    if rescore_them:
        header.append("re-scored mean AUC")
    lines = ["Best programs (`best_program.json`: each cell's highest mean ROC AUC over the dataset's five "
             "splits, found while training" + ("; re-scored by running it again in the sandbox" if rescore_them
                                              else "") + "):", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    groups: dict[str, list[float]] = {}
    regroups: dict[str, list[float]] = {}
    for cell, best in kept:
        cell_dir = log_dir(study, workdir, cell.name)
        records = read_records(cell_dir)
        steps = int(records[-1].get("env_steps") or 0) if records else None
        said, again = rescored(cell_dir, options.repeats) if rescore_them else (None, None)
        lines.append(_cell_row(cell.name, best, steps, said))
        groups.setdefault(cell.group_label, []).append(best.mean_auc)
        if again is not None:
            regroups.setdefault(cell.group_label, []).append(again)
    lines += ["", "| group or reference | cells | best mean AUC, mean ± std over cells | highest |"
              + (" re-scored, mean ± std over cells |" if rescore_them else ""),
              "|---|---|---|---|" + ("---|" if rescore_them else "")]
    for label, values in groups.items():
        row = f"| {label} | {len(values)} | {_spread(values)} | {max(values):.4f} |"
        if rescore_them:
            row += f" {_spread(regroups[label]) if label in regroups else '-'} |"
        lines.append(row)
    for label, value in references.items():
        lines.append(f"| {label} | - | - | {value:.4f} |" + (" - |" if rescore_them else ""))
    cell, best = max(kept, key=lambda pair: pair[1].mean_auc)
    lines += ["", f"The study's best program so far ({cell.name}, mean AUC {best.mean_auc:.4f}, env step "
                  f"{best.env_steps:,}):", "", "```python", *best.program.rstrip().splitlines(), "```"]
    return lines
