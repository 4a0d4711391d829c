"""`python -m poad_jax.study --study=studies/<name>.py [--workdir=W] [--workers=N] [--report]`

Runs a grid of training runs ("cells") and aggregates them into learning
curves with seed bands and a table of final results.

A study file defines `get_study()` returning a dict (config fields are
dotted paths, which ConfigDict keys cannot hold):

    name="gamma_w",                           # names the study (and its default workdir)
    base_config="configs/synthetic.py",       # relative to the repository root or the study file
    fixed={"total_env_steps": 4800},          # overrides applied to every cell
    axes={                                    # the grid: an ordered mapping axis -> values
        "variant": [                          # a value may be a dict of coupled overrides ...
            {"label": "POAD", "method": "poad"},
            {"label": "NTPO 0.9", "method": "ntpo", "gamma_w": 0.9},
        ],
        "env.kwargs.action_length": [2, 4, 8],  # ... or a scalar for the axis's own field
    },
    seeds=(0, 1, 2, 3, 4),
    report={"metric": "episode_return", "threshold": 3.5, "smoothing": 5,   # all optional
            "facet": "env.kwargs.action_length", "heatmap": ("variant", "env.kwargs.action_length"),
            "theory": "poad_jax.tools.theory:save_or_take_optimum",
            "steps": {"succeeded": "runnable", "reward": "AUC"}},  # a table of succeeded steps per cell

Each cell is an ordinary run directory of `poad_jax.train` (`<workdir>/cells/<cell>`),
run as its own process, so checkpoints, metrics and resume are the trainer's.
Re-running the same command skips finished cells and resumes the others; a
`kill -9` of the runner kills its trainers with it (they lose at most the
update in flight).  A finished cell whose trainer config equals a cell's
(in a sibling study's workdir: `runs/studies/*`) is reused, as a symlink,
instead of being run again.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import fcntl
import importlib
import itertools
import json
import math
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
import warnings
from typing import Any

import ml_collections
import numpy as np

from poad_jax.run import config as config_lib
from poad_jax.run.metrics import read_metrics

REPO = pathlib.Path(__file__).resolve().parents[2]
STUDY_FILE = "study.json"
CELL_FILE = "cell.json"


class StudyError(Exception):
    """A user error in a study file, its grid or its workdir (printed as one line)."""


# ---------------------------------------------------------------------------
# The study file and its grid.


@dataclasses.dataclass(frozen=True)
class Cell:
    """One run of the grid: its directory name, group label, seed and config overrides.

    `config_argument`: the base config file's argument for this cell (a variant's
    `"config_argument": "twosome"` runs `--config=<base>:twosome`, e.g. a preset
    that holds per-method settings); None for the plain file.
    """

    name: str
    group: tuple[tuple[str, str], ...]  # (axis, value label) for every axis, in axis order
    seed: int
    overrides: dict[str, Any]
    config_argument: str | None = None

    def base_config(self, study: "Study") -> str:
        """The `--config=` value of this cell: the study's base config [with its argument]."""
        return str(study.base_config) + (f":{self.config_argument}" if self.config_argument else "")

    @property
    def group_label(self) -> str:
        return ", ".join(label for _, label in self.group)


@dataclasses.dataclass
class Study:
    name: str
    path: pathlib.Path
    base_config: pathlib.Path
    fixed: dict[str, Any]
    axes: dict[str, list[Any]]
    seeds: tuple[int, ...]
    report: dict[str, Any]

    def identity(self) -> dict[str, Any]:
        """What a workdir records to recognise its study: its name and base config,
        the latter relative to the repository when inside it (a moved clone still matches)."""
        try:
            base = self.base_config.relative_to(REPO).as_posix()
        except ValueError:
            base = str(self.base_config)
        return {"name": self.name, "base_config": base}

    def recorded_in(self, recorded: dict[str, Any] | None) -> bool:
        """True if `recorded` (a workdir's study.json) is this study's, from this or another
        checkout (older workdirs recorded the base config's absolute path)."""
        mine, theirs = self.identity(), (recorded or {}).get("identity") or {}
        base = str(theirs.get("base_config", ""))
        return theirs.get("name") == mine["name"] and (base == mine["base_config"]
                                                       or base.endswith("/" + mine["base_config"]))


