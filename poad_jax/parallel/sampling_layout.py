"""The sampler on a mesh: where its weights, rows and decode state live.

Decoding is one small forward pass per generated token, so any collective
inside the decode loop is paid once per token.  The layout therefore keeps
each device's work local:

- Frozen base: the sampling layout of `sharding.sample_rules()` (replicated
  over `data` and `fsdp`, split over `tensor` like Megatron), made once when
  the `Sampler` is built.  In the training layout (`fsdp`-split) every decode
  step would gather every weight (or all-reduce every activation) per token.
- Per-layer copies of the base (`models.decode.UnstackedWeights`): the same
  specs with the layer axis dropped (`UNSTACKED_SAMPLE_RULES`), made by a jit
  whose outputs carry them, so no copy lands on one device first.
- LoRA and the rest of the model: replicated (`set_lora` moves only these).
- Rows (prompts, trie tables, the decode carry's `[B, ...]` buffers): split
  over `('data', 'fsdp')`; the batch is padded with dummy rows (which start
  done) to a multiple of data x fsdp.
- KV cache `k [L, B, KV, S, D]`, `v [L, B, KV, D, S]`: rows over
  `('data', 'fsdp')`, KV heads over `tensor`; L and S whole, so the cache
  writes (`dynamic_update_slice` at layer l, slot s) stay local.  The decode
  loop pins its carry to these specs at entry and after every step
  (`constrain_carry`), so the partitioner never re-lays the cache out.

A dimension its mesh axes do not divide is replicated (`sharding.fit_spec`):
e.g. the KV heads when tensor > KV heads, the vocabulary of the tiny model.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from poad_jax.parallel.sharding import (
    BATCH_AXES,
    Rules,
    batch_shards,
    sample_rules,
    shard_by_rules,
    tree_shardings,
)

_QKV_UP = r"(q_proj|k_proj|v_proj|gate_proj|up_proj)"
_O_DOWN = r"(o_proj|down_proj)"

# `UnstackedWeights` paths: `layers/<i>/<name>` ([in, out]) and `head` ([H, V]):
# the stacked sampling specs of sharding.BASE_SAMPLE_RULES without the layer axis.
UNSTACKED_SAMPLE_RULES: tuple[tuple[str, P], ...] = (
    (rf"^layers/\d+/{_QKV_UP}$", P(None, "tensor")),
    (rf"^layers/\d+/{_O_DOWN}$", P("tensor", None)),
    (r"^head$", P(None, "tensor")),
)

# `sampling.loop.DecodeCarry` paths: the cache by rows and KV heads, the step
# counter and the cache's slot index replicated, every other leaf `[B, ...]` by rows.
CARRY_RULES: tuple[tuple[str, P], ...] = (
    (r"^cache/(k|v)$", P(None, BATCH_AXES, "tensor")),
    (r"^cache/index$", P()),
    (r"^step$", P()),
    (r".", P(BATCH_AXES)),
)

# Host arrays of one call (prompt tokens and masks, packed candidates, trie tables): rows.
ROW_SPEC = P(BATCH_AXES)


def padded_rows(rows: int, mesh: Mesh | None) -> int:
    """`rows` rounded up to a multiple of data x fsdp (the batch shards); the
    extra rows are dummies.  Unchanged without a mesh."""
    shards = batch_shards(mesh)
    return math.ceil(rows / shards) * shards


@dataclasses.dataclass(frozen=True)
class SamplingLayout:
    """The shardings of one `Sampler` on `mesh` (module docstring).

    The rules are fields so that another layout (e.g. the training layout, as
    the tests' tripwire) can be tried with everything else unchanged.
    """

    mesh: Mesh
    base_rules: Rules = dataclasses.field(default_factory=sample_rules)
    unstacked_rules: Rules = UNSTACKED_SAMPLE_RULES
    carry_rules: Rules = CARRY_RULES

    @property
    def row_shards(self) -> int:
        return batch_shards(self.mesh)

    def rows(self, bucket: int) -> int:
        """The batch a call runs with: its bucket padded to whole row shards."""
        return padded_rows(bucket, self.mesh)

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    def place_base(self, base):
        """The frozen base (an `nnx.State`) in the sampling layout: one copy,
        or none where the arrays already have these shardings (a data-only mesh)."""
        return shard_by_rules(base, self.mesh, self.base_rules)

    def place_replicated(self, tree):
        """LoRA, the rest of the model, an RNG key: on every device."""
        return jax.device_put(tree, self.replicated())

    def unstack(self, split_layers, stacked, head):
        """`split_layers(stacked, head)` (`models.decode.split_layers`) jitted with
        the per-layer copies' shardings as outputs: each device slices its own
        part of the (already placed) stack; nothing moves between devices."""
        shapes = jax.eval_shape(split_layers, stacked, head)
        return jax.jit(split_layers, out_shardings=tree_shardings(shapes, self.unstacked_rules, self.mesh))(
            stacked, head)

    def put_rows(self, array: np.ndarray) -> jax.Array:
        """A host array `[B, ...]` with its rows split over the batch shards
        (each device receives only its rows)."""
        return jax.device_put(array, NamedSharding(self.mesh, ROW_SPEC))

    def carry_shardings(self, carry):
        """A NamedSharding per leaf of a `DecodeCarry` (arrays or tracers)."""
        return tree_shardings(carry, self.carry_rules, self.mesh)

    def constrain_carry(self, carry):
        """The decode carry pinned to `carry_shardings` (inside a jit)."""
        return jax.lax.with_sharding_constraint(carry, self.carry_shardings(carry))
