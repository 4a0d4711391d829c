"""Everything a run needs, built from its typed settings in one place.

`build(run, placement)` is the one way from a run's typed settings (`run.config.Run`,
`typed(config)`, made once by each command) to the objects the library runs on; the
trainer, `poad_jax.tools.evaluate` and `poad_jax.tools.export` all use it, so a setting
means the same everywhere.  Nothing here reads a ConfigDict:

- `build_method`: the method with its `gamma_w` and `share_prompt`;
- `load_model`: the model and tokenizer, with the configured LoRA and dtypes
  (`jax_dtype`: the one table from a dtype's name to JAX's);
- the policy split into graph, frozen base and trainable parameters, with the
  value head and (for `critic.kind = "lora"`) a fresh critic adapter;
- the learner's and the rollouts' dataclasses (`run.ppo`, and `run.rollout` stopping at the
  tokenizer's end tokens: `config.stopping_at`);
- `Placement`: where the arrays live and which threads this process steps.
  One device is a placement too (no mesh, one process), so the training
  loop asks the placement and never branches on meshes or processes.

The run's random streams, all derived from `run.seed` (`RunSeeds`), are
today's: a checkpoint written before this module existed resumes to the same
numbers.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from poad_jax import parallel
from poad_jax.agent import sharded_update
from poad_jax.agent.experience import pack_batch, pack_batch_agreed, prefix_plans
from poad_jax.agent.learner import LearnerConfig, TrainState, init_train_state, jit_update
from poad_jax.agent.methods import GROUP_METHODS, GroupRelative, Method, make_method
from poad_jax.agent.rollout import RolloutConfig, RolloutCollector, StepRecord, merged_actor
from poad_jax.core.policy import FrozenBase, PolicyGraph, ValueHead, split_policy
from poad_jax.models import ModelLoadError, load
from poad_jax.models.loading import EMBEDDED_MODELS
from poad_jax.models.tiny import tiny_random_model
from poad_jax.parallel import hosts
from poad_jax.run import config as config_lib
from poad_jax.run import hardware
from poad_jax.run.config.errors import TrainError, one_line
from poad_jax.sampling import Sampler



def jax_dtype(name: str) -> Any:
    """JAX's dtype for a config's dtype name (`config.DTYPES`, `config.MATMUL_DTYPES`)."""
    if name not in config_lib.DTYPES:
        raise TrainError(f"unknown dtype {name!r}; choose one of {', '.join(config_lib.DTYPES)}")
    return getattr(jnp, name)


def matmul_dtype(name: str) -> Any:
    """The model's `matmul_dtype` option for a config's name: None for "float32" (matmuls in `dtype`);
    "auto" is this machine's choice (`hardware.resolve_matmul_dtype`)."""
    name = hardware.resolve_matmul_dtype(name)[0]
    return None if name == "float32" else jax_dtype(name)


class RunSeeds(NamedTuple):
    """Every seed and key a run derives from `run.seed`, in one place (the streams as they
    have always been: checkpoints and seeded runs reproduce).

    model: the tiny random model's weights; head: the value head's init (`nnx.Rngs`);
    critic_lora: the fresh critic adapter's key (`critic.kind="lora"` only; its own stream since
    2026-11-26, before that the rollout's first key, so a LoRA-critic run seeded before then
    starts from another critic adapter); learner: the train state's key (minibatch
    orders); rollout: the first key of the rollouts' stream (split once per update);
    numpy: the collector's NumPy generator (one process; several: `hosts.numpy_seed`);
    envs: the environments' seed (this process's: `hosts.env_seed`)."""

    model: int
    head: int
    critic_lora: jax.Array
    learner: jax.Array
    rollout: jax.Array
    numpy: int
    envs: int


def run_seeds(seed: int, process_index: int = 0) -> RunSeeds:
    return RunSeeds(model=seed, head=seed + 1, critic_lora=jax.random.fold_in(jax.random.key(seed + 1), 1),
                    learner=jax.random.key(seed), rollout=jax.random.key(seed + 1), numpy=seed,
                    envs=hosts.env_seed(seed, process_index))


def build_method(run: config_lib.Run) -> Method:
    """The run's method: `run.method` with `ppo.gamma`, `gamma_w` (negative: the method's
    default) and `share_prompt`.  Actions drawn from action scores pack the offered continuations
    when the entropy (`ppo.entropy_scope="offered"`) or the optimised log-probs
    (`ppo.behaviour_correction="importance"`) are over them; with the entropy only, the
    log-probs stay the full vocabulary's (the paper code's optimisation)."""
    scored = run.rollout.restricted_sampling == "action_scores"
    offered_entropy = run.ppo.entropy_scope == "offered"
    corrected = run.ppo.behaviour_correction == "importance"
    group = GroupRelative(run.method, run.group, run.rollout.num_threads, run.ppo.gamma)
    return make_method(run.method, run.ppo.gamma, run.scheme.gamma_w, share_prompt=run.scheme.share_prompt,
                       offered_continuations=scored and (offered_entropy or corrected),
                       vocabulary_logprobs=scored and offered_entropy and not corrected,
                       group=group if run.method in GROUP_METHODS else None)


