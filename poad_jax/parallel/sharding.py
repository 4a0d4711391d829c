"""Meshes, partition rules and shardings: poad_jax on many devices.

One device is today's code path: `mesh_from_config` returns None for the
default block (data = fsdp = tensor = 1) and nothing here is called.  With a
mesh, every array gets a `NamedSharding` from rules kept here as data, never
from the model (the model file stays the model and nothing else).

The mesh has three axes (docs/distributed.md):

    data    replicas: batch rows split, weights replicated
    fsdp    ZeRO-3: batch rows split, frozen weights split on their hidden
            dimension (XLA all-gathers one layer's weights inside the scan)
    tensor  Megatron: heads, MLP columns and vocabulary split, rows replicated

A partition rule is `(regex, PartitionSpec)`; an array takes the spec of the
first rule whose regex is found (`re.search`) in its tree path, written
`a/b/c` (e.g. `base/layers/weights/q_proj/value`).  Optimiser states
contain their parameter's path (`actor_opt_state/1/0/mu/layers/lora_a/...`)
and therefore follow their parameter.  An array that no rule matches, and
every scalar, is replicated.  A dimension that its mesh axes do not divide
is replicated (correct, merely not split).

Batch rows are split over `('data', 'fsdp')` on axis 0.  TokenBatch rows are
thread-major (row n = b * T + t), so with `num_threads % (data * fsdp) == 0`
each device holds whole rollout threads and the backups (GAE scans over each
thread's stream) never cross a device.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # batch rows are split over these

Rules = Sequence[tuple[str, P]]

_QKV_UP = r"(q_proj|k_proj|v_proj|gate_proj|up_proj)"
_O_DOWN = r"(o_proj|down_proj)"

# Training layout of the frozen base (shapes: models/llama.py).  Projections
# [L, in, out]: q, k, v, gate, up split `in` (the hidden size) over fsdp and
# `out` (heads, MLP columns) over tensor; o and down the other way round, so
# the tensor-split dimension is the one the next matmul contracts (Megatron).
# L is never split: the layer scan slices it.
BASE_TRAIN_RULES: tuple[tuple[str, P], ...] = (
    (rf"layers/weights/{_QKV_UP}\b", P(None, "fsdp", "tensor")),
    (rf"layers/weights/{_O_DOWN}\b", P(None, "tensor", "fsdp")),
    (r"layers/biases/", P(None, "tensor")),
    (r"(^|/)embed\b", P("tensor", "fsdp")),  # [V, H]
    (r"(^|/)lm_head\b", P("fsdp", "tensor")),  # [H, V]
)

# Sampling layout: the training layout without fsdp.  FSDP during decoding
# would all-gather every weight for every generated token.
BASE_SAMPLE_RULES: tuple[tuple[str, P], ...] = (
    (rf"layers/weights/{_QKV_UP}\b", P(None, None, "tensor")),
    (rf"layers/weights/{_O_DOWN}\b", P(None, "tensor", None)),
    (r"layers/biases/", P(None, "tensor")),
    (r"(^|/)embed\b", P("tensor", None)),
    (r"(^|/)lm_head\b", P(None, "tensor")),
)

# LoRA adapters (A [L, in, r], B [L, r, out]) replicated: small at 7B
# (r = 8 on q, v: 4M parameters), and a replicated adapter needs no
# collective in the forward pass.
LORA_REPLICATED_RULES: tuple[tuple[str, P], ...] = (
    (r"lora_(a|b)/", P()),
)

# LoRA adapters split like the weight they adapt (for large r on all
# targets at 34B-70B, where adapters plus Adam states reach gigabytes):
# A's `in` follows the base's `in`, B's `out` follows the base's `out`.
LORA_FOLLOW_BASE_RULES: tuple[tuple[str, P], ...] = (
    (rf"lora_a/{_QKV_UP}\b", P(None, "fsdp", None)),
    (rf"lora_b/{_QKV_UP}\b", P(None, None, "tensor")),
    (rf"lora_a/{_O_DOWN}\b", P(None, "tensor", None)),
    (rf"lora_b/{_O_DOWN}\b", P(None, None, "fsdp")),
)

LORA_SHARDINGS = ("replicated", "follow_base")

# Activations inside the layer scan (the residual stream `[B, T, H]`): rows
# over ('data', 'fsdp'), sequence and hidden whole.  Pinning them makes the
# partitioner all-gather an fsdp-split weight where a layer uses it (ZeRO-3)
# instead of moving rows to the weight's shard (traffic growing with B x T).
ACTIVATION_SPEC = P(BATCH_AXES)


def train_rules(lora_sharding: str = "replicated") -> tuple[tuple[str, P], ...]:
    """The training layout's rules: frozen base, LoRA (`lora_sharding`), and
    everything else (value head, RNG, counters) replicated by default."""
    if lora_sharding not in LORA_SHARDINGS:
        raise ValueError(f"lora_sharding must be one of {LORA_SHARDINGS}, got {lora_sharding!r}")
    lora = LORA_REPLICATED_RULES if lora_sharding == "replicated" else LORA_FOLLOW_BASE_RULES
    return lora + BASE_TRAIN_RULES


def sample_rules() -> tuple[tuple[str, P], ...]:
    """The sampling layout's rules (no fsdp anywhere; LoRA replicated)."""
    return LORA_REPLICATED_RULES + BASE_SAMPLE_RULES


