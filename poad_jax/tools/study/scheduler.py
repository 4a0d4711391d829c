"""Running a study's grid: cell state on disk, reuse of finished cells, the subprocess
scheduler, sessions and locks."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import fcntl
import json
import os
import pathlib
import signal
import subprocess
import time
from typing import IO, Any

import ml_collections
import numpy as np

from poad_jax.run import config as config_lib
from poad_jax.run import checkpoint as checkpoint_lib
from poad_jax.run import hardware, rundir
from poad_jax.run import memory as memory_lib
from poad_jax.run.metrics import read_metrics
from poad_jax.tools.study.spec import (CELL_FILE, REPO, STUDY_FILE, Cell, Study, StudyError, cell_config, grid,
                                        group_of, log_dir, train_command)

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


def cell_seconds(cell_dir: pathlib.Path) -> float | None:
    """The wall time a finished cell took, all its invocations together (`seconds_total` in its cell.json;
    `seconds`, its last invocation's, where an older runner wrote only that); None if it has not finished."""
    state = read_json(cell_dir / CELL_FILE) or {}
    if state.get("status") != "done":
        return None
    seconds = state.get("seconds_total", state.get("seconds"))
    return float(seconds) if isinstance(seconds, (int, float)) else None


def expected_seconds(workdir: pathlib.Path, cell_name: str, total: int) -> float | None:
    """How long `cell_name` should take to finish here, from the cells of `workdir` that have finished
    (linked ones included: they ran the same config):

        T = median wall time of its group's finished cells (else the longest finished cell's)
            x (1 - env steps it has logged / total)

    None where no cell has finished yet."""
    timed = {path.name: cell_seconds(path) for path in sorted((workdir / "cells").glob("*"))}
    timed = {name: seconds for name, seconds in timed.items() if seconds is not None}
    if not timed:
        return None
    same = [seconds for name, seconds in timed.items() if group_of(name) == group_of(cell_name)]
    whole = float(np.median(same)) if same else max(timed.values())
    records = read_records(workdir / "cells" / cell_name) if (workdir / "cells" / cell_name).is_dir() else []
    logged = int(records[-1].get("env_steps") or 0) if records else 0
    return whole * max(0.0, 1.0 - logged / total)


def _settings_diff(old: dict[str, Any], new: dict[str, Any], ran: dict[str, Any] | None = None) -> list[str]:
    """The changed cell settings a re-run may not change (`config.RESUMABLE_FIELDS`), as `field: old -> new`.
    A setting the study file now writes out that the cell's config.json (`ran`, by dotted name:
    `rundir.flatten`) holds at that very value is no change: the cell ran with it (e.g. a base config's former
    default, pinned when the default moved)."""
    keys = sorted(set(old) | set(new))
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys
            if config_lib.resumable_kind(k) is None and old.get(k) != new.get(k)
            and not (k not in old and ran is not None and k in ran and ran[k] == new[k])]


def _comparable(overrides: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(overrides, sort_keys=True))


def _meaning(config_dict: dict[str, Any]) -> dict[str, Any]:
    """A trainer config without the fields whose change leaves every logged number as it was
    (`config.SAME_NUMBERS`): a reused cell may differ in them."""
    return {k: v for k, v in config_dict.items() if config_lib.resumable_kind(k) not in config_lib.SAME_NUMBERS}


def _env_defaults(name: Any) -> dict[str, Any]:
    """The keyword defaults of environment `name`'s constructor ({} for one that cannot be resolved)."""
    import inspect

    import envs_py

    try:
        parameters = inspect.signature(envs_py.spec(str(name)).resolve()).parameters.values()
    except Exception:  # an env this checkout does not know: compared as written
        return {}
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}


def _without_default_env_kwargs(config_dict: dict[str, Any]) -> dict[str, Any]:
    """`config_dict` without the env kwargs that equal the environment's own defaults: a cell's config
    file that now writes out an option at its default (DataSciCoding's `improve_attempts=0`, so that the
    command line can set it) is the computation a cell that predates the option ran."""
    env = config_dict.get("env")
    if not isinstance(env, dict) or not isinstance(env.get("kwargs"), dict):
        return config_dict
    defaults = _env_defaults(env.get("name"))
    kwargs = {k: v for k, v in env["kwargs"].items() if not (k in defaults and _same_value(defaults[k], v))}
    return {**config_dict, "env": {**env, "kwargs": kwargs}}