def load_model(run: config_lib.Run):
    """(model, tokenizer) for `run.model`, with the configured LoRA and dtypes."""
    lora, dtype = run.lora, jax_dtype(run.dtype)
    options = dict(matmul_dtype=matmul_dtype(run.matmul_dtype), remat=run.remat)
    if run.model == "tiny-random":
        return tiny_random_model(seed=run.seed, lora=lora, dtype=dtype, **options)
    if run.model not in EMBEDDED_MODELS and not pathlib.Path(run.model).expanduser().exists():
        names = ", ".join([*EMBEDDED_MODELS, "tiny-random"])
        raise TrainError(f"no such model path or name: {run.model} (names: {names}; "
                         "or a Hugging Face directory or a .gguf file)")
    try:
        return load(run.model, dtype=dtype, lora=lora, **options)
    except ModelLoadError as error:
        raise TrainError(str(error)) from None
    except OSError as error:  # the cache or the model files cannot be read or written
        raise TrainError(f"cannot load model {run.model}: {one_line(error)}") from None


def build_value_head(model, run: config_lib.Run, seed: int) -> ValueHead:
    """The critic head `run.critic` describes."""
    return ValueHead(model.config.hidden_size, run.critic, rngs=nnx.Rngs(seed))


def fresh_critic_lora(model, key: jax.Array):
    """A second LoRA state for the critic: A uniform(+-1/sqrt(fan_in)), B zero."""
    critic_lora = nnx.split(model, nnx.LoRAParam, ...)[1]
    leaves, treedef = jax.tree.flatten(critic_lora)
    keys = jax.random.split(key, len(leaves))
    fresh = []
    for key, leaf in zip(keys, leaves):
        if jnp.any(leaf):  # an A matrix [L, in, r]
            bound = 1.0 / np.sqrt(leaf.shape[-2])
            fresh.append(jax.random.uniform(key, leaf.shape, leaf.dtype, -bound, bound))
        else:  # a B matrix: zero (a new buffer: the actor's B must not be aliased)
            fresh.append(jnp.zeros_like(leaf))
    return jax.tree.unflatten(treedef, fresh)