def _plain(value: Any) -> Any:
    """ConfigDicts, tuples and numpy scalars -> JSON-friendly Python values."""
    if isinstance(value, ml_collections.ConfigDict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def load_study(path: str | pathlib.Path) -> Study:
    """Reads and checks a study file; raises StudyError with one line on a mistake."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise StudyError(f"no study file at {path}")
    spec = importlib.util.spec_from_file_location(f"poad_study_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # a broken study file: say where, in one line
        raise StudyError(f"cannot load study file {path}: {type(error).__name__}: {error}") from None
    if not hasattr(module, "get_study"):
        raise StudyError(f"study file {path} defines no get_study()")
    try:
        raw = _plain(module.get_study())
    except Exception as error:
        raise StudyError(f"get_study() in {path} failed: {type(error).__name__}: {error}") from None
    if not isinstance(raw, dict):
        raise StudyError(f"get_study() in {path} must return a dict (or ConfigDict), got {type(raw).__name__}")
    for field in ("name", "base_config", "axes"):
        if field not in raw:
            raise StudyError(f"study file {path}: get_study() has no {field!r}")
    base = pathlib.Path(raw["base_config"])
    if not base.is_absolute():
        candidates = [REPO / base, path.parent / base, pathlib.Path.cwd() / base]
        base = next((c for c in candidates if c.is_file()), candidates[0])
    if not base.is_file():
        raise StudyError(f"study {raw['name']!r}: base config {raw['base_config']} not found")
    axes = _plain(raw["axes"])
    if not isinstance(axes, dict) or not axes:
        raise StudyError(f"study {raw['name']!r}: axes must be a non-empty mapping of axis -> list of values")
    for axis, values in axes.items():
        if not isinstance(values, list) or not values:
            raise StudyError(f"study {raw['name']!r}: axis {axis!r} needs a non-empty list of values")
    seeds = tuple(int(s) for s in _plain(raw.get("seeds", (0,))))
    if not seeds or len(set(seeds)) != len(seeds):
        raise StudyError(f"study {raw['name']!r}: seeds must be distinct and at least one, got {seeds}")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", str(raw["name"])):
        raise StudyError(f"study name {raw['name']!r} may hold only letters, digits, '_', '.', '-'")
    return Study(
        name=str(raw["name"]), path=path.resolve(), base_config=base.resolve(),
        fixed=_plain(raw.get("fixed", {})), axes=axes, seeds=seeds, report=_plain(raw.get("report", {})),
    )


def _value_label(axis: str, value: Any) -> str:
    if isinstance(value, dict):
        if "label" in value:
            return str(value["label"])
        return " ".join(f"{k}={v}" for k, v in value.items())
    return f"{axis.split('.')[-1]}={value}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "-", text).strip("-")


def grid(study: Study) -> list[Cell]:
    """Every cell of the study: axes in order (the last varies fastest), seed innermost."""
    cells = []
    for combination in itertools.product(*study.axes.values()):
        overrides = dict(study.fixed)
        argument = None
        group = []
        for axis, value in zip(study.axes, combination):
            if isinstance(value, dict):
                argument = value.get("config_argument", argument)
                overrides.update({k: v for k, v in value.items() if k not in ("label", "config_argument")})
            else:
                overrides[axis] = value
            group.append((axis, _value_label(axis, value)))
        for seed in study.seeds:
            name = "__".join(_slug(label) for _, label in group) + f"__seed={seed}"
            cells.append(Cell(name, tuple(group), seed, {**overrides, "seed": seed}, argument))
    return cells


def _set_field(config: ml_collections.ConfigDict, field: str, value: Any) -> None:
    """config.<field> = value for a dotted field; StudyError (with a hint) if it does not exist."""
    try:
        node, last = config_lib.field_parent(config, field)
    except config_lib.UnknownFieldError as error:
        hint = f" (did you mean {error.suggestion!r}?)" if error.suggestion else ""
        raise StudyError(f"unknown config field {field!r}: {error.parent or 'the config'} has no "
                         f"{error.missing!r}{hint}") from None
    try:
        node[last] = value
    except (TypeError, ValueError) as error:
        raise StudyError(f"cannot set {field}={value!r}: {error}") from None


def cell_config(study: Study, cell: Cell) -> ml_collections.ConfigDict:
    """The base config with the cell's overrides applied (checked by the trainer's validation)."""
    base = config_lib.load_config_file(cell.base_config(study))
    config = copy.deepcopy(base)
    for field, value in cell.overrides.items():
        _set_field(config, field, value)
    try:
        config_lib.validate(config)
    except config_lib.ConfigError as error:
        raise StudyError(f"cell {cell.name}: {error}") from None
    return config


def _flag_value(value: Any) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(_flag_value(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return str(value)


def train_command(study: Study, cell: Cell, cell_dir: pathlib.Path) -> list[str]:
    """The `python -m poad_jax.train` command line that runs (or resumes) one cell."""
    args = [sys.executable, "-m", "poad_jax.train", f"--config={cell.base_config(study)}", f"--workdir={cell_dir}"]
    args += [f"--config.{field}={_flag_value(value)}" for field, value in cell.overrides.items()]
    return args


# ---------------------------------------------------------------------------
# Cell state on disk.


def read_json(path: pathlib.Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def write_json_atomic(path: pathlib.Path, data: Any) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(data, indent=2, sort_keys=True))
    temporary.replace(path)


def read_records(cell_dir: pathlib.Path) -> list[dict[str, Any]]:
    return read_metrics(cell_dir / "metrics.jsonl")


def cell_finished(cell_dir: pathlib.Path, total_env_steps: int) -> bool:
    """A cell is finished when its trainer exited cleanly and logged `total_env_steps`."""
    state = read_json(cell_dir / CELL_FILE) or {}
    if state.get("status") != "done":
        return False
    records = read_records(cell_dir)
    return bool(records) and int(records[-1].get("env_steps") or 0) >= total_env_steps


def _settings_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The changed cell settings a re-run may not change (`config.RESUMABLE_FIELDS`), as `field: old -> new`."""
    keys = sorted(set(old) | set(new))
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys
            if config_lib.resumable_kind(k) is None and old.get(k) != new.get(k)]


def _comparable(overrides: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(overrides, sort_keys=True))


def _meaning(config_dict: dict[str, Any]) -> dict[str, Any]:
    """A trainer config without the fields whose change leaves every logged number as it was
    (`config.SAME_NUMBERS`): a reused cell may differ in them."""
    return {k: v for k, v in config_dict.items() if config_lib.resumable_kind(k) not in config_lib.SAME_NUMBERS}


def _with_defaults(recorded: Any, defaults: Any) -> Any:
    """`recorded` (a cell's config.json) with the fields it lacks taken from `defaults`: a cell trained
    before a field existed ran as that field's default (e.g. `mesh` or `distributed`, added later)."""
    if not (isinstance(recorded, dict) and isinstance(defaults, dict)):
        return recorded
    merged = {k: _with_defaults(v, defaults.get(k)) for k, v in recorded.items()}
    return {**{k: v for k, v in defaults.items() if k not in recorded}, **merged}


def find_reusable(workdir: pathlib.Path, config: ml_collections.ConfigDict, total: int) -> pathlib.Path | None:
    """A finished cell in a sibling study's workdir whose trainer config equals `config`
    (output-only fields aside; fields its config.json predates count as their defaults) and that ran
    at least `total` env steps."""
    want = _meaning(json.loads(config.to_json_best_effort()))
    defaults = json.loads(config_lib.default_config().to_json_best_effort())
    for sibling in sorted(workdir.parent.glob("*/cells/*/config.json")):
        cell_dir = sibling.parent
        if cell_dir.is_symlink() or cell_dir.parent.parent.resolve() == workdir.resolve():
            continue
        recorded = read_json(sibling)
        if (isinstance(recorded, dict) and _meaning(_with_defaults(recorded, defaults)) == want
                and cell_finished(cell_dir, total)):
            return cell_dir
    return None