def _same_value(default: Any, value: Any) -> bool:
    """Whether a JSON value equals a constructor default (None and "" are the same "off")."""
    if default is None and value in (None, ""):
        return True
    return type(default) in (bool, int, float, str) and default == value and type(default) is type(value)


def _completed_json(recorded: dict[str, Any]) -> dict[str, Any]:
    """`recorded` (a cell's config.json) with the fields it lacks at their declared defaults
    (`config.completed`): a cell trained before a field existed ran as that field's default
    (e.g. `mesh` or `distributed`, added later)."""
    return json.loads(config_lib.completed(ml_collections.ConfigDict(recorded)).to_json_best_effort())


def find_reusable(workdir: pathlib.Path, config: ml_collections.ConfigDict, total: int) -> pathlib.Path | None:
    """A finished cell in a sibling study's workdir whose trainer config equals `config`
    (output-only fields aside; fields its config.json predates count as their defaults) and that ran
    at least `total` env steps.  A trainer records the settings "auto" resolves to on its machine
    (`hardware.resolve_config`): the cell's config matches with them as this machine resolves them,
    or as written."""
    siblings = [path for path in sorted(workdir.parent.glob("*/cells/*/config.json"))
                if not path.parent.is_symlink() and path.parent.parent.parent.resolve() != workdir.resolve()]
    if not siblings:
        return None
    for sibling in siblings:
        if ran_as(read_json(sibling), config) and cell_finished(sibling.parent, total):
            return sibling.parent
    return None


def ran_as(recorded: Any, config: ml_collections.ConfigDict) -> bool:
    """Whether a cell's config.json (`recorded`) is `config`'s trainer config: equal but for the fields
    whose change leaves every logged number as it was (`_meaning`), with the fields it predates at their
    defaults, and with "auto" as written or as this machine resolves it (`hardware.resolve_config`)."""
    if not isinstance(recorded, dict):
        return False
    wants = [_meaning(_without_default_env_kwargs(json.loads(c.to_json_best_effort())))
             for c in (config, as_resolved_here(config))]
    return _meaning(_without_default_env_kwargs(_completed_json(recorded))) in wants


def as_resolved_here(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """A copy of `config` with its "auto" settings as this machine resolves them (`hardware.resolve_config`)."""
    resolved = copy.deepcopy(config)
    hardware.resolve_config(resolved)
    return resolved


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


def format_seconds(seconds: float) -> str:
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
    check_same_as(study, workdir)
    for cell in cells:  # a cell directory must not have been run with other settings
        cell_dir = workdir / "cells" / cell.name
        if cell_dir.is_symlink():  # reused from a sibling study: its cell.json holds that study's overrides
            if not ran_as(read_json(cell_dir / "config.json"), cell_config(study, cell)):
                raise StudyError(f"cell {cell.name} in {workdir} is linked to {os.readlink(cell_dir)}, which ran "
                                 f"other settings: remove the link (the cell then runs here, or is reused again)")
            continue
        state = read_json(cell_dir / CELL_FILE)
        if state is not None:
            ran = read_json(cell_dir / "config.json")
            diff = _settings_diff(state.get("overrides", {}), _comparable(cell.overrides),
                                  rundir.flatten(ran) if isinstance(ran, dict) else None)
            if diff:
                raise StudyError(f"cell {cell.name} in {workdir} was run with other settings ({'; '.join(diff)}): "
                                 f"choose another --workdir")


def check_same_as(study: Study, workdir: pathlib.Path) -> None:
    """StudyError if a cell the study declares the same computation as another (`same_as`) has logs of
    its own in `workdir`: its numbers would be hidden behind the other cell's."""
    for name, source in study.same_as.items():
        if read_records(workdir / "cells" / name):
            raise StudyError(f"cell {name} has run in {workdir}, but the study file declares it the same "
                             f"computation as {source} (same_as), whose numbers would stand for it: remove it "
                             "from same_as, or its directory")


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
        "same_as": study.same_as, "sessions": sessions,
    })


