"""A run directory's identity and files: `config.json` (what the checkpoints mean),
`config_changes.jsonl` (the resumable changes made since), `finished.json`
(the run reached its total), `environment.json` (where an environment registered
outside `envs_py` comes from, so that `evaluate` and `export` find it), and the
checks made before anything is written.

A re-run with the same `--workdir` resumes.  The directory's `config.json`
is its identity: a re-run that changes what the checkpoints mean (method,
environment, model, LoRA, critic, threads, ...) is refused with one line
naming the fields; the fields of `config.RESUMABLE_FIELDS` (run length,
checkpointing, logging, remat, the mesh, ...) may change and are recorded in
`config_changes.jsonl`.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import tempfile
from typing import Any

import ml_collections

import envs_py
from poad_jax.run import checkpoint as checkpoint_lib
from poad_jax.run import config as config_lib
from poad_jax.run import logfiles
from poad_jax.run.action_log import ACTIONS_FILE
from poad_jax.run.best_program import PROGRAM_FILE, RECORD_FILE, write_atomically
from poad_jax.run.config.errors import TrainError, one_line


CONFIG_FILE = "config.json"
CHANGES_FILE = "config_changes.jsonl"
FINISHED_FILE = "finished.json"
ENVIRONMENT_FILE = "environment.json"


def config_as_json(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """The config as `config.json` stores it (tuples become lists)."""
    return json.loads(config.to_json_best_effort())

def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"ppo.actor_lr": 1e-6, ...}: the leaves of a nested dict by dotted name."""
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def config_differences(stored: dict[str, Any], new: dict[str, Any]) -> tuple[list[str], dict[str, list]]:
    """(names of changed fields that change what the checkpoints mean, {resumable name: [old, new]}).

    A setting absent from the stored config (added to the code since) stands at
    its default there: the default describes the old run, so a new value that
    differs from it is a change like any other (`learn=False` in a run that
    learned is refused).  A field that is not a setting at all counts as resumable.
    """
    recorded, new_flat = flatten(stored), flatten(new)
    defaults = flatten(config_as_json(config_lib.default_config()))
    old_flat = {**{name: value for name, value in defaults.items() if name in new_flat}, **recorded}
    refused, safe = [], {}
    for name in sorted(set(old_flat) | set(new_flat)):
        old, value = old_flat.get(name, None), new_flat.get(name, None)
        if old == value:
            continue
        if config_lib.resumable_kind(name) is not None or name not in old_flat or name not in new_flat:
            safe[name] = [old, value]
        else:
            refused.append(name)
    return refused, safe


def describe_refusal(workdir: pathlib.Path, stored: dict[str, Any], new: dict[str, Any], refused: list[str]) -> str:
    """One line: which fields differ from the run directory's config, old -> new."""
    old_flat, new_flat = flatten(stored), flatten(new)
    shown = ", ".join(f"{name} {old_flat.get(name)!r} -> {new_flat.get(name)!r}" for name in refused[:6])
    more = f" and {len(refused) - 6} more" if len(refused) > 6 else ""
    return (
        f"{workdir} holds a run with a different configuration ({shown}{more}); resuming would misuse "
        f"its checkpoints: set them back, or use a new --workdir"
    )

def check_workdir(workdir: pathlib.Path) -> None:
    """Raises TrainError unless `workdir` is (or can become) a writable directory; writes nothing."""
    if workdir.exists() and not workdir.is_dir():
        raise TrainError(f"--workdir {workdir} is a file, not a directory")
    existing = workdir
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise TrainError(f"cannot create --workdir {workdir}: {existing} is a file")
    try:  # root passes os.access everywhere; only a real write tells
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        place = "it" if existing == workdir else existing
        raise TrainError(f"cannot use --workdir {workdir}: {place} is not writable "
                         f"({error.strerror or error})") from None

def check_cache_dir() -> pathlib.Path:
    """The cache root (`$POAD_CACHE`, else ~/.cache/poad_jax), created; TrainError if unusable."""
    configured = os.environ.get("POAD_CACHE")
    root = pathlib.Path(configured) if configured else pathlib.Path.home() / ".cache" / "poad_jax"
    what = f"POAD_CACHE={root}" if configured else f"the cache directory {root} (set POAD_CACHE to choose another)"
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=root):
            pass
    except OSError as error:
        raise TrainError(f"{what} is not a writable directory: {error.strerror or error}") from None
    return root