# ---------------------------------------------------------------------------
# Running the grid.


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the runner dies (Linux), so a
    `kill -9` of the runner leaves no trainer behind to race a re-run."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    os.setsid()


def _format_seconds(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


@contextlib.contextmanager
def study_lock(workdir: pathlib.Path):
    """One runner per workdir at a time."""
    lock_path = workdir / ".study.lock"
    handle = open(lock_path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise StudyError(f"{workdir} is in use by another study runner (pid {holder})") from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    try:
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def check_workdir(study: Study, workdir: pathlib.Path, cells: list[Cell]) -> None:
    """Raises StudyError if `workdir` holds another study, or a cell run with other settings.
    Reads only: nothing is written before the study is known to be valid."""
    if workdir.exists() and not workdir.is_dir():
        raise StudyError(f"workdir {workdir} is a file, not a directory")
    recorded = read_json(workdir / STUDY_FILE)
    if recorded is not None and not study.recorded_in(recorded):
        raise StudyError(
            f"workdir {workdir} holds study {recorded.get('identity', {}).get('name')!r} "
            f"({recorded.get('identity', {}).get('base_config')}), not {study.name!r}: choose another --workdir"
        )
    for cell in cells:  # a cell directory must not have been run with other settings
        state = read_json(workdir / "cells" / cell.name / CELL_FILE)
        if state is not None:
            diff = _settings_diff(state.get("overrides", {}), _comparable(cell.overrides))
            if diff:
                raise StudyError(f"cell {cell.name} in {workdir} was run with other settings ({'; '.join(diff)}): "
                                 f"choose another --workdir")


def prepare_workdir(study: Study, workdir: pathlib.Path, cells: list[Cell]) -> None:
    """Checks `workdir` (`check_workdir`), then creates it and records the study in it."""
    check_workdir(study, workdir, cells)
    try:
        (workdir / "cells").mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise StudyError(f"cannot create workdir {workdir}: {error.strerror}") from None
    sessions = (read_json(workdir / STUDY_FILE) or {}).get("sessions", [])
    write_json_atomic(workdir / STUDY_FILE, {
        "identity": study.identity(), "study_file": str(study.path), "fixed": study.fixed,
        "axes": study.axes, "seeds": list(study.seeds), "report": study.report,
        "cells": [{"name": c.name, "group": [list(g) for g in c.group], "seed": c.seed,
                   "overrides": _comparable(c.overrides)} for c in cells],
        "sessions": sessions,
    })


def open_session(workdir: pathlib.Path, started: float) -> int:
    """Appends this invocation to study.json's sessions (not ended yet); returns its index.

    `update_session` keeps its seconds current while cells run, so an
    invocation cut off by `kill -9` or a session's end still counts, up to
    its last update, in the wall time the report states.
    """
    data = read_json(workdir / STUDY_FILE) or {}
    data.setdefault("sessions", []).append({
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": 0.0, "cells_run": 0, "ended": False,
    })
    write_json_atomic(workdir / STUDY_FILE, data)
    return len(data["sessions"]) - 1


def update_session(workdir: pathlib.Path, index: int, started: float, cells_run: int, ended: bool) -> None:
    """Sets the wall time so far (and whether it ended normally) of session `index` in study.json."""
    data = read_json(workdir / STUDY_FILE) or {}
    sessions = data.get("sessions", [])
    if index < len(sessions):
        sessions[index].update(seconds=round(time.time() - started, 1), cells_run=cells_run, ended=ended)
        write_json_atomic(workdir / STUDY_FILE, data)


def repo_commit() -> str:
    """The checkout's short commit, with `-dirty` when tracked files differ from it; `unknown` outside git."""
    try:
        described = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], cwd=REPO,
                                   capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return described.stdout.strip() if described.returncode == 0 and described.stdout.strip() else "unknown"


def staged(cell: Cell, config: ml_collections.ConfigDict, up_to: int) -> Cell:
    """The cell trained only up to `up_to` env steps (at most its own total): a first pass."""
    return dataclasses.replace(cell, overrides={**cell.overrides,
                                                "total_env_steps": min(int(config.total_env_steps), up_to)})


def run_study(study: Study, workdir: pathlib.Path, workers: int = 1, reuse: bool = True,
              log=print, up_to: int | None = None) -> dict[str, str]:
    """Runs every unfinished cell (at most `workers` at once); returns {cell: status}.

    `up_to`: train every cell only up to that many env steps (a first pass that
    answers early questions, e.g. whether any method moves, before any cell runs
    to its end); a later run without it continues each cell to its total.  No
    cell is reused from a sibling study then (a reused cell would be extended in
    place by the later run).
    """
    cells = grid(study)
    configs = {cell.name: cell_config(study, cell) for cell in cells}  # validates every cell first
    if up_to is not None:
        cells = [staged(cell, configs[cell.name], up_to) for cell in cells]
        configs = {cell.name: cell_config(study, cell) for cell in cells}
        reuse = False
    check_workdir(study, workdir, cells)
    with study_lock_dir(workdir):
        prepare_workdir(study, workdir, cells)
        started = time.time()
        session = open_session(workdir, started)
        launched: list[str] = []

        def heartbeat() -> None:
            update_session(workdir, session, started, len(launched), ended=False)

        try:
            return _run_cells(study, workdir, cells, configs, workers, reuse, log, launched, heartbeat)
        finally:
            update_session(workdir, session, started, len(launched), ended=True)


def seed_major(cells: list[Cell], seeds: tuple[int, ...]) -> list[Cell]:
    """Cells in training order: every configuration's first seed, then every second seed, ...

    An interrupted study (a session ends, a machine goes) then holds whole
    seeds of every configuration rather than every seed of the first ones.
    """
    return sorted(cells, key=lambda cell: seeds.index(cell.seed))  # stable: grid order within a seed


HEARTBEAT_SECONDS = 60.0  # how often a running invocation writes its wall time so far to study.json


def _run_cells(study: Study, workdir: pathlib.Path, cells: list[Cell], configs: dict[str, Any], workers: int,
               reuse: bool, log, launched: list[str], heartbeat) -> dict[str, str]:
    totals = {name: int(config.total_env_steps) for name, config in configs.items()}
    status: dict[str, str] = {}
    pending: list[Cell] = []
    for cell in cells:
        cell_dir = workdir / "cells" / cell.name
        if cell_finished(cell_dir, totals[cell.name]):
            status[cell.name] = "done"
            continue
        source = find_reusable(workdir, configs[cell.name], totals[cell.name]) if reuse else None
        if source is not None and not cell_dir.exists():
            cell_dir.symlink_to(os.path.relpath(source, cell_dir.parent), target_is_directory=True)
            status[cell.name] = "done"
            log(f"reused {cell.name} from {source}")
            continue
        pending.append(cell)
    pending = seed_major(pending, study.seeds)

    running: dict[str, tuple[subprocess.Popen, float, Any]] = {}
    durations: list[float] = []
    started = time.monotonic()

    def progress() -> None:
        done = sum(s == "done" for s in status.values())
        failed = sum(s == "failed" for s in status.values())
        left = len(pending)
        eta = ""
        if durations and (left or running):
            per_cell = float(np.mean(durations))
            eta = f", ETA {_format_seconds(per_cell * (left + len(running) / 2) / max(workers, 1))}"
        log(f"[{study.name}] cells: {done} done, {len(running)} running, {left} left"
            + (f", {failed} failed" if failed else "") + f" of {len(cells)}; "
            f"elapsed {_format_seconds(time.monotonic() - started)}{eta}")

    commit = repo_commit()

    def launch(cell: Cell) -> None:
        cell_dir = workdir / "cells" / cell.name
        cell_dir.mkdir(parents=True, exist_ok=True)
        commits = list((read_json(cell_dir / CELL_FILE) or {}).get("commits", []))  # a resumed cell keeps its history
        write_json_atomic(cell_dir / CELL_FILE, {
            "overrides": _comparable(cell.overrides), "base_config": cell.base_config(study),
            "group": [list(g) for g in cell.group], "seed": cell.seed, "status": "running",
            "commits": commits + ([commit] if commit not in commits else []),
        })
        log_file = open(cell_dir / "train.log", "a")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        process = subprocess.Popen(train_command(study, cell, cell_dir), cwd=REPO, stdout=log_file,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                   preexec_fn=_die_with_parent)
        running[cell.name] = (process, time.monotonic(), log_file)
        launched.append(cell.name)
        heartbeat()  # on record from its first cell, even if killed before the next heartbeat

    def finish(name: str, returncode: int) -> None:
        process, start, log_file = running.pop(name)
        log_file.close()
        cell_dir = workdir / "cells" / name
        state = read_json(cell_dir / CELL_FILE) or {}
        records = read_records(cell_dir)
        ok = returncode == 0 and bool(records) and int(records[-1].get("env_steps") or 0) >= totals[name]
        state["status"] = "done" if ok else "failed"
        state["returncode"] = returncode
        state["seconds"] = round(time.monotonic() - start, 1)
        write_json_atomic(cell_dir / CELL_FILE, state)
        status[name] = state["status"]
        if ok:
            durations.append(time.monotonic() - start)
        else:
            tail = (cell_dir / "train.log").read_text(errors="replace").strip().splitlines()[-1:] or [""]
            log(f"cell {name} failed (exit {returncode}): {tail[0][-200:]} (log: {cell_dir / 'train.log'})")

    if not pending:
        progress()
    last_beat = time.monotonic()
    try:
        while pending or running:
            if time.monotonic() - last_beat >= HEARTBEAT_SECONDS:
                heartbeat()
                last_beat = time.monotonic()
            changed = False
            while pending and len(running) < workers:
                launch(pending.pop(0))
                changed = True
            if changed:
                progress()
            time.sleep(0.2)
            finished = [(name, p.returncode) for name, (p, _, _) in running.items() if p.poll() is not None]
            for name, returncode in finished:
                finish(name, returncode)
            if finished and not (pending or running):
                progress()
    finally:
        for process, _, log_file in running.values():  # interrupted: stop the trainers cleanly
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGINT)
        for process, _, log_file in running.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
            log_file.close()
    return status


