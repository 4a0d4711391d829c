"""One training run over several processes (one per host): start-up, who does
what, and the few exchanges between processes the training loop needs.

JAX's multi-controller model: every process runs the same Python program, and
every compiled call on a mesh that spans processes must be issued by all of
them with the same shapes.  What differs per process is only its data: each
steps its own share of the rollout threads (`thread_share`), with its own env
seeds and sampling noise (`env_seed`, `process_key`, `numpy_seed`), and
contributes its rows to the global batch (`global_rows`).  Shapes that
depend on the data (bucketed prompt and action lengths) are agreed with a
maximum over processes (`agree_max`); Python values (episode statistics,
checkpoint metadata) are exchanged as JSON (`allgather_json`).

With one process every function here is the identity or a constant, and
nothing is exchanged.
"""

from __future__ import annotations

import json
from typing import Any

import jax
import numpy as np

from poad_jax.parallel.sharding import make_mesh

# Env seeds of process p start at seed + p * ENV_SEED_STRIDE.  A VectorEnv
# seeds episode k of its env i with base + i + k * n (n envs), so two
# processes' episodes draw distinct seeds for the first ENV_SEED_STRIDE / n
# episodes of each env (250,000 with 4 envs per process).
ENV_SEED_STRIDE = 1_000_000


def initialize(block: Any) -> bool:
    """Joins the run's processes per the run's `distributed` settings (`coordinator`, `num_processes`,
    `process_id`: the trainer passes its checked config's section, as it joins before it types the
    config); True if this is a multi-process run.

    `coordinator`: "" (one process: nothing is called), "host:port" (process
    0's address; `num_processes` and `process_id` say who this is), or
    "auto" (`jax.distributed.initialize()` with no arguments: JAX reads
    SLURM, Open MPI, Kubernetes or Cloud TPU settings and
    `JAX_COORDINATOR_ADDRESS` itself).  Must run before JAX touches a device.
    Calling it again in a process that already joined is a no-op.
    """
    coordinator = block.coordinator
    if not coordinator:
        return False
    if jax.distributed.is_initialized():
        return True
    if coordinator == "auto":
        jax.distributed.initialize()
    else:
        jax.distributed.initialize(coordinator, num_processes=block.num_processes, process_id=block.process_id)
    return True


def is_primary() -> bool:
    """Process 0 writes the run's files (logs, plots, config, markers)."""
    return jax.process_index() == 0


def thread_share(num_threads: int, index: int, count: int) -> tuple[int, int]:
    """(first thread, number of threads) of process `index` of `count`: an
    equal, contiguous block of the global threads (thread-major rows then
    form one contiguous block of the global batch per process)."""
    if num_threads % count:
        raise ValueError(f"num_threads ({num_threads}) must be divisible by the number of processes ({count}): "
                         "each process steps an equal share of the rollout threads")
    share = num_threads // count
    return index * share, share


def env_seed(seed: int, index: int) -> int:
    """The base seed of process `index`'s envs (see ENV_SEED_STRIDE); `seed` for process 0."""
    return int(seed) + int(index) * ENV_SEED_STRIDE


def process_key(rng: jax.Array, index: int, count: int) -> jax.Array:
    """This process's sampling key: fold_in(rng, index) when there are several
    processes (the sampler's per-row keys count rows from 0 on every process,
    so the same key would give every process the same noise); `rng` alone."""
    return rng if count == 1 else jax.random.fold_in(rng, index)


def numpy_seed(seed: int, index: int, count: int):
    """The seed of this process's NumPy generator (action-score sampling):
    `seed` alone, or the pair (seed, index), a distinct SeedSequence stream."""
    return int(seed) if count == 1 else (int(seed), int(index))


def _allgather(values: np.ndarray) -> np.ndarray:
    """`[process_count, *values.shape]`: every process's `values` (same shape everywhere)."""
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(np.asarray(values)))