def this_machine() -> str:
    """The machine in words: cores, CPU model (/proc/cpuinfo) and NVIDIA GPUs (`nvidia-smi`), if any."""
    cpu = hardware.cpu_model_name()
    words = f"{os.cpu_count()} cores, {cpu if cpu != 'unknown' else 'unknown CPU'}"
    try:
        listed = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return words
    names = [name.strip() for name in listed.stdout.splitlines() if name.strip()] if listed.returncode == 0 else []
    for name in dict.fromkeys(names):
        words += f", {names.count(name)} x {name}"
    return words


def open_session(workdir: pathlib.Path, started: float) -> int:
    """Appends this invocation to study.json's sessions (not ended yet); returns its index.

    Each invocation records the machine it ran on (`this_machine`), so a
    report written elsewhere (a study run on a lent GPU, reported here) names
    the right one.  `update_session` keeps its seconds current while cells
    run, so an invocation cut off by `kill -9` or a session's end still
    counts, up to its last update, in the wall time the report states.
    """
    data = read_json(workdir / STUDY_FILE) or {}
    data.setdefault("sessions", []).append({
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": 0.0, "cells_run": 0, "ended": False, "machine": this_machine(),
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


def cell_environment() -> tuple[pathlib.Path, dict[str, str]]:
    """(working directory, environment) of every cell: the caller's, as if the caller had typed
    `python -m poad_jax.train` there, with the caller's directory first on PYTHONPATH, so a config
    or study file that imports the caller's own modules (an environment registered there) imports
    them in the cell too, and relative paths mean what they meant to the caller."""
    caller = pathlib.Path.cwd()
    paths = [str(caller), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    return caller, dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(dict.fromkeys(paths)))


def staged(cell: Cell, total_env_steps: int, up_to: int) -> Cell:
    """The cell (of `total_env_steps`) trained only up to `up_to` env steps (at most its own total): a
    first pass."""
    return dataclasses.replace(cell, overrides={**cell.overrides, "total_env_steps": min(total_env_steps, up_to)})


def run_study(study: Study, workdir: pathlib.Path, workers: int = 1, reuse: bool = True,
              log=print, up_to: int | None = None, seeds: tuple[int, ...] | None = None,
              cell_names: tuple[str, ...] | None = None, finish_within: float | None = None) -> dict[str, str]:
    """Runs every unfinished cell (at most `workers` at once); returns {cell: status}.

    `finish_within` (seconds from now): start a cell only if it should finish by then
    (`expected_seconds`); the others are left "not started", each said in a line, for a later run.

    `seeds`: run only the cells of these seeds of the study's (a pass that fits
    one session or one lent machine; the report covers every seed that has run,
    wherever its cells ran).  `cell_names`: run only the cells of these names
    (`spec.cells_labelled`), likewise; with `seeds` too, the cells in both.

    `up_to`: train every cell only up to that many env steps (a first pass that
    answers early questions, e.g. whether any method moves, before any cell runs
    to its end); a later run without it continues each cell to its total.  No
    cell is reused from a sibling study then (a reused cell would be extended in
    place by the later run).
    """
    cells = grid(study)
    configs = {cell.name: cell_config(study, cell) for cell in cells}  # validates every cell first
    # each cell's settings typed once (`config_lib.typed`), "auto" settings resolved as this machine
    # resolves them: the study needs their env steps and expected peak memory; the cells' ConfigDicts
    # stay, as the trainers' command lines, their resume checks and warnings read them
    runs = {name: config_lib.typed(as_resolved_here(config)) for name, config in configs.items()}
    totals = {name: run.total_env_steps for name, run in runs.items()}
    if up_to is not None:
        cells = [staged(cell, totals[cell.name], up_to) for cell in cells]
        configs = {cell.name: cell_config(study, cell) for cell in cells}
        totals = {cell.name: cell.overrides["total_env_steps"] for cell in cells}
        reuse = False
    to_run = cells
    if seeds is not None:
        seeds = chosen_seeds(study, seeds)
        to_run = [cell for cell in cells if cell.seed in seeds]
    if cell_names is not None:
        to_run = [cell for cell in to_run if cell.name in cell_names]
    for cell in to_run:
        if cell.name in study.same_as:
            source = log_dir(study, workdir, cell.name)
            missing = "" if read_records(source) else f" (none there yet: {source} has no logs)"
            log(f"[{study.name}] cell {cell.name} is not run: the study file declares it the same computation "
                f"as {study.same_as[cell.name]} (same_as), whose numbers stand for it{missing}")
    to_run = [cell for cell in to_run if cell.name not in study.same_as]
    workdir = workdir.absolute()  # the cells' --workdir, whatever directory they run in
    check_workdir(study, workdir, cells)
    for line in cell_warnings(study, to_run, configs):
        log(line)
    with study_lock_dir(workdir):
        prepare_workdir(study, workdir, cells)
        deadline = None if finish_within is None else time.monotonic() + finish_within
        return CellRunner(study, workdir, to_run, configs, runs, totals, workers, log, deadline).run(reuse)


def cell_warnings(study: Study, cells: list[Cell], configs: dict[str, ml_collections.ConfigDict]) -> list[str]:
    """One line per cell and `config_lib.config_warnings` line: valid settings that make a cell learn
    nothing, said before hours go into it (each cell's train.log says it again)."""
    return [f"[{study.name}] cell {cell.name}: {warning}"
            for cell in cells for warning in config_lib.config_warnings(configs[cell.name])]


def chosen_seeds(study: Study, seeds: tuple[int, ...]) -> tuple[int, ...]:
    """`seeds` if each is one of the study's; else StudyError naming the study's seeds."""
    unknown = [seed for seed in seeds if seed not in study.seeds]
    if not seeds or unknown:
        raise StudyError(f"--seeds {','.join(map(str, seeds)) or '(none)'}: study {study.name!r} has seeds "
                         f"{','.join(map(str, study.seeds))}")
    return seeds


def seed_major(cells: list[Cell], seeds: tuple[int, ...]) -> list[Cell]:
    """Cells in training order: every configuration's first seed, then every second seed, ...

    An interrupted study (a session ends, a machine goes) then holds whole
    seeds of every configuration rather than every seed of the first ones.
    """
    return sorted(cells, key=lambda cell: seeds.index(cell.seed))  # stable: grid order within a seed


HEARTBEAT_SECONDS = 60.0  # how often a running invocation writes its wall time so far to study.json


def _cells_to_run(study: Study, workdir: pathlib.Path, cells: list[Cell], configs: dict[str, Any],
                  totals: dict[str, int], reuse: bool, log, status: dict[str, str]) -> list[Cell]:
    """The cells still to train, seed-major; a finished cell, or one reused from a sibling study
    (linked into `workdir`), is marked "done" in `status` instead."""
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
    return seed_major(pending, study.seeds)


def resident_bytes(pid: int) -> int:
    """A process's resident memory now (VmRSS of /proc/<pid>/status), 0 where it cannot be read."""
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 0
    return 0


def killed_line(name: str, cell_dir: pathlib.Path) -> str:
    """The line for a cell whose trainer was ended by SIGKILL that it did not ask for: the kernel's OOM
    killer is the usual sender (the trainer prints nothing, the shell would say only "Killed"); its last
    checkpoint, where a re-run of the study resumes it."""
    steps = checkpoint_lib.checkpoint_steps(cell_dir)
    where = (f"its last checkpoint is update {steps[-1]} ({cell_dir / 'checkpoints' / str(steps[-1])})" if steps
             else "it had saved no checkpoint yet (a re-run starts it again)")
    return (f"cell {name} was killed by the system (SIGKILL), likely out of memory: {where}; re-run the same "
            f"command to resume it, with fewer --workers or beside fewer other processes (log: {cell_dir / 'train.log'})")


@dataclasses.dataclass
class _Trainer:
    """One cell's trainer subprocess while it runs."""

    process: subprocess.Popen
    started: float  # time.monotonic() at launch
    log_file: IO[str]


class CellRunner:
    """One invocation's run of `cells`: at most `workers` trainers at once, launched seed-major.

    Its state, all of it here: `pending` (cells still to launch, in order),
    `running` ({cell: its trainer}), `status` ({cell: "done" or "failed"}),
    `durations` (seconds of each cell finished in this invocation, for the
    ETA) and `launched` (cells started, counted in study.json's session).
    Each cell's state on disk is its cell.json; the invocation's is its
    session in study.json, kept current by `heartbeat`.
    """

    def __init__(self, study: Study, workdir: pathlib.Path, cells: list[Cell], configs: dict[str, Any],
                 runs: dict[str, config_lib.Run], totals: dict[str, int], workers: int, log,
                 deadline: float | None = None) -> None:
        self.study, self.workdir, self.cells, self.configs, self.runs = study, workdir, cells, configs, runs
        self.workers, self.log = workers, log
        self.totals = totals  # each cell's total_env_steps
        self.pending: list[Cell] = []
        self.running: dict[str, _Trainer] = {}
        self.status: dict[str, str] = {}
        self.durations: list[float] = []
        self.launched: list[str] = []
        self.deadline = deadline  # time.monotonic() by which a launched cell should finish, or None
        self.started = time.monotonic()  # reset when the cells to run are known
        self.session = 0  # this invocation's index in study.json's sessions, and its start (time.time())
        self.session_started = 0.0
        self.commit = repo_commit()
        self.caller, self.env = cell_environment()
        self.peaks: dict[str, int | None] = {}  # each cell's expected peak memory (`expected_peak`)
        self.memory_waits: set[str] = set()  # cells said to wait for memory

    def run(self, reuse: bool) -> dict[str, str]:
        """Runs every cell not finished or reused (`_cells_to_run`); returns {cell: status}."""
        self.session_started = time.time()
        self.session = open_session(self.workdir, self.session_started)
        try:
            self.pending = _cells_to_run(self.study, self.workdir, self.cells, self.configs, self.totals, reuse,
                                         self.log, self.status)
            self.started = time.monotonic()
            try:
                self._loop()
            finally:
                self._stop_running()
            return self.status
        finally:
            update_session(self.workdir, self.session, self.session_started, len(self.launched), ended=True)

    def heartbeat(self) -> None:
        """The invocation's wall time so far, in its session of study.json."""
        update_session(self.workdir, self.session, self.session_started, len(self.launched), ended=False)

    def _loop(self) -> None:
        """Launches cells while fewer than `workers` run, collects finished ones, until none is left."""
        if not self.pending:
            self.progress()
        last_beat = time.monotonic()
        while self.pending or self.running:
            if time.monotonic() - last_beat >= HEARTBEAT_SECONDS:
                self.heartbeat()
                last_beat = time.monotonic()
            changed = False
            while self.pending and len(self.running) < self.workers and self.memory_holds(self.pending[0]):
                cell = self.pending.pop(0)
                if self.fits(cell):
                    self.launch(cell)
                changed = True
            if changed:
                self.progress()
            time.sleep(0.2)
            finished = [(name, t.process.returncode) for name, t in self.running.items()
                        if t.process.poll() is not None]
            for name, returncode in finished:
                self.finish(name, returncode)
            if finished and not (self.pending or self.running):
                self.progress()

    def progress(self) -> None:
        """One line: cells done, running, left and failed, the time so far and the ETA."""
        done = sum(s == "done" for s in self.status.values())
        failed = sum(s == "failed" for s in self.status.values())
        skipped = sum(s == "not started" for s in self.status.values())
        left = len(self.pending)
        eta = ""
        if self.durations and (left or self.running):
            per_cell = float(np.mean(self.durations))
            eta = f", ETA {format_seconds(per_cell * (left + len(self.running) / 2) / max(self.workers, 1))}"
        self.log(f"[{self.study.name}] cells: {done} done, {len(self.running)} running, {left} left"
                 + (f", {failed} failed" if failed else "")
                 + (f", {skipped} not started (would not finish in time)" if skipped else "")
                 + f" of {len(self.cells)}; elapsed {format_seconds(time.monotonic() - self.started)}{eta}")

    def fits(self, cell: Cell) -> bool:
        """Whether `cell` should finish before the deadline (always, without one or without an estimate);
        a cell that should not is marked "not started", with a line that says why."""
        if self.deadline is None:
            return True
        needed = expected_seconds(self.workdir, cell.name, self.totals[cell.name])
        left = self.deadline - time.monotonic()
        if needed is None or needed <= left:
            return True
        self.status[cell.name] = "not started"
        self.log(f"[{self.study.name}] cell {cell.name} not started: it should take about {format_seconds(needed)} "
                 f"and {format_seconds(max(left, 0))} is left of --finish-within")
        return False

    def memory_holds(self, cell: Cell) -> bool:
        """Whether the machine's available memory holds `cell` at its expected peak (`run.memory`) beside the
        cells running, each counted at what it has yet to reach of its own; always when none runs (it starts,
        and its trainer warns if it does not fit) or the peak is unknown.  A cell that must wait is said once."""
        expected = self.expected_peak(cell.name)
        if not self.running or expected is None:
            return True
        available = memory_lib.available_bytes()
        if available is None:
            return True
        growth = sum(max((self.expected_peak(name) or 0) - resident_bytes(t.process.pid), 0)
                     for name, t in self.running.items())
        if expected <= available - growth:
            return True
        if cell.name not in self.memory_waits:
            self.memory_waits.add(cell.name)
            self.log(f"[{self.study.name}] cell {cell.name} waits for memory: it expects to need "
                     f"{memory_lib.gib(expected)} at its peak, and the {memory_lib.gib(available)} available holds "
                     f"{memory_lib.gib(max(available - growth, 0))} beside the {len(self.running)} running "
                     f"(their peaks to come); {len(self.running)} at once, not --workers={self.workers}")
        return False

    def expected_peak(self, name: str) -> int | None:
        """A cell's expected peak memory in bytes (`run.memory.expected_peak` of its config, "auto"
        settings resolved as this machine resolves them), None where the model's sizes are unknown."""
        if name not in self.peaks:
            expected = memory_lib.expected_peak(self.runs[name])
            self.peaks[name] = None if expected is None else expected.total
        return self.peaks[name]

    def launch(self, cell: Cell) -> None:
        """Marks `cell` running in its cell.json (with this checkout's commit) and starts its trainer."""
        cell_dir = self.workdir / "cells" / cell.name
        cell_dir.mkdir(parents=True, exist_ok=True)
        before = read_json(cell_dir / CELL_FILE) or {}
        commits = list(before.get("commits", []))  # a resumed cell keeps its history, and its time so far
        spent = {"seconds_total": before["seconds_total"]} if "seconds_total" in before else {}
        write_json_atomic(cell_dir / CELL_FILE, {**spent,
            "overrides": _comparable(cell.overrides), "base_config": cell.base_config(self.study),
            "group": [list(g) for g in cell.group], "seed": cell.seed, "status": "running",
            "commits": commits + ([self.commit] if self.commit not in commits else []),
        })
        log_file = open(cell_dir / "train.log", "a")
        process = subprocess.Popen(train_command(self.study, cell, cell_dir), cwd=self.caller, stdout=log_file,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env,
                                   preexec_fn=_die_with_parent)
        self.running[cell.name] = _Trainer(process, time.monotonic(), log_file)
        self.launched.append(cell.name)
        self.heartbeat()  # on record from its first cell, even if killed before the next heartbeat

    def finish(self, name: str, returncode: int) -> None:
        """Records a trainer's end in its cell.json: done if it exited cleanly at its total, else failed."""
        trainer = self.running.pop(name)
        trainer.log_file.close()
        cell_dir = self.workdir / "cells" / name
        state = read_json(cell_dir / CELL_FILE) or {}
        records = read_records(cell_dir)
        ok = returncode == 0 and bool(records) and int(records[-1].get("env_steps") or 0) >= self.totals[name]
        state["status"] = "done" if ok else "failed"
        state["returncode"] = returncode
        if returncode == -signal.SIGKILL:
            state["killed"] = "SIGKILL"  # by the system: the OOM killer, most often
        else:
            state.pop("killed", None)
        state["seconds"] = round(time.monotonic() - trainer.started, 1)
        state["seconds_total"] = round(float(state.get("seconds_total", 0.0)) + state["seconds"], 1)
        write_json_atomic(cell_dir / CELL_FILE, state)
        self.status[name] = state["status"]
        if ok:
            self.durations.append(time.monotonic() - trainer.started)
        elif returncode == -signal.SIGKILL:
            self.log(killed_line(name, cell_dir))
        else:
            tail = (cell_dir / "train.log").read_text(errors="replace").strip().splitlines()[-1:] or [""]
            self.log(f"cell {name} failed (exit {returncode}): {tail[0][-200:]} (log: {cell_dir / 'train.log'})")

    def _stop_running(self) -> None:
        """Interrupted (or done): asks every trainer still running to stop cleanly, then waits for it."""
        for trainer in self.running.values():
            with contextlib.suppress(ProcessLookupError):
                trainer.process.send_signal(signal.SIGINT)
        for trainer in self.running.values():
            try:
                trainer.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                trainer.process.kill()
            trainer.log_file.close()


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
