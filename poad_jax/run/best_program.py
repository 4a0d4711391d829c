"""The best program a DataSciCoding run found ("POAD-Best" in the paper's Table 4).

`python -m poad_jax.best_program --workdir W` re-scores it on the dataset's
five splits and prints the recorded and the new AUCs.

A run directory keeps two files, both replaced atomically (write a
temporary file beside it, then `os.replace`), so a `kill -9` at any moment
leaves the previous best or the new one, never half of either:

- `best_program.json`: the authority: the program text, its mean ROC AUC and
  per-split AUCs, the environment (name and kwargs, to rebuild it for
  re-scoring), the dataset, the update and env step where it appeared, and
  the machine that scored it (`hardware.scoring_machine`: a re-score on
  another CPU may differ where an optimiser stops at its iteration cap);
- `best_program.py`: the program alone, to read or run.  Written first; when
  it disagrees with the JSON (a kill between the two writes), reading the
  record rewrites it from the JSON.

The best program survives resume as it is: it is a real program with a real,
re-scorable AUC even if the update that found it was lost to a kill (a
resumed run replays that update and, being deterministic, finds the same
program again; a strictly better score is needed to replace it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import sys
import tempfile
from typing import Any, Iterable

from poad_jax.run import hardware
from poad_jax.run.config.errors import ArgumentParser, missing_run_directory, one_line

PROGRAM_FILE = "best_program.py"
RECORD_FILE = "best_program.json"


class BestProgramError(Exception):
    """A best-program record cannot be read or re-scored (printed as one line)."""


@dataclasses.dataclass(frozen=True)
class BestProgram:
    """One scored program and where in the run it appeared."""

    program: str
    mean_auc: float
    auc_per_split: tuple[float, ...]
    env: str
    env_kwargs: dict[str, Any]
    dataset: str
    update: int
    env_steps: int
    machine: dict[str, Any] | None = None  # hardware.scoring_machine() where it was scored; None: not recorded

    def to_json(self) -> dict[str, Any]:
        record = dataclasses.asdict(self)
        record["auc_per_split"] = list(self.auc_per_split)
        record["file"] = PROGRAM_FILE
        return record

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> "BestProgram":
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in record.items() if k in fields}
        values["auc_per_split"] = tuple(float(a) for a in values.get("auc_per_split", ()))
        return cls(**values)


def write_atomically(path: pathlib.Path, text: str) -> None:
    """Replaces `path` by `text` in one step: a reader (or a kill) sees the old file or the new one."""
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(handle, 0o666 & ~_umask())  # mkstemp makes 0600; give what open() would
        with os.fdopen(handle, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        pathlib.Path(temporary).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_best(workdir: pathlib.Path, best: BestProgram) -> None:
    """Writes `best_program.py`, then the authoritative `best_program.json`."""
    header = (
        f"# Best program of this run: mean ROC AUC {best.mean_auc:.4f} on {best.dataset} "
        f"(splits {', '.join(f'{a:.4f}' for a in best.auc_per_split)}),\n"
        f"# found at update {best.update}, env step {best.env_steps}.  "
        f"Re-score: python -m poad_jax.best_program --workdir <run directory>\n"
    )
    write_atomically(workdir / PROGRAM_FILE, header + best.program.rstrip() + "\n")
    write_atomically(workdir / RECORD_FILE, json.dumps(best.to_json(), indent=2) + "\n")


def read_best(workdir: pathlib.Path) -> BestProgram | None:
    """The run's best program, or None when it has none yet.

    Repairs `best_program.py` from the JSON when a kill fell between the two
    writes.  Raises BestProgramError for an unreadable record.
    """
    path = pathlib.Path(workdir) / RECORD_FILE
    if not path.exists():
        return None
    try:
        best = BestProgram.from_json(json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError, ValueError) as error:
        raise BestProgramError(f"{path} is damaged ({error}); delete it to start a new best") from None
    program_path = path.with_name(PROGRAM_FILE)
    if not program_path.exists() or best.program.rstrip() not in program_path.read_text():
        write_best(path.parent, best)
    return best


def dataset_of(env_name: str, env_kwargs: dict[str, Any]) -> str:
    """The dataset an env name like `datasci/balance_scale` scores on."""
    return str(env_kwargs.get("dataset", env_name.split("/", 1)[-1]))


def candidates(results: Iterable[Any], first_env_step: int) -> list[tuple[float, tuple[float, ...], str, int, str | None]]:
    """(mean AUC, per-split AUCs, program, env step, dataset) of each step that ran a program.

    `results` are one vector step's StepResults; thread b's step is env step
    `first_env_step + b + 1`.  Steps without a scored program are skipped,
    so any environment can be offered (only DataSciCoding has programs).  A
    program's mean AUC is `info["auc"]` (in an improvement episode its reward
    is its gain over the episode's best), else its reward (older envs).
    """
    found = []
    for b, result in enumerate(results):
        info = result.info
        if info.get("success") and "program" in info and info.get("auc_per_split"):
            aucs = tuple(float(a) for a in info["auc_per_split"])
            mean = float(info.get("auc", result.reward))
            if math.isfinite(mean):
                found.append((mean, aucs, str(info["program"]), first_env_step + b + 1, info.get("dataset")))
    return found


class BestProgramKeeper:
    """Keeps the best program of a run directory up to date as steps come in."""

    def __init__(self, workdir: pathlib.Path, env_name: str, env_kwargs: dict[str, Any]):
        self.workdir = pathlib.Path(workdir)
        self.env_name = env_name
        self.env_kwargs = dict(env_kwargs)
        self.best = read_best(self.workdir)

    def offer(self, results: Iterable[Any], first_env_step: int, update: int) -> bool:
        """Writes the best of `results` if it beats the kept program; True when it did."""
        improved = False
        for mean, aucs, program, env_step, dataset in candidates(results, first_env_step):
            if self.best is None or mean > self.best.mean_auc:
                self.best = BestProgram(
                    program=program, mean_auc=mean, auc_per_split=aucs, env=self.env_name,
                    env_kwargs=self.env_kwargs, dataset=dataset or dataset_of(self.env_name, self.env_kwargs),
                    update=int(update), env_steps=int(env_step), machine=hardware.scoring_machine(),
                )
                improved = True
        if improved:
            write_best(self.workdir, self.best)
        return improved


def rescore(workdir: pathlib.Path):
    """(kept BestProgram, CandidateResult of running it again on the same five splits)."""
    import envs_py

    workdir = pathlib.Path(workdir)
    if (missing := missing_run_directory(workdir)) is not None:
        raise BestProgramError(missing)
    best = read_best(workdir)
    if best is None and not (workdir / "config.json").exists():
        raise BestProgramError(f"{workdir} is not a run directory (no config.json)")
    if best is None:
        raise BestProgramError(f"{workdir} holds no {RECORD_FILE} (no program has run successfully yet)")
    try:
        env = envs_py.make(best.env, **best.env_kwargs)
    except Exception as error:  # an env that cannot be rebuilt here: say which and why
        raise BestProgramError(f"cannot rebuild environment {best.env!r}: {one_line(error)}") from None
    try:
        return best, env.score_program(best.program)
    finally:
        env.close()


def summary_lines(best: BestProgram | None, workdir: pathlib.Path) -> list[str]:
    """What the end-of-run summary says about the best program."""
    if best is None:
        return ["best program: none yet (no program ran successfully)"]
    splits = " ".join(f"{a:.3f}" for a in best.auc_per_split)
    return [
        f"best program: {pathlib.Path(workdir) / PROGRAM_FILE}: mean ROC AUC {best.mean_auc:.4f} on "
        f"{best.dataset} (splits {splits}), found at update {best.update}, env step {best.env_steps}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m poad_jax.best_program", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Re-scores the best program a DataSciCoding run kept (best_program.py in its run\n"
                    "directory) on its dataset's five splits, in the sandbox, and prints the recorded and\n"
                    "the new ROC AUCs.",
        epilog="example:\n  python -m poad_jax.best_program --workdir=runs/datasci-poad-20261124-230041")
    parser.add_argument("--workdir", required=True, help="run directory written by poad_jax.train")
    args = parser.parse_args(argv)
    try:
        best, result = rescore(pathlib.Path(args.workdir))
    except BestProgramError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"program: {pathlib.Path(args.workdir) / PROGRAM_FILE} ({best.dataset}, update {best.update}, "
          f"env step {best.env_steps})")
    print(f"recorded: mean AUC {best.mean_auc:.4f}  splits {' '.join(f'{a:.4f}' for a in best.auc_per_split)}")
    if not result.success:
        print(f"error: the program failed when re-run: {one_line(result.error)[:300]}", file=sys.stderr)
        return 1
    print(f"re-run:   mean AUC {result.mean_auc:.4f}  splits {' '.join(f'{a:.4f}' for a in result.auc_per_split)}")
    if note := machine_note(best, result.auc_per_split):
        print(note)
    return 0


def machine_note(best: BestProgram, rescored: tuple[float, ...]) -> str | None:
    """A line on why a re-score differs from the record when another machine (or one not recorded) scored
    it; None when they agree or the same machine scored both (then only the program's own randomness,
    such as an unseeded random forest, moves its score)."""
    if tuple(rescored) == tuple(best.auc_per_split):
        return None
    here = hardware.scoring_machine()
    if best.machine == here:
        return None
    where = (f"on {best.machine.get('cpu')} ({', '.join(best.machine.get('isa', [])) or 'no AVX'})"
             if best.machine else "on a machine the record does not name")
    return (f"note: the record was scored {where}; here {here['cpu']} ({', '.join(here['isa']) or 'no AVX'}). "
            "A program whose optimiser stops at its iteration cap (lbfgs) scores slightly differently on "
            "another CPU.")


if __name__ == "__main__":
    sys.exit(main())