# ---------------------------------------------------------------------------
# The report.


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average over up to `window` points, NaNs ignored (NaN if all are NaN)."""
    if window <= 1:
        return values.astype(float)
    out = np.full(len(values), np.nan)
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1): i + 1]
        chunk = chunk[~np.isnan(chunk)]
        if len(chunk):
            out[i] = chunk.mean()
    return out


def curve(records: list[dict[str, Any]], metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(env_steps, metric) per update; NaN where the update finished no episode."""
    steps = np.array([float(r.get("env_steps") or 0) for r in records])
    values = np.array([np.nan if r.get(metric) is None else float(r[metric]) for r in records])
    return steps, values


def final_value(records: list[dict[str, Any]], metric: str, fraction: float = 0.1) -> float:
    """Mean of `metric` over the updates in the last `fraction` of the run's env steps.

        final = mean { m_u : env_steps_u > (1 - fraction) * env_steps_last }   (NaNs skipped)
    """
    steps, values = curve(records, metric)
    if not len(steps):
        return float("nan")
    keep = (steps > (1.0 - fraction) * steps[-1]) & ~np.isnan(values)
    if not keep.any():  # too short a run: take the last update that has a value
        valid = ~np.isnan(values)
        return float(values[valid][-1]) if valid.any() else float("nan")
    return float(values[keep].mean())


