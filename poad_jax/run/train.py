"""`python -m poad_jax.train --config=configs/datasci.py [--workdir=W] [--config.x=y ...]`

Trains POAD, NTPO or TWOSOME: rollouts in Python (`rollout.py`), one
compiled PPO update per rollout (`learner.py`), Orbax checkpoints after every
`checkpoint_every` updates.  Re-running the same command with the same
`--workdir` resumes from the latest checkpoint.

Writes to the workdir: `config.json`, `metrics.jsonl`, `tensorboard/`,
`curves.png`, `checkpoints/`; DataSciCoding runs also `best_program.py` and
`best_program.json` (`best_program.py`); when the run has reached
`total_env_steps`, `finished.json` (a marker a study runner can test).

The run directory's `config.json` is its identity: a re-run that changes
what the checkpoints mean (method, environment, model, LoRA, critic,
threads, ...) is refused with one line naming the fields; the fields in
`SAFE_TO_CHANGE` (run length, checkpointing, logging, remat, the mesh) may
change and are recorded in `config_changes.jsonl`.  Nothing is written to
the run directory before the configuration, the directory, the model and
the environment have been checked.  Every user mistake ends in one line on
stderr and exit status 2; Ctrl-C ends in one line and status 130.

Several processes (one per host, `config.distributed`; README "Several
hosts"): every process runs this same loop and issues the same compiled
calls; each steps its share of the threads (`parallel/hosts.py`), the
batch is assembled from every process's rows, and process 0 alone writes
the files above (Orbax checkpoints are saved and restored by all).
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import json
import logging
import os
import pathlib
import resource
import shlex
import shutil
import sys
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

import envs_py
from poad_jax.run import best_program as best_lib
from poad_jax.run import checkpoint as checkpoint_lib
from poad_jax.run import config as config_lib
from poad_jax import parallel
from poad_jax.agent import sharded_update
from poad_jax.core import flops as flops_lib
from poad_jax.parallel import hosts
from poad_jax.run import metrics as run_logging
from poad_jax.run.config import learner_config, load_config_file, rollout_config, split_config_argument  # noqa: F401  (part of this module's API)
from poad_jax.run.config import validate as validate_config
from poad_jax.agent.learner import init_train_state, make_update_fn
from poad_jax.agent.methods import UnknownMethodError, make_method
from poad_jax.models import ModelLoadError, load
from poad_jax.models.llama import LoraConfig
from poad_jax.models.loading import EMBEDDED_MODELS
from poad_jax.models.tiny import tiny_random_model
from poad_jax.core.policy import ValueHead, split_policy
from poad_jax.run.progress import NoProgress, RunProgress
from poad_jax.agent.rollout import EpisodeStats, RolloutCollector, actions_cut_off, episode_summary, merge_episode_states, merged_actor, step_summary
from poad_jax.agent.experience import behaviour_statistics, make_token_batch, pack_batch, pack_batch_agreed
from poad_jax.sampling import Sampler

DTYPES = {name: getattr(jnp, name) for name in config_lib.DTYPES}
MATMUL_DTYPES = {name: None if name == "float32" else getattr(jnp, name)
                 for name in config_lib.MATMUL_DTYPES}  # float32: matmuls in `dtype`

# The trainer's user mistakes (a bad value, workdir, model or environment) are one
# class with the configuration's: printed as one line, exit status 2.
TrainError = config_lib.ConfigError


# ---------------------------------------------------------------------------
# Configuration: defaults, validation and the conversion to the learner's and
# the rollouts' dataclasses live in `poad_jax.run.config`.


# Fields a re-run may change without changing what the checkpoints mean.
# A dotted name covers its whole sub-tree ("mesh" covers "mesh.data", ...).
SAFE_TO_CHANGE = ("total_env_steps", "checkpoint_every", "keep_checkpoints", "tensorboard", "plot", "name",
                  "env.vector_mode", "remat", "mesh", "share_prompt", "distributed", "prompt_bucket_step")
CONFIG_FILE = "config.json"
CHANGES_FILE = "config_changes.jsonl"
FINISHED_FILE = "finished.json"


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


def _is_safe(name: str) -> bool:
    return any(name == safe or name.startswith(safe + ".") for safe in SAFE_TO_CHANGE)


def config_differences(stored: dict[str, Any], new: dict[str, Any]) -> tuple[list[str], dict[str, list]]:
    """(names of changed fields that change what the checkpoints mean, {safe name: [old, new]}).

    A field absent from the stored config (added to the code since) counts
    as safe: its default describes the old run.
    """
    old_flat, new_flat = flatten(stored), flatten(new)
    refused, safe = [], {}
    for name in sorted(set(old_flat) | set(new_flat)):
        old, value = old_flat.get(name, None), new_flat.get(name, None)
        if old == value:
            continue
        if _is_safe(name) or name not in old_flat or name not in new_flat:
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
        place = "write to" if existing == workdir else f"create it under {existing}:"
        raise TrainError(f"cannot use --workdir {workdir}: cannot {place} {error.strerror or error}") from None


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


def load_model(config: ml_collections.ConfigDict):
    """(model, tokenizer) for `config.model`, with the configured LoRA and dtype."""
    lora = LoraConfig(
        rank=int(config.lora.rank), alpha=float(config.lora.alpha), targets=tuple(config.lora.targets)
    )
    dtype = DTYPES[config.dtype]
    options = dict(matmul_dtype=MATMUL_DTYPES[config.get("matmul_dtype", "float32")], remat=config.get("remat", "full"))
    if config.model == "tiny-random":
        return tiny_random_model(seed=int(config.seed), lora=lora, dtype=dtype, **options)
    if config.model not in EMBEDDED_MODELS and not pathlib.Path(str(config.model)).expanduser().exists():
        names = ", ".join([*EMBEDDED_MODELS, "tiny-random"])
        raise TrainError(f"no such model path or name: {config.model} (names: {names}; "
                         "or a Hugging Face directory or a .gguf file)")
    try:
        return load(config.model, dtype=dtype, lora=lora, **options)
    except ModelLoadError as error:
        raise TrainError(str(error)) from None
    except OSError as error:  # the cache or the model files cannot be read or written
        raise TrainError(f"cannot load model {config.model}: {best_lib.one_line(error)}") from None


def default_workdir(config: ml_collections.ConfigDict) -> pathlib.Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return pathlib.Path("runs") / f"{config.name}-{config.method}-{stamp}"


# ---------------------------------------------------------------------------
# The run.


@dataclasses.dataclass
class RunResult:
    workdir: pathlib.Path
    records: list[dict[str, Any]]
    state: Any
    episodes: dict[str, Any] = dataclasses.field(default_factory=dict)  # EpisodeStats.state_dict()
    best: best_lib.BestProgram | None = None
    finished: bool = False


def _fresh_critic_lora(model, seed: int):
    """A second LoRA state for the critic: A uniform(+-1/sqrt(fan_in)), B zero."""
    critic_lora = nnx.split(model, nnx.LoRAParam, ...)[1]
    leaves, treedef = jax.tree.flatten(critic_lora)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    fresh = []
    for key, leaf in zip(keys, leaves):
        if jnp.any(leaf):  # an A matrix [L, in, r]
            bound = 1.0 / np.sqrt(leaf.shape[-2])
            fresh.append(jax.random.uniform(key, leaf.shape, leaf.dtype, -bound, bound))
        else:  # a B matrix: zero (a new buffer: the actor's B must not be aliased)
            fresh.append(jnp.zeros_like(leaf))
    return jax.tree.unflatten(treedef, fresh)


def read_stored_config(workdir: pathlib.Path) -> dict[str, Any] | None:
    """The run directory's `config.json`, or None; TrainError if it is unreadable."""
    path = workdir / CONFIG_FILE
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise TrainError(f"{path} is unreadable ({best_lib.one_line(error)}); use a new --workdir") from None


