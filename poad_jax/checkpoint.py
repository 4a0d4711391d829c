"""Orbax checkpoints of a training run, and PEFT adapter export.

A checkpoint holds the train state (actor LoRA, critic head[, critic LoRA],
optimiser states, RNG, update counter) and a JSON record of everything else
a resumed run needs (env-step and episode counters, the rollout RNG state,
the metric history: the trainer rewrites `metrics.jsonl` from it on resume,
so the log always agrees with the checkpoint and survives its deletion).
Orbax writes each step to a temporary directory and renames it when
complete, so a `kill -9` at any moment leaves the previous checkpoint
intact: at most the updates since the last checkpoint are lost (and redone).

Damage: `restore_newest_intact` tries the newest checkpoint first and falls
back to older ones; a checkpoint that cannot be read (a truncated array
file, a missing `state` or `meta`) is moved to `<workdir>/damaged_checkpoints/`
(kept for inspection, out of Orbax's way) with one warning line.
Temporary directories of a save cut short (Ctrl-C, kill) are removed when a
checkpointer opens the directory.
"""

from __future__ import annotations

import gc
import json
import pathlib
import shutil
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp


def _keys_to_data(tree):
    """PRNG key arrays -> raw uint32 data (orbax stores plain arrays)."""
    return jax.tree.map(
        lambda x: jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x, tree
    )


def _data_to_keys(restored, template):
    return jax.tree.map(
        lambda r, t: jax.random.wrap_key_data(r) if jnp.issubdtype(t.dtype, jax.dtypes.prng_key) else r,
        restored,
        template,
    )


TMP_MARKER = ".orbax-checkpoint-tmp"
DAMAGED_DIR = "damaged_checkpoints"


class NoIntactCheckpointError(Exception):
    """Every checkpoint of a run directory is damaged (printed as one line)."""


def remove_unfinished_saves(directory: pathlib.Path) -> list[pathlib.Path]:
    """Deletes Orbax temporary directories (saves cut short) under `directory`; returns them."""
    removed = []
    if directory.is_dir():
        for path in directory.iterdir():
            if TMP_MARKER in path.name:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def checkpoint_steps(workdir: str | pathlib.Path) -> list[int]:
    """Steps of the committed checkpoints of a run directory, ascending (no Orbax needed)."""
    directory = pathlib.Path(workdir) / "checkpoints"
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit() and p.is_dir())


def _silence_abandoned_reads() -> None:
    """Keeps a failed restore's abandoned reads from printing tracebacks later.

    When one array of a checkpoint cannot be read, Orbax's other reads of
    that checkpoint end with exceptions nobody retrieves; when the garbage
    collector frees their coroutines (at some later moment, in the middle of
    training) Python prints each as a long "Exception ignored" traceback.
    The damage is already reported in one line, so from now on this
    process drops unraisable exceptions of Orbax coroutines (others still
    reach the previous hook).
    """
    previous = sys.unraisablehook
    if getattr(previous, "_poad_orbax_filter", False):
        return

    def hook(unraisable):
        code = getattr(unraisable.object, "cr_code", None)
        if code is not None and "orbax" in code.co_filename:
            return
        previous(unraisable)

    hook._poad_orbax_filter = True
    sys.unraisablehook = hook
    gc.collect()


class RunCheckpointer:
    """Saves and restores (train state, metadata) under `<workdir>/checkpoints`.

    Over several processes every process makes one and calls `save` and
    `restore` together (Orbax writes each process's shards and the JSON
    metadata from process 0); only process 0 removes unfinished saves and
    sets damaged checkpoints aside.

    `create=False` opens an existing run for reading only (export, evaluate):
    it creates no directory.
    """

    def __init__(self, workdir: str | pathlib.Path, max_to_keep: int = 2, create: bool = True):
        self.workdir = pathlib.Path(workdir).resolve()
        self.directory = self.workdir / "checkpoints"
        self.writable = create
        self.primary = jax.process_index() == 0  # over several processes, process 0 tidies the directory
        if create and self.primary:
            remove_unfinished_saves(self.directory)
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep if create else None, create=create,
                                                 read_only=not create),
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, metadata: dict[str, Any]) -> None:
        self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(_keys_to_data(state)),
                meta=ocp.args.JsonSave(metadata),
            ),
        )
        self.manager.wait_until_finished()

    def restore(self, template_state, step: int | None = None):
        """Restores (state, metadata) of `step` (default latest) into the template's structure."""
        step = self.latest_step() if step is None else step
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _keys_to_data(template_state))
        restored = self.manager.restore(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()),
        )
        return _data_to_keys(restored.state, template_state), restored.meta

    def restore_newest_intact(self, template_state, warn=print):
        """(state, metadata, step) of the newest checkpoint that reads back whole.

        Newer damaged checkpoints are moved to `<workdir>/damaged_checkpoints/`
        (only by a writable checkpointer) with one `warn` line each.  Raises
        NoIntactCheckpointError when none is intact; returns None when there
        is no checkpoint at all.
        """
        self.manager.reload()
        steps = sorted(self.manager.all_steps(), reverse=True)
        if not steps:
            return None
        for step in steps:
            try:
                state, meta = self.restore(template_state, step)
                if not isinstance(meta, dict) or "update" not in meta:
                    raise ValueError("its meta record lacks the update counter")
            except Exception as error:  # any read failure means this checkpoint is damaged
                reason = " ".join(str(error).split())[:160] or type(error).__name__
                _silence_abandoned_reads()
                moved = self._set_aside(step) if self.writable and self.primary else None
                warn(f"warning: checkpoint {step} is damaged ({reason}); "
                     + (f"moved to {moved}; " if moved else "") + "trying the one before it")
                continue
            return state, meta, step
        raise NoIntactCheckpointError(
            f"no intact checkpoint in {self.directory} (tried steps {', '.join(map(str, steps))}); "
            "start a new run with another --workdir"
        )

    def _set_aside(self, step: int) -> pathlib.Path | None:
        """Moves a damaged step out of Orbax's directory; returns where, or None if it stayed."""
        source = self.directory / str(step)
        target = self.workdir / DAMAGED_DIR / str(step)
        try:
            target.parent.mkdir(exist_ok=True)
            if target.exists():
                shutil.rmtree(target)
            source.rename(target)
        except OSError:
            return None
        self.manager.reload()
        return target

    def close(self) -> None:
        self.manager.close()


def numpy_rng_state(rng: np.random.Generator) -> dict[str, Any]:
    return json.loads(json.dumps(rng.bit_generator.state))


def set_numpy_rng_state(rng: np.random.Generator, state: dict[str, Any]) -> None:
    rng.bit_generator.state = state