def steps_to_threshold(records: list[dict[str, Any]], metric: str, threshold: float, window: int) -> float:
    """First env step at which the smoothed `metric` reaches `threshold` (NaN if never)."""
    steps, values = curve(records, metric)
    smoothed = smooth(values, window)
    hit = np.nonzero(smoothed >= threshold)[0]
    return float(steps[hit[0]]) if len(hit) else float("nan")


def mean_std(values: list[float]) -> tuple[float, float, int]:
    """Mean and sample standard deviation (ddof 1; 0 for one value) over the non-NaN values."""
    array = np.array([v for v in values if not math.isnan(v)])
    if not len(array):
        return float("nan"), float("nan"), 0
    return float(array.mean()), float(array.std(ddof=1)) if len(array) > 1 else 0.0, len(array)


def _theory_fn(spec: str | None):
    if not spec:
        return None
    module_name, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module_name), attr)


@dataclasses.dataclass
class GroupResult:
    label: str
    group: tuple[tuple[str, str], ...]
    seeds: list[int]
    final_return: tuple[float, float, int]
    final_success: tuple[float, float, int]
    threshold_steps: list[float]
    theory: float | None
    curves: list[tuple[np.ndarray, np.ndarray]]
    success_curves: list[tuple[np.ndarray, np.ndarray]]


def aggregate(study: Study, workdir: pathlib.Path) -> list[GroupResult]:
    """Per group (all axes but the seed), over its finished cells: final return/success over seeds,
    curves, threshold steps."""
    report = study.report
    metric = report.get("metric", "episode_return")
    window = int(report.get("smoothing", 1))
    threshold = report.get("threshold")
    fraction = float(report.get("final_fraction", 0.1))
    theory = _theory_fn(report.get("theory"))
    groups: dict[tuple, list[Cell]] = {}
    for cell in grid(study):
        groups.setdefault(cell.group, []).append(cell)
    results = []
    for group, cells in groups.items():
        finals, successes, reach, curves, success_curves, seeds = [], [], [], [], [], []
        for cell in cells:
            cell_dir = workdir / "cells" / cell.name
            if not cell_finished(cell_dir, int(cell_config(study, cell).total_env_steps)):
                continue  # a running cell's last updates are not its final ones: it shows in the per-cell table
            records = read_records(cell_dir)
            seeds.append(cell.seed)
            finals.append(final_value(records, metric, fraction))
            successes.append(final_value(records, "success_rate", fraction))
            if threshold is not None:
                reach.append(steps_to_threshold(records, metric, float(threshold), window))
            curves.append(curve(records, metric))
            success_curves.append(curve(records, "success_rate"))
        predicted = float(theory(cell_config(study, cells[0]))) if theory and cells else None
        results.append(GroupResult(
            label=", ".join(label for _, label in group), group=group, seeds=seeds,
            final_return=mean_std(finals), final_success=mean_std(successes), threshold_steps=reach,
            theory=predicted, curves=curves, success_curves=success_curves,
        ))
    return results


PHASE_SECONDS = ("seconds_sampling", "seconds_env", "seconds_behaviour", "seconds_learner")


@dataclasses.dataclass
class CellSummary:
    """One cell's progress as its metrics.jsonl tells it (robust to interrupted sessions)."""
    name: str
    finished: bool
    env_steps: int
    total_env_steps: int
    episodes: int
    first_success: float  # env steps at the first update in which an episode succeeded; NaN if none yet
    final_return: float
    final_success: float
    seconds: float  # time in updates: the sum over updates of sampling, env, behaviour and learner seconds


def summarise_cell(study: Study, workdir: pathlib.Path, cell: Cell) -> CellSummary | None:
    """The cell's row of the per-cell table, or None before its first logged update.

        first_success = min { env_steps_u : success_rate_u > 0 },  seconds = sum_u sum_phase seconds_phase,u
    """
    cell_dir = workdir / "cells" / cell.name
    records = read_records(cell_dir)
    if not records:
        return None
    total = int(cell_config(study, cell).total_env_steps)
    metric = study.report.get("metric", "episode_return")
    fraction = float(study.report.get("final_fraction", 0.1))
    successes = [r["env_steps"] for r in records if (r.get("success_rate") or 0.0) > 0.0]
    return CellSummary(
        name=cell.name, finished=cell_finished(cell_dir, total), env_steps=int(records[-1].get("env_steps") or 0),
        total_env_steps=total, episodes=int(records[-1].get("episodes") or 0),
        first_success=float(successes[0]) if successes else float("nan"),
        final_return=final_value(records, metric, fraction), final_success=final_value(records, "success_rate", fraction),
        seconds=float(sum(float(r.get(key) or 0.0) for r in records for key in PHASE_SECONDS)),
    )


def cell_table(study: Study, workdir: pathlib.Path) -> list[str]:
    """Markdown lines: one row per cell that has logged an update (finished or still running)."""
    metric = study.report.get("metric", "episode_return")
    lines = ["| cell | status | env steps | episodes | first success at env step | "
             f"final {metric} | final success | time in updates |", "|" + "---|" * 8]
    for cell in seed_major(grid(study), study.seeds):
        row = summarise_cell(study, workdir, cell)
        if row is None:
            continue
        status = "done" if row.finished else f"running ({row.env_steps:,} of {row.total_env_steps:,})"
        first = "-" if math.isnan(row.first_success) else f"{row.first_success:,.0f}"
        so_far = "" if row.finished else " (so far)"
        lines.append(f"| {row.name} | {status} | {row.env_steps:,} | {row.episodes:,} | {first} | "
                     f"{_number(row.final_return)}{so_far} | {_number(row.final_success)}{so_far} | "
                     f"{_format_seconds(row.seconds)} |")
    return lines