# ---------------------------------------------------------------------------
# Meshes.


def mesh_shape(block: Any, num_devices: int) -> tuple[int, int, int]:
    """`(data, fsdp, tensor)` of a mesh block (the run's typed `mesh` section, a dict or any
    object with those fields), with a -1 axis resolved against `num_devices`."""
    get = block.get if isinstance(block, dict) or hasattr(block, "get") else lambda k, d: getattr(block, k, d)
    sizes = [int(get(axis, 1)) for axis in MESH_AXES]
    if any(size == 0 or size < -1 for size in sizes):
        raise ValueError(f"mesh sizes must be positive (or one -1), got {dict(zip(MESH_AXES, sizes))}")
    if sizes.count(-1) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got {dict(zip(MESH_AXES, sizes))}")
    if -1 in sizes:
        known = math.prod(s for s in sizes if s != -1)
        if num_devices % known:
            raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))}: {num_devices} devices are not a multiple of {known}")
        sizes[sizes.index(-1)] = num_devices // known
    if math.prod(sizes) > num_devices:
        raise ValueError(
            f"mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices; {num_devices} are visible "
            "(on CPU set XLA_FLAGS=--xla_force_host_platform_device_count=N before JAX starts)"
        )
    return tuple(sizes)


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1, devices: Sequence[Any] | None = None) -> Mesh:
    """A `('data', 'fsdp', 'tensor')` mesh over the first data*fsdp*tensor devices.

    Axes are `AxisType.Auto` (XLA propagates shardings; jax 0.10's
    `make_mesh` defaults to Explicit, which would ask every op for an output
    sharding).  `jax.make_mesh` orders devices for the interconnect (the
    tensor axis, last, gets the closest devices); across processes it keeps
    each process's devices together.
    """
    shape = (data, fsdp, tensor)
    devices = list(jax.devices() if devices is None else devices)
    count = math.prod(shape)
    if count > len(devices):
        raise ValueError(f"mesh {shape} needs {count} devices; {len(devices)} are visible")
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices[:count])