def build_envs(config: ml_collections.ConfigDict, num_envs: int | None = None,
               seed: int | None = None) -> envs_py.VectorEnv:
    """The run's vector env (default: all `num_threads` threads, seeded by
    `config.seed`; a process of a multi-process run builds its share);
    TrainError (one line) for anything the user can fix (kwargs, data files)."""
    try:
        return envs_py.VectorEnv(
            config.env.name, int(config.num_threads) if num_envs is None else int(num_envs),
            seed=int(config.seed) if seed is None else int(seed),
            mode=str(config.env.vector_mode), **dict(config.env.kwargs),
        )
    except Exception as error:  # construction runs user-chosen kwargs and data files: say what failed
        raise TrainError(f"cannot build environment {config.env.name!r}: {best_lib.one_line(error)}") from None


def prepare_workdir(workdir: pathlib.Path, config: ml_collections.ConfigDict) -> dict[str, list]:
    """Checks that `config` may run in `workdir`, writing nothing; returns the safe changes.

    A directory with checkpoints keeps its identity: changed fields outside
    SAFE_TO_CHANGE raise TrainError naming them.  A directory without a
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
    best_lib.write_atomically(workdir / CONFIG_FILE, config.to_json_best_effort(indent=2) + "\n")


def clear_stale_outputs(workdir: pathlib.Path) -> None:
    """Removes a checkpoint-less directory's outputs of another configuration."""
    for name in ("metrics.jsonl", best_lib.RECORD_FILE, best_lib.PROGRAM_FILE, FINISHED_FILE, "curves.png"):
        (workdir / name).unlink(missing_ok=True)