@dataclasses.dataclass
class StepOutcomes:
    """One cell's steps that succeeded (e.g. programs that ran) and what they scored (e.g. their AUC)."""
    steps: int
    succeeded: int
    mean_reward: float  # over every succeeded step of the run
    final_mean_reward: float  # over the succeeded steps of the updates in the last `final_fraction`
    best_reward: float


def step_outcomes(records: list[dict[str, Any]], fraction: float) -> StepOutcomes:
    """Counts and rewards of the succeeded steps, weighted by step (not by update):

        mean = sum_u k_u * rbar_u / sum_u k_u   (k_u = steps_succeeded_u, rbar_u = success_reward_mean_u)
        final mean: the same sum over { u : env_steps_u > (1 - fraction) * env_steps_last }
    """
    steps = np.array([float(r.get("env_steps") or 0) for r in records])
    counts = np.array([float(r.get("steps_succeeded") or 0) for r in records])
    means = np.array([np.nan if r.get("success_reward_mean") is None else float(r["success_reward_mean"])
                      for r in records])
    counted = (counts > 0) & ~np.isnan(means)

    def weighted(keep: np.ndarray) -> float:
        keep = keep & counted
        return float((counts[keep] * means[keep]).sum() / counts[keep].sum()) if keep.any() else float("nan")

    best = [float(r["best_step_reward"]) for r in records if r.get("best_step_reward") is not None]
    return StepOutcomes(
        steps=int(steps[-1]) if len(steps) else 0, succeeded=int(counts.sum()),
        mean_reward=weighted(np.ones(len(records), bool)),
        final_mean_reward=weighted(steps > (1.0 - fraction) * (steps[-1] if len(steps) else 0.0)),
        best_reward=max(best) if best else float("nan"),
    )


def step_outcome_table(study: Study, workdir: pathlib.Path) -> list[str]:
    """Markdown lines, one row per cell, from report option `steps = {"succeeded": name, "reward": name}`
    (e.g. runnable programs and their AUC on DataSciCoding); [] when the study does not ask for it."""
    names = study.report.get("steps")
    if not names:
        return []
    succeeded, reward = names.get("succeeded", "succeeded"), names.get("reward", "reward")
    fraction = float(study.report.get("final_fraction", 0.1))
    lines = [f"Steps per cell ({succeeded} steps and their {reward}; means weighted by step):", "",
             f"| cell | status | env steps | {succeeded} | fraction {succeeded} | mean {reward} of {succeeded} | "
             f"same, last {fraction:.0%} of env steps | best {reward} |", "|" + "---|" * 8]
    for cell in seed_major(grid(study), study.seeds):
        cell_dir = workdir / "cells" / cell.name
        records = read_records(cell_dir)
        if not records:
            continue
        total = int(cell_config(study, cell).total_env_steps)
        row = step_outcomes(records, fraction)
        status = "done" if cell_finished(cell_dir, total) else f"running ({row.steps:,} of {total:,})"
        share = row.succeeded / row.steps if row.steps else float("nan")
        lines.append(f"| {cell.name} | {status} | {row.steps:,} | {row.succeeded:,} | {_number(share)} | "
                     f"{_number(row.mean_reward)} | {_number(row.final_mean_reward)} | {_number(row.best_reward)} |")
    return lines