def mesh_from_config(block: Any, devices: Sequence[Any] | None = None) -> Mesh | None:
    """The mesh a config's `mesh` block asks for, or None for one device
    (then no sharding call is made anywhere: today's code path)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(block, len(devices))
    if shape == (1, 1, 1):
        return None
    return make_mesh(*shape, devices=devices)


def check_tensor_split(model_config: Any, mesh: Mesh | None) -> None:
    """Tensor parallelism splits attention by whole heads: `mesh.tensor` must
    divide the model's query heads and its KV heads (ValueError, one line).
    (A split inside a head would still compute correctly, through extra
    resharding at every attention; it is refused as a mistake.)"""
    tensor = 1 if mesh is None else int(dict(mesh.shape).get("tensor", 1))
    heads, kv_heads = int(model_config.num_attention_heads), int(model_config.num_key_value_heads)
    if heads % tensor or kv_heads % tensor:
        raise ValueError(f"mesh.tensor = {tensor} must divide the model's attention heads ({heads}) and "
                         f"KV heads ({kv_heads}): tensor parallelism splits whole heads")


def batch_shards(mesh: Mesh | None) -> int:
    """How many pieces batch rows are split into: data * fsdp (1 without a mesh)."""
    if mesh is None:
        return 1
    return math.prod(mesh.shape[axis] for axis in BATCH_AXES)


# ---------------------------------------------------------------------------
# Rules -> PartitionSpecs -> NamedShardings.


def path_string(path) -> str:
    """A tree path as `a/b/c` (the string partition rules match)."""
    return jax.tree_util.keystr(path, simple=True, separator="/")


def _axis_size(mesh_shape: dict[str, int], axes) -> int:
    if axes is None:
        return 1
    names = (axes,) if isinstance(axes, str) else tuple(axes)
    return math.prod(mesh_shape[name] for name in names)


def fit_spec(spec: P, shape: Sequence[int], mesh_shape: dict[str, int]) -> P:
    """`spec` for an array of `shape`: padded with None to its rank, and every
    dimension that its mesh axes do not divide replicated instead."""
    if len(spec) > len(shape):
        raise ValueError(f"partition spec {spec} has more dimensions than an array of shape {tuple(shape)}")
    entries = list(spec) + [None] * (len(shape) - len(spec))
    fitted = [axes if size % _axis_size(mesh_shape, axes) == 0 else None for axes, size in zip(entries, shape)]
    while fitted and fitted[-1] is None:
        fitted.pop()
    return P(*fitted)


def spec_for(path: str, shape: Sequence[int], rules: Rules, mesh_shape: dict[str, int]) -> P:
    """The PartitionSpec of the array at `path`: the first matching rule's,
    fitted to `shape`; replicated when no rule matches or for a scalar."""
    if len(shape) == 0:
        return P()
    for pattern, spec in rules:
        if re.search(pattern, path):
            return fit_spec(spec, shape, mesh_shape)
    return P()


def partition_specs(tree, rules: Rules, mesh: Mesh):
    """A PartitionSpec per array leaf of `tree` (arrays or ShapeDtypeStructs)."""
    sizes = dict(mesh.shape)
    return jax.tree_util.tree_map_with_path(
        lambda path, x: spec_for(path_string(path), np.shape(x), rules, sizes), tree
    )


def tree_shardings(tree, rules: Rules, mesh: Mesh):
    """A NamedSharding per leaf of `tree` (params, frozen base, optimiser
    states, LoRA, critic, a whole TrainState) placed by `rules`."""
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), partition_specs(tree, rules, mesh),
                        is_leaf=lambda x: isinstance(x, P))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh, rank: int = 1) -> NamedSharding:
    """Rows (axis 0) split over ('data', 'fsdp'), other axes whole."""
    del rank  # a spec shorter than the rank leaves the remaining axes whole
    return NamedSharding(mesh, P(BATCH_AXES))


def batch_shardings(batch, mesh: Mesh):
    """A NamedSharding per leaf of a batch (TokenBatch, dict of arrays): rows
    over ('data', 'fsdp').  Every leaf's leading dimension (N rows, or B
    threads for `bootstrap_value`) must divide evenly: with thread-major rows
    that is each device holding whole threads."""
    shards = batch_shards(mesh)

    def sharding(path, x):
        rows = np.shape(x)[0] if np.ndim(x) else None
        if rows is None or rows % shards:
            raise ValueError(
                f"batch leaf {path_string(path)} has {rows} rows, not divisible by data x fsdp = {shards}: "
                "use a number of rollout threads divisible by data x fsdp"
            )
        return batch_sharding(mesh)

    return jax.tree_util.tree_map_with_path(sharding, batch)


def activation_constraint(mesh: Mesh, spec: P = ACTIVATION_SPEC):
    """`x -> with_sharding_constraint(x, spec)` on `mesh`: the model's
    per-layer hook (`Llama.__call__(constrain=...)`, `PolicyGraph.constrain`).

    An array whose dimensions the spec's mesh axes do not all divide (a
    micro-batch of fewer rows than data x fsdp) passes through unconstrained
    (pinning it would replicate it): XLA then chooses, as without the hook.
    """
    sizes = dict(mesh.shape)

    def constrain(x: jax.Array) -> jax.Array:
        fitted = fit_spec(spec, np.shape(x), sizes)
        if fitted != fit_spec(spec, [0] * np.ndim(x), sizes):  # a dimension did not divide
            return x
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, fitted))

    return constrain


def place(tree, shardings):
    """`jax.device_put` of every leaf onto its sharding (host arrays are
    sliced per device, nothing is replicated first)."""
    return jax.device_put(tree, shardings)


def shard_batch(batch, mesh: Mesh):
    """The batch with rows split over ('data', 'fsdp')."""
    return place(batch, batch_shardings(batch, mesh))


def shard_by_rules(tree, mesh: Mesh, rules: Rules):
    """`tree` placed by `rules` on `mesh`."""
    return place(tree, tree_shardings(tree, rules, mesh))


def abstract_like(tree, shardings):
    """ShapeDtypeStructs of `tree` carrying `shardings` (for `.lower()` and
    for Orbax restore targets on another mesh)."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s), tree, shardings)


def specs_mention(specs: Iterable[P], axis: str) -> bool:
    """Whether any spec splits a dimension over `axis`."""
    for spec in jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, P)):
        for entry in spec:
            names = (entry,) if isinstance(entry, str) else tuple(entry or ())
            if axis in names:
                return True
    return False