def checkpoint_meta(update: int, collector: RolloutCollector, envs, rollout_rng, records) -> dict[str, Any]:
    """Everything besides the train state that a resumed run needs, metric history included.

    Over several processes (each calls this: it gathers) the record is the
    whole run's: every thread's episode counter in thread order, the merged
    episode history, and under `hosts` each process's own history and NumPy
    generator (Orbax writes this JSON from process 0 only)."""
    mine = {"episode_counters": envs.episode_counters, "episodes": collector.stats.state_dict(),
            "numpy_rng": checkpoint_lib.numpy_rng_state(collector.np_rng),
            "in_progress": episodes_in_progress(collector, envs)}
    everyone = hosts.allgather_json(mine)
    meta = {
        "update": update,
        "env_steps": collector.env_steps,
        "episode_counters": [c for host in everyone for c in host["episode_counters"]],
        "in_progress": {key: [v for host in everyone for v in host["in_progress"][key]]
                        for key in everyone[0]["in_progress"]},
        "episodes": merge_episode_states([host["episodes"] for host in everyone]),
        "numpy_rng": everyone[0]["numpy_rng"],
        "rollout_rng": np.asarray(jax.random.key_data(rollout_rng)).tolist(),
        "metrics": [run_logging.jsonable_record(r) for r in records],
    }
    if len(everyone) > 1:
        meta["hosts"] = [{"episodes": host["episodes"], "numpy_rng": host["numpy_rng"]} for host in everyone]
    return meta


def episodes_in_progress(collector: RolloutCollector, envs) -> dict[str, list[Any]]:
    """Per thread (this process's, in order): the actions of the episode in progress, the digest of the
    observation they led to and the return so far, so that a resumed run continues each episode where
    the checkpoint left it (`restore_episodes`) rather than restarting it."""
    return {"actions": envs.episode_actions,
            "digests": [envs_py.observation_digest(o) for o in collector.observations],
            "returns": list(collector.stats.running_return),
            "discounted": list(collector.stats.running_discounted),
            "lengths": list(collector.stats.running_length)}


def same_process_layout(meta: dict[str, Any], count: int) -> bool:
    """True if the checkpoint was written by `count` processes (one: the format before several)."""
    saved = meta.get("hosts")
    return len(saved) == count if saved is not None else count == 1


def restore_episodes(meta: dict[str, Any], collector: RolloutCollector, envs, counters: list[int],
                     first_thread: int, same_layout: bool) -> list[int]:
    """Resets the envs to their checkpointed episodes and replays each episode in progress (its actions,
    checked against the observation's digest); restores the running returns.  Checkpoints written
    before episodes were kept, or under another process layout, restart every episode.  Returns the
    threads (this process's) whose episode restarted although one was in progress."""
    saved = meta.get("in_progress")
    if saved is None or not same_layout:
        collector.observations = envs.reset(counters)
        return []
    mine = slice(first_thread, first_thread + envs.num_envs)
    actions, digests, returns = saved["actions"][mine], saved["digests"][mine], saved["returns"][mine]
    collector.observations, restarted = envs.resume(counters, actions, digests)
    # Checkpoints from before the discounted return was kept: that episode's is unknown (NaN).
    discounted = saved.get("discounted", [float("nan")] * len(saved["returns"]))[mine]
    lengths = saved.get("lengths", [0] * len(saved["returns"]))[mine]
    fresh = lambda values, zero: [zero if b in restarted else v for b, v in enumerate(values)]
    collector.stats.restore_running(fresh(returns, 0.0), fresh(discounted, 0.0), fresh(lengths, 0))
    return [b for b in restarted if actions[b]]


def host_meta(meta: dict[str, Any], index: int, count: int, first_thread: int,
              threads: int) -> tuple[list[int], dict[str, Any], dict[str, Any] | None]:
    """(episode counters, episode history, NumPy generator state or None) of
    process `index` of `count` from a checkpoint's meta record.

    Under the layout that wrote it, each process takes its own.  When the
    number of processes changed, each takes its threads' counters (the
    envs resume their episode numbers; process seeds differ, so the
    episodes themselves differ), process 0 takes the merged history and the
    others none (the run's merged history stays the same), and NumPy
    generators start afresh.
    """
    counters = list(meta["episode_counters"])[first_thread:first_thread + threads]
    saved = meta.get("hosts")
    if same_process_layout(meta, count):
        if saved is not None:
            return counters, saved[index]["episodes"], saved[index]["numpy_rng"]
        return counters, meta.get("episodes", meta), meta["numpy_rng"]  # written by one process
    return counters, meta["episodes"] if index == 0 else {}, None


def run_stats(stats: EpisodeStats) -> EpisodeStats:
    """The run's episode statistics: `stats` itself in one process; over
    several, every process's merged (a collective: all processes call it)."""
    if jax.process_count() == 1:
        return stats
    merged = EpisodeStats(running_return=[])
    merged.load_state_dict(merge_episode_states(hosts.allgather_json(stats.state_dict())))
    return merged


class _NoBestProgram:
    """The best-program keeper of a process other than 0: writes nothing."""

    best = None

    def offer(self, results, first_env_step: int, update: int) -> bool:
        del results, first_env_step, update
        return False


def write_finished_marker(workdir: pathlib.Path, record: dict[str, Any], total: int) -> None:
    """`finished.json`: the run reached `total_env_steps` and its last checkpoint is committed."""
    marker = {"update": record["update"], "env_steps": record["env_steps"], "total_env_steps": total,
              "time": datetime.datetime.now().isoformat(timespec="seconds")}
    best_lib.write_atomically(workdir / FINISHED_FILE, json.dumps(marker) + "\n")