# ---------------------------------------------------------------------------
# Placement: devices and processes.


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a run's arrays live and which rollout threads this process steps.

    `mesh` None: one device, no sharding call anywhere (the compiled update is
    exactly the single-device one).  A mesh: the training layout of
    docs/distributed.md.  `count` > 1 processes: each steps threads
    `first_thread ... first_thread + threads - 1` and samples them on its own
    devices; the batch is assembled from every process's rows.
    """

    mesh: Mesh | None = None
    index: int = 0
    count: int = 1
    first_thread: int = 0
    threads: int = 0

    @property
    def primary(self) -> bool:
        """Process 0: the one that prints and writes the run's files."""
        return self.index == 0

    def describe(self) -> str | None:
        """The line that names the mesh (None for one device)."""
        if self.mesh is None:
            return None
        sizes = " x ".join(f"{axis} {size}" for axis, size in self.mesh.shape.items())
        local = jax.local_device_count()
        where = (f" in {self.count} processes (each samples on its {local} device{'s' * (local > 1)})"
                 if self.count > 1 else "")
        return f"mesh: {sizes} over {self.mesh.devices.size} {self.mesh.devices.flat[0].platform} devices{where}"

    def place_policy(self, graph: PolicyGraph, frozen: FrozenBase, params: dict[str, Any]):
        """(graph, frozen, params) in the training layout (as they are on one device)."""
        if self.mesh is None:
            return graph, frozen, params
        if self.count > 1:  # host values, identical in every process: each device takes its slice
            frozen, params = jax.tree.map(np.asarray, (frozen, params))
        frozen, params = sharded_update.shard_policy(frozen, params, self.mesh)
        # Behaviour statistics and the update both pin rows per layer (FSDP as ZeRO-3): the same
        # sums on both sides, so the first PPO ratio is exactly 1 on an fsdp mesh too.
        return sharded_update.constrained_graph(graph, self.mesh), frozen, params

    def learner(self, graph: PolicyGraph, method: Method, lconfig: LearnerConfig, params: dict[str, Any],
                key: jax.Array) -> tuple[Callable, Callable[[], int], TrainState]:
        """(the compiled update, its compile count, the initial train state)."""
        if self.mesh is None:
            update_fn, compiles = jit_update(graph, method, lconfig)
            return update_fn, compiles, init_train_state(params, lconfig, key)
        update_fn, compiles = sharded_update.jit_sharded_update(graph, method, lconfig, self.mesh)
        return update_fn, compiles, sharded_update.init_sharded_train_state(params, lconfig, key, self.mesh)

    def sampler(self, graph: PolicyGraph, frozen: FrozenBase, params: dict[str, Any],
                prompt_buckets: tuple[int, ...]) -> Sampler:
        """The acting policy: on a mesh, rows over the data axes and the base in its sampling
        layout; over several processes, each samples its own threads from a process-local copy."""
        if self.count == 1:
            return Sampler(merged_actor(graph, frozen, params), mesh=self.mesh, prompt_buckets=prompt_buckets)
        return Sampler(merged_actor(graph, *hosts.local_copy((frozen, params))),
                       mesh=hosts.local_sampling_mesh(self.mesh), prompt_buckets=prompt_buckets)

    def own_threads(self, collector: RolloutCollector, num_threads: int, seed: int) -> None:
        """Several processes: the collector steps this process's threads, with its own NumPy stream."""
        if self.count > 1:
            collector.take_thread_block(self.first_thread, num_threads, hosts.numpy_seed(seed, self.index, self.count))

    def rollout_key(self, key: jax.Array) -> jax.Array:
        """This process's sampling key (distinct noise per process; the key itself for one)."""
        return hosts.process_key(key, self.index, self.count)

    def batch_arrays(self, steps: list[list[StepRecord]], next_prompts: list[list[int]], method: Method,
                     rconfig: RolloutConfig, pad_id: int):
        """(batch arrays, next-prompt arrays) packed and placed: over several processes with shapes
        every process shares, each process's rows on its own devices; on a mesh, rows over the data
        axes, whole threads per device."""
        if self.count > 1:
            arrays = pack_batch_agreed(steps, next_prompts, method, rconfig, pad_id, hosts.agree_max)
            return tuple(hosts.global_rows(tree, self.mesh, parallel.batch_shardings) for tree in arrays)
        arrays, next_arrays = pack_batch(steps, next_prompts, method, rconfig, pad_id)
        if self.mesh is not None:
            return parallel.shard_batch(arrays, self.mesh), parallel.shard_batch(next_arrays, self.mesh)
        return arrays, next_arrays

    def prefix_plans(self, arrays: dict, next_arrays: dict, method: Method, run: config_lib.Run):
        """The update's packings of rows with their common prompt prefix once (`PrefixPlans`), with
        `prefix_packing=True`, a token-level method and one device; else None (rows as they are:
        on a mesh a packed group would span the devices that hold its rows)."""
        if not run.prefix_packing or not method.token_level or self.mesh is not None or self.count > 1:
            return None
        micro_batches = run.ppo.num_minibatches * run.ppo.accumulation_steps
        return prefix_plans(arrays, next_arrays, len(arrays["tokens"]) // micro_batches)


def placement_of(run: config_lib.Run) -> Placement:
    """The placement `run.mesh` asks for over the run's devices (every process's); TrainError
    (one line) if the devices do not fit it, or, over several processes, if the threads or the
    mesh do not split evenly between them; ConfigError if the threads or the minibatches do not
    split over the mesh's row axes with a -1 axis resolved.  Call after the processes have joined."""
    count, index = jax.process_count(), jax.process_index()
    num_threads = run.rollout.num_threads
    try:
        mesh = parallel.mesh_from_config(run.mesh)
        if count > 1:
            hosts.thread_share(num_threads, 0, count)
            hosts.check_mesh(mesh)
    except ValueError as error:
        raise TrainError(str(error)) from None
    if mesh is not None:  # the checks between threads and devices, with -1 resolved
        config_lib.check_row_devices(num_threads, run.rollout.rollout_length,
                                     run.ppo.num_minibatches * run.ppo.accumulation_steps,
                                     int(mesh.shape["data"]), int(mesh.shape["fsdp"]))
    first_thread, threads = hosts.thread_share(num_threads, index, count)
    return Placement(mesh, index, count, first_thread, threads)


# ---------------------------------------------------------------------------
# The build.


@dataclasses.dataclass(frozen=True)
class Built:
    """What `build` makes of a run's settings: the settings, the run's method and dataclasses, the
    tokenizer, and the policy split into its compiled graph, frozen base and trainable parameters
    (placed)."""

    settings: config_lib.Run  # the run's typed config (`run.config.typed`), as it was built from
    method: Method
    learner: LearnerConfig
    rollout: RolloutConfig
    tokenizer: Any
    graph: PolicyGraph
    frozen: FrozenBase
    params: dict[str, Any]
    placement: Placement
    seeds: RunSeeds


def build(run: config_lib.Run, placement: Placement | None = None) -> Built:
    """Builds what `run` describes (on `placement`, default one device): the method, the learner's
    and the rollouts' configs, the model (its weights loaded or made), the value head and, for a
    LoRA critic, a fresh critic adapter.  TrainError (one line) for a model that cannot load."""
    placement = Placement(threads=run.rollout.num_threads) if placement is None else placement
    seeds = run_seeds(run.seed, placement.index)
    method, lconfig = build_method(run), run.ppo
    model, tokenizer = load_model(run)
    head = build_value_head(model, run, seeds.head)
    graph, frozen, params = split_policy(model, head)
    if run.critic.kind == "lora":
        params["critic_lora"] = fresh_critic_lora(model, seeds.critic_lora)
    rconfig = config_lib.stopping_at(run.rollout, tuple(tokenizer.eos_token_ids))
    graph, frozen, params = placement.place_policy(graph, frozen, params)
    return Built(run, method, lconfig, rconfig, tokenizer, graph, frozen, params, placement, seeds)