def band(curves: list[tuple[np.ndarray, np.ndarray]], window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and std over seeds of the smoothed curves, on the first seed's env-step grid
    (others interpolated onto it)."""
    grid_steps = max((c[0] for c in curves), key=len)
    stacked = []
    for steps, values in curves:
        smoothed = smooth(values, window)
        valid = ~np.isnan(smoothed)
        if valid.sum() == 0:
            continue
        stacked.append(np.interp(grid_steps, steps[valid], smoothed[valid], left=np.nan, right=np.nan))
    if not stacked:  # no seed has a value yet (e.g. no episode has ended): an empty curve, not a crash
        empty = np.full(len(grid_steps), np.nan)
        return grid_steps, empty, empty
    stacked = np.array(stacked)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns before a seed's first episode
        return grid_steps, np.nanmean(stacked, axis=0), np.nanstd(stacked, axis=0)


def _number(x: float) -> str:
    """A table cell: three decimals, or "-" for NaN."""
    return "-" if math.isnan(x) else f"{x:.3f}"


def _fmt(mean: float, std: float, count: int) -> str:
    if count == 0 or math.isnan(mean):
        return "-"
    return f"{mean:.3f} ± {std:.3f}"


def plot_curves(study: Study, results: list[GroupResult], path: pathlib.Path, which: str = "return") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    window = int(study.report.get("smoothing", 1))
    facet = study.report.get("facet")
    facet_values = []
    for result in results:
        key = dict(result.group).get(facet) if facet else None
        if key not in facet_values:
            facet_values.append(key)
    columns = min(len(facet_values), 4)
    rows = math.ceil(len(facet_values) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(max(4.2 * columns, 6.4), 3.2 * rows), squeeze=False, sharey=True)
    colours = {}
    for index, key in enumerate(facet_values):
        axis = axes[index // columns][index % columns]
        for result in results:
            if facet and dict(result.group).get(facet) != key:
                continue
            curves = result.curves if which == "return" else result.success_curves
            if not curves:
                continue
            label = ", ".join(l for a, l in result.group if a != facet)
            colour = colours.setdefault(label, f"C{len(colours) % 10}")
            steps, mean, std = band(curves, window)
            axis.plot(steps, mean, color=colour, label=f"{label} (n={len(curves)})", linewidth=1.5)
            axis.fill_between(steps, mean - std, mean + std, color=colour, alpha=0.18, linewidth=0)
            if which == "return" and result.theory is not None:
                axis.axhline(result.theory, color=colour, linestyle=":", linewidth=1)
        axis.set_title(key if key else study.name, fontsize=10)
        axis.set_xlabel("env steps")
        axis.grid(alpha=0.3)
    for index in range(len(facet_values), rows * columns):
        axes[index // columns][index % columns].axis("off")
    axes[0][0].set_ylabel(study.report.get("metric", "episode_return") if which == "return" else "success rate")
    seen = {}  # one legend entry per group, across facets
    for row in axes:
        for axis in row:
            for handle, label in zip(*axis.get_legend_handles_labels()):
                seen.setdefault(label, handle)
    figure.legend(list(seen.values()), list(seen.keys()), loc="lower center", ncol=min(len(seen), 4), fontsize=8,
                  frameon=False)
    subtitle = f"mean ± std over seeds, moving average of {window} updates" if window > 1 else "mean ± std over seeds"
    if which == "return" and any(r.theory is not None for r in results):
        subtitle += "; dotted: optimum under the method's discount"
    figure.suptitle(f"{study.name}: {subtitle}", fontsize=10)
    legend_rows = math.ceil(len(seen) / 4)
    figure.tight_layout(rect=(0, 0.04 + 0.035 * legend_rows, 1, 0.95))
    figure.savefig(path, dpi=90)
    plt.close(figure)


def plot_heatmap(study: Study, results: list[GroupResult], path: pathlib.Path) -> None:
    """Final return over two axes (`report.heatmap = (row_axis, column_axis)`), beside the theory's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    row_axis, column_axis = study.report["heatmap"]
    row_labels = [_value_label(row_axis, v) for v in study.axes[row_axis]]
    column_labels = [_value_label(column_axis, v) for v in study.axes[column_axis]]
    measured = np.full((len(row_labels), len(column_labels)), np.nan)
    predicted = np.full_like(measured, np.nan)
    for result in results:
        labels = dict(result.group)
        i, j = row_labels.index(labels[row_axis]), column_labels.index(labels[column_axis])
        measured[i, j] = result.final_return[0]
        predicted[i, j] = np.nan if result.theory is None else result.theory
    panels = [("measured final return (mean over seeds)", measured)]
    if not np.isnan(predicted).all():
        panels.append(("optimum under the method's discount", predicted))
    figure, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels) + 1.6, 0.5 * len(row_labels) + 2.2),
                                squeeze=False)
    short = [label.split("=", 1)[-1] for label in column_labels]  # "action_length=8" -> "8"
    finite = np.concatenate([p[~np.isnan(p)] for _, p in panels])
    low, high = (float(finite.min()), float(finite.max())) if len(finite) else (0.0, 1.0)
    for index, (axis, (title, table)) in enumerate(zip(axes[0], panels)):
        image = axis.imshow(table, cmap="viridis", vmin=low, vmax=high, aspect="auto")
        axis.set_xticks(range(len(short)), short, fontsize=8)
        axis.set_xlabel(column_axis.split(".")[-1], fontsize=9)
        axis.set_yticks(range(len(row_labels)), row_labels if index == 0 else [], fontsize=8)
        for i in range(table.shape[0]):
            for j in range(table.shape[1]):
                if not np.isnan(table[i, j]):
                    axis.text(j, i, f"{table[i, j]:.2f}", ha="center", va="center", fontsize=8,
                              color="white" if table[i, j] < (low + high) / 2 else "black")
        axis.set_title(title, fontsize=9)
    figure.colorbar(image, ax=axes[0].tolist(), shrink=0.8)
    figure.suptitle(study.name, fontsize=10)
    figure.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(figure)


def _commits_line(study: Study, workdir: pathlib.Path) -> str:
    """Which commits the study's own cells ran at (a resumed cell may list several), from cell.json."""
    commits: dict[str, int] = {}
    unrecorded = 0
    for cell in grid(study):
        cell_dir = workdir / "cells" / cell.name
        if cell_dir.is_symlink() or not cell_dir.exists():
            continue
        recorded = (read_json(cell_dir / CELL_FILE) or {}).get("commits") or []
        unrecorded += not recorded
        for commit in recorded:
            commits[commit] = commits.get(commit, 0) + 1
    parts = [f"{commit} ({count} cell{'s' if count > 1 else ''})" for commit, count in commits.items()]
    if unrecorded:
        parts.append(f"not recorded for {unrecorded} cell{'s' if unrecorded > 1 else ''} (run before cell.json kept it)")
    return "the cells' commits: " + (", ".join(parts) if parts else "none yet")


def provenance(study: Study, workdir: pathlib.Path) -> str:
    """One markdown line: command, commits, machine, date and wall time of the study's cells."""
    data = read_json(workdir / STUDY_FILE) or {}
    sessions = data.get("sessions", [])
    wall = sum(s.get("seconds", 0.0) for s in sessions)
    cut_off = sum(not s.get("ended", True) for s in sessions)  # entries written before `ended` existed ended
    cell_seconds = 0.0
    reused = 0
    for cell in grid(study):
        cell_dir = workdir / "cells" / cell.name
        if cell_dir.is_symlink():
            reused += 1
            continue
        summary = summarise_cell(study, workdir, cell)  # summed from the metrics: survives interrupted sessions
        cell_seconds += summary.seconds if summary is not None else 0.0
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    dates = sorted(s["started"][:10] for s in sessions if s.get("started"))
    command = f"python -m poad_jax.study --study={os.path.relpath(study.path, REPO)}"
    cut = f", {cut_off} of them cut off (counted to their last minute)" if cut_off else ""
    when = (f"run {dates[0]}{' to ' + dates[-1] if len(set(dates)) > 1 else ''}; wall time {_format_seconds(wall)} "
            f"over {len(sessions)} invocation(s){cut}, " if sessions else "no invocation recorded yet; ")
    return (f"Command `{command}` (resumable); {_commits_line(study, workdir)}; report at {repo_commit()}; "
            f"{os.cpu_count()} cores, {cpu}; {when}"
            f"{_format_seconds(cell_seconds)} in the cells' updates"
            + (f" ({reused} cells reused from sibling studies, whose time counts there)." if reused else "."))