def run(config: ml_collections.ConfigDict, workdir: str | pathlib.Path | None = None, show_progress: bool = True,
        max_updates: int | None = None) -> RunResult:
    """Trains (or resumes) the run described by `config` in `workdir`.

    `max_updates` stops after that many updates in this call (tests use it
    to interrupt a run).  Raises TrainError for user mistakes, before
    anything is written to `workdir`.
    """
    validate_config(config)
    join_processes(config)  # before anything else touches JAX
    mesh = device_mesh(config)  # the devices fit the mesh, checked before anything is written
    workdir = pathlib.Path(workdir) if workdir else default_workdir(config)
    changes = prepare_workdir(workdir, config)

    method = make_method(config.method, float(config.ppo.gamma), None if config.gamma_w < 0 else float(config.gamma_w),
                         share_prompt=bool(config.share_prompt))
    lconfig = learner_config(config)
    if show_progress and hosts.is_primary():  # a real model's first load converts its GGUF: seconds to a minute
        print(f"loading model {config.model}", flush=True)
    model, tokenizer = load_model(config)
    first_thread, threads = hosts.thread_share(int(config.num_threads), jax.process_index(), jax.process_count())
    envs = build_envs(config, threads, hosts.env_seed(int(config.seed), jax.process_index()))
    primary = hosts.is_primary()  # process 0 writes the run's files; every process saves checkpoints
    created = not workdir.exists()
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        has_checkpoint = bool(checkpoint_lib.checkpoint_steps(workdir))
        if primary and not has_checkpoint:
            stored = read_stored_config(workdir)
            if stored is not None and config_differences(stored, config_as_json(config))[0]:
                clear_stale_outputs(workdir)
        if primary:
            write_config(workdir, config, changes)
        return _train(config, workdir, method, lconfig, mesh, model, tokenizer, envs, show_progress, max_updates)
    except BaseException:
        # A start that failed (or was interrupted) before anything worth keeping leaves no directory.
        if primary and created and not checkpoint_lib.checkpoint_steps(workdir) \
                and not (workdir / best_lib.RECORD_FILE).exists():
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    finally:
        envs.close()


def join_processes(config: ml_collections.ConfigDict) -> None:
    """Joins a multi-process run (`config.distributed`; nothing for one
    process); TrainError (one line) when it cannot."""
    try:
        hosts.initialize(config.distributed)
    except Exception as error:  # unreachable coordinator, JAX already started, no cluster detected, ...
        where = config.distributed.coordinator
        raise TrainError(f"cannot join the run's processes (distributed.coordinator {where!r}): "
                         f"{best_lib.one_line(error)}") from None


def device_mesh(config: ml_collections.ConfigDict):
    """The mesh `config.mesh` asks for over the run's devices (every
    process's), or None for one device; TrainError (one line) if the devices
    do not fit it, or, over several processes, if the threads or the mesh do
    not split evenly between them."""
    try:
        mesh = parallel.mesh_from_config(config.mesh)
        if jax.process_count() > 1:
            hosts.thread_share(int(config.num_threads), 0, jax.process_count())
            hosts.check_mesh(mesh)
    except ValueError as error:
        raise TrainError(str(error)) from None
    if mesh is not None:
        resolved = config.copy_and_resolve_references()
        resolved.mesh.data, resolved.mesh.fsdp = int(mesh.shape["data"]), int(mesh.shape["fsdp"])
        config_lib.validate(resolved)  # the checks between threads and devices, with -1 resolved
    return mesh


def build_value_head(model, config: ml_collections.ConfigDict, seed: int) -> ValueHead:
    """The critic head `config.critic` describes (a run directory's config written
    before `critic.bias` / `critic.init` existed gets their defaults)."""
    critic = config.critic
    return ValueHead(model.config.hidden_size, tuple(critic.hidden_sizes), bias=bool(critic.get("bias", True)),
                     init=str(critic.get("init", "zero_output")), rngs=nnx.Rngs(seed))