def agree_max(values) -> np.ndarray:
    """The elementwise maximum of an integer vector over all processes (shapes
    every process must compile alike); the vector itself for one process."""
    values = np.asarray(values, np.int64)
    if jax.process_count() == 1:
        return values
    return _allgather(values).max(axis=0)


def allgather_json(value: Any) -> list[Any]:
    """Every process's JSON-able `value`, in process order.

    Sent as UTF-8 bytes padded to a shared power-of-two length (so the gather
    compiles for few distinct shapes)."""
    if jax.process_count() == 1:
        return [value]
    data = np.frombuffer(json.dumps(value).encode(), np.uint8)
    longest = int(_allgather(np.array([data.size], np.int64)).max())
    width = 1 << max(longest - 1, 1).bit_length()
    padded = np.zeros(width, np.uint8)
    padded[: data.size] = data
    rows = _allgather(padded)
    return [json.loads(bytes(row).rstrip(b"\0").decode()) for row in rows]


def global_rows(tree, mesh, shardings_of):
    """This process's rows (a contiguous block, thread-major) as global arrays
    split over the mesh's batch axes: `jax.make_array_from_process_local_data`
    puts each local device's slice of the local rows on it, and the global
    leading size is the sum over processes.  `shardings_of(tree, mesh)` gives
    the per-leaf sharding with the global shapes (e.g.
    `sharding.batch_shardings`)."""
    count = jax.process_count()
    shapes = jax.tree.map(lambda x: (np.shape(x)[0] * count, *np.shape(x)[1:]), tree)
    abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(s, np.asarray(x).dtype), tree, shapes,
                            is_leaf=lambda x: isinstance(x, np.ndarray))
    shardings = shardings_of(abstract, mesh)
    return jax.tree.map(lambda x, s, shape: jax.make_array_from_process_local_data(s, np.asarray(x), shape),
                        tree, shardings, shapes, is_leaf=lambda x: isinstance(x, np.ndarray))


def check_mesh(mesh) -> None:
    """Raises ValueError unless `mesh` can carry a multi-process run: it uses
    every device of every process, and its batch axes split the rows into a
    multiple of the process count (each process's rows go to its own devices)."""
    count = jax.process_count()
    if mesh is None:
        raise ValueError(f"{count} processes need a mesh over their devices: set mesh.data=-1 (data parallel over "
                         f"all {jax.device_count()} devices) or another mesh")
    if mesh.devices.size != jax.device_count():
        raise ValueError(f"mesh {dict(mesh.shape)} uses {mesh.devices.size} of the {jax.device_count()} devices of "
                         f"{count} processes; a multi-process mesh must use them all (e.g. mesh.data=-1)")
    shards = int(np.prod([mesh.shape[a] for a in ("data", "fsdp")]))
    if shards % count:
        raise ValueError(f"mesh.data x mesh.fsdp ({shards}) must be a multiple of the number of processes "
                         f"({count}): each process's rows stay on its own devices")


def local_copy(tree):
    """A process-local copy of replicated (or gathered) global arrays: for work
    each process does alone, such as sampling its own threads.  Identity for
    arrays this process holds entirely."""
    from jax.experimental import multihost_utils

    def one(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return x
        if x.is_fully_replicated:
            return x.addressable_data(0)
        return jax.numpy.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree.map(one, tree)


def local_sampling_mesh(mesh):
    """The mesh a process samples its own threads on: its own devices, rows
    over `data`, the run mesh's `tensor` size kept when it divides them; None
    when the process has one device.  Sampling is process-local (each process
    decodes its threads alone), so no collective crosses hosts per token."""
    devices = jax.local_devices()
    tensor = int(mesh.shape["tensor"]) if mesh is not None else 1
    if len(devices) % tensor:
        tensor = 1
    if len(devices) == 1:
        return None
    return make_mesh(len(devices) // tensor, 1, tensor, devices=devices)