def default_workdir(config: ml_collections.ConfigDict) -> pathlib.Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return pathlib.Path("runs") / f"{config.name}-{config.method}-{stamp}"

def read_stored_config(workdir: pathlib.Path) -> dict[str, Any] | None:
    """The run directory's `config.json`, or None; TrainError if it is unreadable."""
    path = workdir / CONFIG_FILE
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise TrainError(f"{path} is unreadable ({one_line(error)}); use a new --workdir") from None

def prepare_workdir(workdir: pathlib.Path, config: ml_collections.ConfigDict) -> dict[str, list]:
    """Checks that `config` may run in `workdir`, writing nothing; returns the safe changes.

    A directory with checkpoints keeps its identity: changed fields outside
    config.RESUMABLE_FIELDS raise TrainError naming them.  A directory without a
    checkpoint holds no state that a different config could misread.
    """
    check_workdir(workdir)
    stored = read_stored_config(workdir) if workdir.is_dir() else None
    if stored is None or not checkpoint_lib.checkpoint_steps(workdir):
        return {}
    new = config_as_json(config)
    refused, safe = config_differences(stored, new)
    if refused:
        raise TrainError(describe_refusal(workdir, stored, new, refused))
    return safe

def write_config(workdir: pathlib.Path, config: ml_collections.ConfigDict, changes: dict[str, list]) -> None:
    """Writes `config.json` (atomically) and appends safe changes to `config_changes.jsonl`."""
    if changes:
        entry = {"time": datetime.datetime.now().isoformat(timespec="seconds"), "changes": changes}
        with open(workdir / CHANGES_FILE, "a") as f:
            f.write(json.dumps(entry) + "\n")
    write_atomically(workdir / CONFIG_FILE, config.to_json_best_effort(indent=2) + "\n")
    registered = envs_py.spec(config.env.name)
    if not registered.entry_point.startswith("envs_py."):  # the user's own: the next process must import it
        write_atomically(workdir / ENVIRONMENT_FILE, json.dumps(dataclasses.asdict(registered), indent=2) + "\n")


def register_recorded_environment(workdir: pathlib.Path, name: str) -> None:
    """Registers the run's own environment (`environment.json`) in this process, as the config file
    that trained it did; TrainError (one line) if its module does not import from here."""
    if name in envs_py.registry() or not (workdir / ENVIRONMENT_FILE).exists():
        return
    try:
        recorded = json.loads((workdir / ENVIRONMENT_FILE).read_text())
        envs_py.register(recorded["name"], recorded["entry_point"], recorded["description"],
                         **recorded.get("kwargs", {}))
        envs_py.spec(name).resolve()
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as error:
        raise TrainError(f"{workdir / ENVIRONMENT_FILE} is unreadable ({one_line(error)})") from None
    except ImportError as error:
        module = recorded["entry_point"].partition(":")[0]
        raise TrainError(f"environment {name!r} comes from module {module!r}, which does not import here "
                         f"({one_line(error)}): run from the directory that holds it, or add that directory to "
                         "PYTHONPATH") from None

def clear_stale_outputs(workdir: pathlib.Path) -> None:
    """Removes a checkpoint-less directory's outputs of another configuration (logs gzipped as a raw
    snapshot keeps them too: a prior cell copied from docs/results/raw)."""
    for name in ("metrics.jsonl", RECORD_FILE, PROGRAM_FILE, FINISHED_FILE, "curves.png", ACTIONS_FILE):
        (workdir / name).unlink(missing_ok=True)
        logfiles.packed_path(workdir / name).unlink(missing_ok=True)

def write_finished_marker(workdir: pathlib.Path, record: dict[str, Any], total: int) -> None:
    """`finished.json`: the run reached `total_env_steps` and its last checkpoint is committed."""
    marker = {"update": record["update"], "env_steps": record["env_steps"], "total_env_steps": total,
              "time": datetime.datetime.now().isoformat(timespec="seconds")}
    write_atomically(workdir / FINISHED_FILE, json.dumps(marker) + "\n")