def _train(config, workdir, method, lconfig, mesh, model, tokenizer, envs, show_progress, max_updates) -> RunResult:
    count, index = jax.process_count(), jax.process_index()
    primary = index == 0  # over several processes, process 0 alone prints and writes the run's files
    show_progress = show_progress and primary
    head = build_value_head(model, config, int(config.seed) + 1)
    graph, frozen, params = split_policy(model, head)
    if config.critic.kind == "lora":
        params["critic_lora"] = _fresh_critic_lora(model, int(config.seed))
    del model, head

    rconfig = rollout_config(config, tuple(tokenizer.eos_token_ids))
    if mesh is None:  # one device: no sharding call anywhere
        update_fn, update_compiles = make_update_fn(graph, method, lconfig)
        state = init_train_state(params, lconfig, jax.random.key(int(config.seed)))
    else:  # the training layout of docs/distributed.md
        if show_progress:
            sizes = " x ".join(f"{axis} {size}" for axis, size in mesh.shape.items())
            local = jax.local_device_count()
            where = f" in {count} processes (each samples on its {local} device{'s' * (local > 1)})" if count > 1 else ""
            print(f"mesh: {sizes} over {mesh.devices.size} {mesh.devices.flat[0].platform} devices{where}")
        if count > 1:  # host values, identical in every process: each device takes its slice
            frozen, params = jax.tree.map(np.asarray, (frozen, params))
        frozen, params = sharded_update.shard_policy(frozen, params, mesh)
        # Behaviour statistics and the update both pin rows per layer (FSDP as ZeRO-3): the same
        # sums on both sides, so the first PPO ratio is exactly 1 on an fsdp mesh too.
        graph = sharded_update.constrained_graph(graph, mesh)
        update_fn, update_compiles = sharded_update.make_sharded_update_fn(graph, method, lconfig, mesh)
        state = sharded_update.init_sharded_train_state(params, lconfig, jax.random.key(int(config.seed)), mesh)
    if count == 1:  # on a mesh: rows over the data axes, the base in its sampling layout (a copy only where it differs)
        sampler = Sampler(merged_actor(graph, frozen, params), mesh=mesh, prompt_buckets=rconfig.prompt_buckets)
    else:  # several processes: each samples its own threads, from a process-local copy, on its own devices
        sampler = Sampler(merged_actor(graph, *hosts.local_copy((frozen, params))),
                          mesh=hosts.local_sampling_mesh(mesh), prompt_buckets=rconfig.prompt_buckets)
    collector = RolloutCollector(envs, tokenizer, sampler, method, rconfig, seed=int(config.seed))
    target_head = jax.tree.map(jnp.copy, state.params["head"])  # a copy: the state is donated
    first_thread = index * envs.num_envs
    if count > 1:  # this process steps threads first_thread ... of the run's, with its own NumPy stream
        collector.take_thread_block(first_thread, int(config.num_threads),
                                    hosts.numpy_seed(int(config.seed), index, count))

    checkpointer = checkpoint_lib.RunCheckpointer(workdir, int(config.keep_checkpoints))
    logger = run_logging.MetricsLogger(workdir, tensorboard=bool(config.tensorboard) and primary, write=primary)
    keeper = best_lib.BestProgramKeeper(workdir, str(config.env.name), dict(config.env.kwargs)) if primary \
        else _NoBestProgram()
    records: list[dict[str, Any]] = []
    rollout_rng = jax.random.key(int(config.seed) + 1)
    total = int(config.total_env_steps)
    progress = None
    try:
        restored = checkpointer.restore_newest_intact(state, warn=lambda line: print(line, file=sys.stderr))
        if restored is None:
            logger.replace([])  # no checkpoint: updates logged by a killed start are redone
        else:
            state, meta, _ = restored
            collector.env_steps = int(meta["env_steps"])
            counters, episodes, numpy_rng = host_meta(meta, index, count, first_thread, envs.num_envs)
            collector.stats.load_state_dict(episodes)
            if numpy_rng is not None:
                checkpoint_lib.set_numpy_rng_state(collector.np_rng, numpy_rng)
            rollout_rng = jax.random.wrap_key_data(jnp.asarray(meta["rollout_rng"], jnp.uint32))
            restarted = restore_episodes(meta, collector, envs, counters, first_thread,
                                         same_process_layout(meta, count))
            if restarted:
                print(f"warning: {len(restarted)} episode(s) in progress at the checkpoint did not replay to the "
                      f"same observation (threads {[first_thread + b for b in restarted]}); they restart",
                      file=sys.stderr)
            target_head = jax.tree.map(jnp.copy, state.params["head"])  # restarts from the current head
            if meta.get("metrics") is not None:  # the log agrees with the checkpoint, even if deleted
                records = list(meta["metrics"])
                logger.replace(records)
            else:  # checkpoints written before the history was kept in them
                records = logger.truncate_after(int(meta["update"]))
            if show_progress:
                print(f"resuming {workdir} from update {meta['update']} ({collector.env_steps} env steps)")
        if collector.env_steps < total and primary:
            (workdir / FINISHED_FILE).unlink(missing_ok=True)
        run_episodes = run_stats(collector.stats)  # the whole run's episodes (all processes')

        if show_progress:
            progress = RunProgress(total, collector.env_steps, f"{config.method} {config.env.name}")
        else:
            progress = NoProgress()
        last_update = final_update(config, int(state.update_step), collector.env_steps, total)
        last_kl: float | None = None
        updates_this_call = 0
        while collector.env_steps < total and (max_updates is None or updates_this_call < max_updates):
            before, sampler_flops = dict(collector.timings), sampler.matmul_flops
            episodes_before = len(run_episodes.finished_returns)
            counters_before = run_episodes.counters()
            update_in_flight = int(state.update_step) + 1
            progress.phase(f"update {update_in_flight}/{last_update}: rollout")
            rollout_rng, collect_rng = jax.random.split(rollout_rng)
            collect_rng = hosts.process_key(collect_rng, index, count)  # distinct sampling noise per process

            def on_step(new_steps):
                progress.advance(new_steps, run_logging.progress_postfix(run_episodes.state_dict(), last_kl))

            def on_results(results, first_env_step):
                keeper.offer(results, first_env_step, update_in_flight)

            sampler.set_lora(hosts.local_copy(state.params["actor"]))
            steps, next_prompts = collector.collect(collect_rng, on_step, on_results)
            run_episodes = run_stats(collector.stats)
            progress.phase(f"update {update_in_flight}/{last_update}: learning")
            start = time.perf_counter()
            if count > 1:  # shapes shared by all processes; each process's rows go to its own devices
                arrays, next_arrays = pack_batch_agreed(steps, next_prompts, method, rconfig, tokenizer.pad_token_id,
                                                        hosts.agree_max)
                arrays, next_arrays = (hosts.global_rows(tree, mesh, parallel.batch_shardings)
                                       for tree in (arrays, next_arrays))
            else:
                arrays, next_arrays = pack_batch(steps, next_prompts, method, rconfig, tokenizer.pad_token_id)
            if mesh is not None and count == 1:  # rows over the data axes, whole threads per device
                arrays, next_arrays = parallel.shard_batch(arrays, mesh), parallel.shard_batch(next_arrays, mesh)
            value_head = target_head if config.critic.target_update_every > 0 else state.params["head"]
            stats = behaviour_statistics(
                graph, frozen, state.params, value_head, arrays, next_arrays,
                method=method, temperature=lconfig.temperature, critic_kind=lconfig.critic_kind,
            )
            batch = make_token_batch(arrays, stats)
            jax.block_until_ready(batch)
            behaviour_seconds = time.perf_counter() - start
            start = time.perf_counter()
            state, metrics = update_fn(state, frozen, batch)
            metrics = jax.device_get(hosts.local_copy(metrics))
            learner_seconds = time.perf_counter() - start
            update = int(state.update_step)
            if config.critic.target_update_every > 0 and update % int(config.critic.target_update_every) == 0:
                target_head = jax.tree.map(jnp.copy, state.params["head"])  # a copy: the state is donated
            record = {
                "update": update,
                "env_steps": collector.env_steps,
                **episode_summary(run_episodes, since=episodes_before),
                **step_summary(run_episodes, counters_before),
                **{k: float(v) for k, v in metrics.items()},
                "actions_cut_off": sum(hosts.allgather_json(actions_cut_off(steps, rconfig))),
                "batch_prompt_len": int(batch.prompt_len),
                "batch_action_len": int(batch.action_len),
                **update_cost_record(config, method, batch, sampler, sampler_flops, update_compiles()),
                "seconds_sampling": collector.timings["sampling"] - before["sampling"],
                "seconds_env": collector.timings["env"] - before["env"],
                "seconds_behaviour": behaviour_seconds,
                "seconds_learner": learner_seconds,
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
            }
            logger.log(record)
            records.append(record)
            updates_this_call += 1
            if update % int(config.checkpoint_every) == 0 or collector.env_steps >= total:
                progress.phase(f"update {update}/{last_update}: saving")
                checkpointer.save(update, state, checkpoint_meta(update, collector, envs, rollout_rng, records))
            if collector.env_steps >= total and primary:
                write_finished_marker(workdir, records[-1], total)
            last_kl = record["approx_kl"]
            progress.show(run_logging.progress_postfix(run_episodes.state_dict(), last_kl))
    finally:
        if progress is not None:
            progress.close()
        logger.close()
        checkpointer.close()
    episodes = run_episodes.state_dict()
    if config.plot and records and primary:
        run_logging.plot_curves(records, workdir / "curves.png", episodes)
    finished = bool(records) and records[-1]["env_steps"] >= total
    return RunResult(workdir, records, state, episodes, keeper.best, finished)