def publish(study: Study, workdir: pathlib.Path, directory: pathlib.Path) -> pathlib.Path:
    """Copies the report's figures to `directory/<study>_*.png` and writes `directory/<study>.md`."""
    import shutil

    directory.mkdir(parents=True, exist_ok=True)
    text = (workdir / "report.md").read_text()
    line = provenance(study, workdir)  # before writing: the commit is not "-dirty" from this report's own files
    for figure in ("return", "success", "heatmap"):
        source = workdir / f"{figure}.png"
        if source.exists():
            shutil.copyfile(source, directory / f"{study.name}_{figure}.png")
            text = text.replace(f"({figure}.png)", f"({study.name}_{figure}.png)")
    path = directory / f"{study.name}.md"
    path.write_text(text + "\n" + line + "\n")
    return path


def write_report(study: Study, workdir: pathlib.Path) -> pathlib.Path:
    """Writes `report.md`, `return.png`, `success.png` (and `heatmap.png`) into `workdir`."""
    results = aggregate(study, workdir)
    per_cell = cell_table(study, workdir)
    if len(per_cell) == 2:
        raise StudyError(f"no cell of study {study.name!r} in {workdir} has logged an update yet")
    report = study.report
    metric = report.get("metric", "episode_return")
    fraction = float(report.get("final_fraction", 0.1))
    threshold = report.get("threshold")
    any_finished = any(r.curves for r in results)
    for figure in ("return", "success", "heatmap"):  # none left from an earlier report
        (workdir / f"{figure}.png").unlink(missing_ok=True)
    if any_finished:
        plot_curves(study, results, workdir / "return.png", "return")
        plot_curves(study, results, workdir / "success.png", "success")
        if report.get("heatmap"):
            plot_heatmap(study, results, workdir / "heatmap.png")
    header = ["group", "seeds", f"final {metric}", "final success"]
    if any(r.theory is not None for r in results):
        header.append("optimum under its discount")
    if threshold is not None:
        header.append(f"env steps to {metric} >= {threshold}")
    lines = [f"# Study `{study.name}`", "",
             f"Base config `{os.path.relpath(study.base_config, REPO)}`; fixed: "
             + (", ".join(f"`{k}={v}`" for k, v in study.fixed.items()) or "none") + ".",
             f"Final = mean over the updates in the last {fraction:.0%} of env steps, then mean ± sample std "
             f"over the finished seeds.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in results:
        row = [r.label, str(len(r.seeds)), _fmt(*r.final_return), _fmt(*r.final_success)]
        if "optimum under its discount" in header:
            row.append("-" if r.theory is None else f"{r.theory:.3f}")
        if threshold is not None:
            reached = [s for s in r.threshold_steps if not math.isnan(s)]
            row.append(f"{len(reached)}/{len(r.threshold_steps)} reached" +
                       (f"; mean {np.mean(reached):,.0f}" if reached else ""))
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Per cell (finished and running; the group rows above count finished cells only; time in updates "
              "excludes start-up and compilation):", ""] + per_cell
    outcomes = step_outcome_table(study, workdir)
    if outcomes:
        lines += [""] + outcomes
    if any_finished:
        lines += ["", "![return](return.png)", "", "![success](success.png)"]
        if report.get("heatmap"):
            lines += ["", "![heatmap](heatmap.png)"]
    else:
        lines += ["", "No cell has finished yet: the seed-band figures come with the first finished cell."]
    path = workdir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


# ---------------------------------------------------------------------------
# Command line.


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m poad_jax.study", description=__doc__.splitlines()[0])
    parser.add_argument("--study", required=True, help="study file, e.g. studies/gamma_w.py")
    parser.add_argument("--workdir", default=None, help="default: runs/studies/<study name>")
    parser.add_argument("--workers", type=int, default=1, help="cells trained at once (default 1)")
    parser.add_argument("--report", action="store_true", help="only aggregate what the cells have logged")
    parser.add_argument("--no-reuse", action="store_true", help="never reuse finished cells of sibling studies")
    parser.add_argument("--up-to", type=int, default=None, metavar="ENV_STEPS",
                        help="a first pass: train every cell only up to this many env steps (re-run without "
                             "it to continue them to the end)")
    parser.add_argument("--publish", default=None, metavar="DIR",
                        help="also copy the report and its figures to DIR (e.g. docs/results)")
    args = parser.parse_args(argv)
    try:
        if args.workers < 1:
            raise StudyError(f"--workers must be >= 1, got {args.workers}")
        if args.up_to is not None and args.up_to < 1:
            raise StudyError(f"--up-to must be >= 1 env step, got {args.up_to}")
        study = load_study(args.study)
        workdir = pathlib.Path(args.workdir) if args.workdir else REPO / "runs" / "studies" / study.name
        if args.report:
            if not (workdir / STUDY_FILE).exists():
                raise StudyError(f"{workdir} holds no study yet: run it first (without --report)")
            recorded = read_json(workdir / STUDY_FILE) or {}
            if not study.recorded_in(recorded):
                raise StudyError(f"workdir {workdir} holds another study ({recorded.get('identity')})")
        else:
            status = run_study(study, workdir, workers=args.workers, reuse=not args.no_reuse, up_to=args.up_to)
            failed = [name for name, s in status.items() if s == "failed"]
            if failed:
                print(f"{len(failed)} cell(s) failed: {', '.join(failed[:5])}"
                      + (" ..." if len(failed) > 5 else "") + "; re-run the same command to retry them")
        path = write_report(study, workdir)
        print(f"report: {path}")
        if args.publish:
            print(f"published: {publish(study, workdir, pathlib.Path(args.publish))}")
    except StudyError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: re-run the same command to resume", file=sys.stderr)
        return 130
    return 0


@contextlib.contextmanager
def study_lock_dir(workdir: pathlib.Path):
    if workdir.exists() and not workdir.is_dir():
        raise StudyError(f"workdir {workdir} is a file, not a directory")
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise StudyError(f"cannot create workdir {workdir}: {error.strerror}") from None
    with study_lock(workdir):
        yield


if __name__ == "__main__":
    sys.exit(main())
