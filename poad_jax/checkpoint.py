"""Orbax checkpoints of a training run, and PEFT adapter export.

A checkpoint holds the train state (actor LoRA, critic head[, critic LoRA],
optimiser states, RNG, update counter) and a JSON record of everything else
a resumed run needs (env-step and episode counters, the rollout RNG state,
the metric history).  Orbax writes each step to a temporary directory and
renames it when complete, so a `kill -9` at any moment leaves the previous
checkpoint intact: at most the update in flight is lost.
"""

from __future__ import annotations

import json
import pathlib
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


class RunCheckpointer:
    """Saves and restores (train state, metadata) under `<workdir>/checkpoints`."""

    def __init__(self, workdir: str | pathlib.Path, max_to_keep: int = 2):
        self.directory = pathlib.Path(workdir).resolve() / "checkpoints"
        self.manager = ocp.CheckpointManager(
            self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
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

    def close(self) -> None:
        self.manager.close()


def numpy_rng_state(rng: np.random.Generator) -> dict[str, Any]:
    return json.loads(json.dumps(rng.bit_generator.state))


def set_numpy_rng_state(rng: np.random.Generator, state: dict[str, Any]) -> None:
    rng.bit_generator.state = state