def final_update(config: ml_collections.ConfigDict, update: int, env_steps: int, total: int) -> int:
    """The update the run ends at: `update` plus the updates (of num_threads x rollout_length
    env steps, all processes') that `total - env_steps` needs, rounded up."""
    per_update = int(config.num_threads) * int(config.rollout_length)
    return update + max(0, -(-(total - env_steps) // per_update))


def update_cost_record(config: ml_collections.ConfigDict, method, batch, sampler: Sampler, sampler_flops_before: int,
                       learner_compiles: int) -> dict[str, int]:
    """An update's cost fields: the compilations so far (`compiles_*`) and the matmul FLOPs
    (`flops_*`, `poad_jax.core.flops`) of its sampler calls (this process's: the sampler's count
    since `sampler_flops_before`), its behaviour pass and its learner update (the whole batch's)."""
    passes = method.scheme.passes(batch.tokens.shape, batch.action_len)
    counted = flops_lib.update_flops(
        sampler.model_config, passes, head_sizes=tuple(config.critic.hidden_sizes), next_rows=batch.num_threads,
        prompt_len=batch.prompt_len, critic_kind=str(config.critic.kind), remat=str(config.remat),
        epochs=int(config.ppo.epochs))
    return {"compiles_learner": int(learner_compiles), "compiles_sampler": int(sampler.compile_count),
            "flops_sampler": int(sampler.matmul_flops - sampler_flops_before),
            "flops_behaviour": counted["behaviour"], "flops_learner": counted["learner"]}


def advice_lines(config: ml_collections.ConfigDict, episodes: dict[str, Any]) -> list[str]:
    """What to try when the run achieved nothing (no step or episode succeeded)."""
    steps, ok = int(episodes.get("steps", 0)), int(episodes.get("succeeded_steps", 0))
    if not steps or ok or any(episodes.get("finished_success", [])):
        return []
    if str(config.env.name).startswith("datasci/"):
        if "smollm2" in str(config.model).lower():
            return [f"why: SmolLM2-135M rarely writes runnable scikit-learn code (0 of {steps} here); "
                    "the default configs/datasci.py uses a code model (Qwen2.5-Coder-0.5B: about 3 in 4 "
                    "programs run before training)."]
        return ["try: read the failures above; more sampling.max_new_tokens if programs are cut off, "
                "or a longer run (--config.total_env_steps)."]
    return ["try: a longer run (--config.total_env_steps) or a larger learning rate (ppo.actor_lr)."]


def cut_off_lines(config: ml_collections.ConfigDict, records: list[dict[str, Any]]) -> list[str]:
    """How many actions (programs) the token limit cut off, when any was (older records lack the count)."""
    cut = sum(int(record.get("actions_cut_off") or 0) for record in records)
    if not cut:
        return []
    return [f"{cut} of {records[-1]['env_steps']} programs were cut off by sampling.max_new_tokens "
            f"({int(config.sampling.max_new_tokens)} tokens)."]


RESUME_OPTIONS = ("--workdir", "--config.total_env_steps")  # what `continue_command` sets itself


def continue_command(argv: list[str], workdir: pathlib.Path, total_env_steps: int) -> str:
    """The command line `argv` (the one that ran) with this run directory and `total_env_steps`:
    the command that trains the same run further (it resumes from the last checkpoint)."""
    kept, skip_value = [], False
    for arg in argv[1:]:
        if skip_value:
            skip_value = False
        elif arg.split("=", 1)[0] in RESUME_OPTIONS:
            skip_value = "=" not in arg  # `--workdir W`: its value is the next argument
        else:
            kept.append(arg)
    python = sys.executable or "python"
    relative = os.path.relpath(python)
    python = python if relative.startswith("..") else relative  # `.venv/bin/python` when run from its checkout
    return shlex.join([python, "-m", "poad_jax.train", *kept, f"--workdir={workdir}",
                       f"--config.total_env_steps={total_env_steps}"])


def continue_lines(config: ml_collections.ConfigDict, result: RunResult, argv: list[str] | None = None) -> list[str]:
    """How to go on: a finished run trains further with more env steps (twice as many here), a run
    stopped early resumes; shown as the full command when `argv` (the command that ran) is known."""
    if not result.records:
        return []
    more = 2 * int(config.total_env_steps) if result.finished else int(config.total_env_steps)
    what = "to continue training" if result.finished else "to finish the run"
    update = result.records[-1]["update"]
    if argv is None:
        return [f"{what}: re-run with --workdir={result.workdir} --config.total_env_steps={more} "
                f"(it resumes from update {update})."]
    return [f"{what} (it resumes from update {update}, up to {more} env steps):",
            f"  {continue_command(argv, result.workdir, more)}"]


def summary_text(config: ml_collections.ConfigDict, result: RunResult, argv: list[str] | None = None) -> str:
    """The end-of-run summary: the metric table, what the run achieved in words, the best program,
    what to try if nothing succeeded, and how to continue (`continue_lines`)."""
    datasci = str(config.env.name).startswith("datasci/") or result.best is not None  # an env with programs
    unit = ("programs", "ran", "AUC") if datasci else ("steps", "succeeded", "reward")
    lines = [run_logging.summary_table(result.records), ""]
    lines += run_logging.run_summary_lines(result.records, result.episodes, int(config.total_env_steps), *unit)
    if datasci:
        lines += cut_off_lines(config, result.records)
        lines += best_lib.summary_lines(result.best, result.workdir)
    lines += advice_lines(config, result.episodes)
    lines += continue_lines(config, result, argv)
    return "\n".join(lines)


def enable_compilation_cache(cache_root: pathlib.Path | None = None) -> None:
    """Persists XLA compilations across runs (a resumed or repeated run skips
    most compile time).  `$JAX_COMPILATION_CACHE_DIR` wins; the default is
    `<cache root>/jax` (`$POAD_CACHE`, else ~/.cache/poad_jax; checked by
    `check_cache_dir` when not given)."""
    cache_root = check_cache_dir() if cache_root is None else cache_root
    if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        jax.config.update("jax_compilation_cache_dir", str(cache_root / "jax"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


USER_ERRORS = (TrainError, UnknownMethodError, envs_py.UnknownEnvError, checkpoint_lib.NoIntactCheckpointError,
               best_lib.BestProgramError)
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C


def fail(message: str) -> None:
    """Prints `error: <message>` as one line on stderr and exits with status 2."""
    print(f"error: {best_lib.one_line(message)}", file=sys.stderr)
    sys.exit(EXIT_USER_ERROR)


def interrupted_line(workdir: pathlib.Path) -> str:
    """The one line a Ctrl-C prints: where a re-run resumes."""
    steps = checkpoint_lib.checkpoint_steps(workdir)
    if steps:
        return f"interrupted: {workdir} resumes from update {steps[-1]} when you re-run the same command"
    return "interrupted before the first checkpoint; re-running the same command starts the run again"


class _DropInterruptTracebacks(logging.Filter):
    """Orbax logs a Ctrl-C that lands while a checkpoint is being finalised as an
    error with a traceback, then re-raises it; `main` reports the interrupt in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and record.exc_info[0] is KeyboardInterrupt)


def _quiet_interrupts_in_orbax_logs() -> None:
    absl_logger = logging.getLogger("absl")
    if not any(isinstance(f, _DropInterruptTracebacks) for f in absl_logger.filters):
        absl_logger.addFilter(_DropInterruptTracebacks())


def main(config: ml_collections.ConfigDict, workdir: pathlib.Path, compilation_cache: bool = True,
         show_progress: bool = True, argv: list[str] | None = None) -> int:
    """Runs the training command; returns the exit status (0, 2 for a user mistake, 130 for Ctrl-C).

    `compilation_cache=False` leaves JAX's process-wide cache setting alone
    (tests); the cache directory is checked either way.  `argv`, the
    command line, lets the summary print the command that continues the run.
    """
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax logs every save at INFO
    _quiet_interrupts_in_orbax_logs()
    try:
        cache_root = check_cache_dir()
        if compilation_cache:
            enable_compilation_cache(cache_root)
        result = run(config, workdir, show_progress=show_progress)
    except USER_ERRORS as error:
        print(f"error: {best_lib.one_line(error)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        checkpoint_lib.remove_unfinished_saves(workdir / "checkpoints")
        print(f"\n{interrupted_line(workdir)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    primary = hosts.is_primary()
    if jax.process_count() > 1:
        jax.distributed.shutdown()  # a barrier: no process leaves while another still needs it
    if primary:
        print()
        print(summary_text(config, result, argv))
        print(f"\nrun directory: {result.workdir}")
    return 0


# ---------------------------------------------------------------------------
# Command line.


def option_value(argv: list[str], name: str) -> str | None:
    """The value of `--name=V` or `--name V` in argv (the last one wins), else None."""
    value = None
    for i, arg in enumerate(argv):
        if arg.startswith(f"--{name}="):
            value = arg.split("=", 1)[1]
        elif arg == f"--{name}" and i + 1 < len(argv):
            value = argv[i + 1]
    return value


def unknown_override(config: ml_collections.ConfigDict, argv: list[str]) -> str | None:
    """One line for the first `--config.a.b=...` naming no field of `config` (with a close match), else None."""
    for arg in argv:
        if not arg.startswith("--config."):
            continue
        dotted = arg[len("--config."):].split("=", 1)[0]
        node: Any = config
        for depth, part in enumerate(dotted.split(".")):
            keys = list(node.keys()) if isinstance(node, (ml_collections.ConfigDict, dict)) else []
            if part not in keys:
                where = ".".join(dotted.split(".")[:depth])
                close = difflib.get_close_matches(part, keys, n=1)
                hint = f"; did you mean {(where + '.') if where else ''}{close[0]}?" if close else ""
                return f"unknown config field {dotted}{hint}"
            node = node[part]
    return None


def parse_command_line(argv: list[str]) -> tuple[ml_collections.ConfigDict, pathlib.Path]:
    """(config with overrides, workdir) from argv; exits with one line for any mistake."""
    from absl import flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, "Path to a config file, e.g. configs/datasci.py.", lock_config=True)
    flags.DEFINE_string("workdir", "", "Run directory (default runs/<config>-<method>-<timestamp>); re-use to resume.")
    path = option_value(argv[1:], "config")
    if path is None:
        fail("--config is required, e.g. --config=configs/datasci.py")
    if split_config_argument(path)[0].is_file():
        try:
            base = load_config_file(path)
        except Exception as error:  # the user's config file itself fails to run
            fail(f"cannot load config file {path}: {type(error).__name__}: {error}")
        problem = unknown_override(base, argv[1:])
        if problem:
            fail(problem)
    elif ":" not in path:  # config_flags also accepts `file.py:argument`
        fail(f"no config file at {path}")
    try:
        flags.FLAGS(argv)
        config = flags.FLAGS.config
    except flags.Error as error:
        fail(str(error))
    except Exception as error:  # config_flags surfaces override problems as KeyError/AttributeError/...
        fail(f"{type(error).__name__}: {str(error).encode().decode('unicode_escape')}")
    if config is None:
        fail(f"cannot load config file {path}")
    workdir = flags.FLAGS.workdir
    return config, pathlib.Path(workdir) if workdir else default_workdir(config)


def cli(argv: list[str] | None = None) -> None:
    argv = list(sys.argv if argv is None else argv)
    config, workdir = parse_command_line(argv)
    status = main(config, workdir, argv=argv)
    if status == EXIT_INTERRUPTED:
        # Ctrl-C during a background checkpoint save can leave one of Orbax's worker threads
        # waiting on an executor that was shut down ("cannot schedule new futures after
        # shutdown"), and interpreter exit joins such threads: seen as a hang on a loaded
        # machine. Everything worth keeping is on disk by now (finished checkpoints; unfinished
        # saves removed; metrics and TensorBoard flushed per update), so leave without the join.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


if __name__ == "__main__":
    cli()
