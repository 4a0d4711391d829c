"""`python -m poad_jax.train --config=configs/datasci.py [--workdir=W] [--config.x=y ...]`

Trains POAD, NTPO or TWOSOME: rollouts in Python (`rollout.py`), one
compiled PPO update per rollout (`learner.py`), Orbax checkpoints after every
`checkpoint_every` updates.  Re-running the same command with the same
`--workdir` resumes from the latest checkpoint.

Writes to the workdir: `config.json`, `metrics.jsonl`, `tensorboard/`,
`curves.png`, `checkpoints/`.
"""

from __future__ import annotations

import dataclasses
import datetime
import pathlib
import resource
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

import envs_py
from poad_jax import checkpoint as checkpoint_lib
from poad_jax import logging as run_logging
from poad_jax.learner import LearnerConfig, init_train_state, make_update_fn
from poad_jax.methods import METHODS, UnknownMethodError, make_method
from poad_jax.models.llama import REMAT_POLICIES, LoraConfig
from poad_jax.policy import ValueHead, split_policy
from poad_jax.rollout import (
    RolloutCollector,
    RolloutConfig,
    behaviour_statistics,
    episode_summary,
    make_token_batch,
    merged_actor,
    pack_batch,
)
from poad_jax.sampling import Sampler, SamplingConfig

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
MATMUL_DTYPES = {"float32": None, "bfloat16": jnp.bfloat16}  # float32: matmuls in `dtype`


class TrainError(Exception):
    """A user error in the run's configuration or inputs (printed as one line)."""


# ---------------------------------------------------------------------------
# Configuration.


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Raises TrainError with one clear line for a bad configuration value."""
    if config.method not in METHODS:
        raise TrainError(f"unknown method {config.method!r}; choose one of {', '.join(METHODS)}")
    if config.dtype not in DTYPES:
        raise TrainError(f"dtype must be one of {', '.join(DTYPES)}, got {config.dtype!r}")
    if config.get("matmul_dtype", "float32") not in MATMUL_DTYPES:
        raise TrainError(f"matmul_dtype must be one of {', '.join(MATMUL_DTYPES)}, got {config.matmul_dtype!r}")
    if config.get("remat", "full") not in REMAT_POLICIES:
        raise TrainError(f"remat must be one of {', '.join(REMAT_POLICIES)}, got {config.remat!r}")
    for name in ("num_threads", "rollout_length", "total_env_steps"):
        if int(config[name]) < 1:
            raise TrainError(f"{name} must be >= 1, got {config[name]}")
    if not 0.0 < config.ppo.gamma <= 1.0:
        raise TrainError(f"ppo.gamma must be in (0, 1], got {config.ppo.gamma}")
    if not 0.0 <= config.ppo.lam <= 1.0:
        raise TrainError(f"ppo.lam must be in [0, 1], got {config.ppo.lam}")
    if config.gamma_w >= 0 and not 0.0 < config.gamma_w <= 1.0:
        raise TrainError(f"gamma_w must be in (0, 1] (or negative for the method default), got {config.gamma_w}")
    if not config.sampling.temperature > 0:
        raise TrainError(f"sampling.temperature must be > 0 for training, got {config.sampling.temperature}")
    rows = config.num_threads * config.rollout_length
    chunks = config.ppo.num_minibatches * config.ppo.accumulation_steps
    if config.ppo.num_minibatches < 1 or config.ppo.accumulation_steps < 1 or rows % chunks:
        raise TrainError(
            f"num_threads x rollout_length ({rows}) must be divisible by ppo.num_minibatches x "
            f"ppo.accumulation_steps ({config.ppo.num_minibatches} x {config.ppo.accumulation_steps})"
        )
    if config.critic.kind not in ("head", "lora"):
        raise TrainError(f"critic.kind must be 'head' or 'lora', got {config.critic.kind!r}")
    if config.prompt_format not in ("chat", "raw"):
        raise TrainError(f"prompt_format must be 'chat' or 'raw', got {config.prompt_format!r}")
    if config.restricted_sampling not in ("trie", "action_scores"):
        raise TrainError(
            f"restricted_sampling must be 'trie' or 'action_scores', got {config.restricted_sampling!r}"
        )
    if config.twosome_normalization not in ("token", "word"):
        raise TrainError(f"twosome_normalization must be 'token' or 'word', got {config.twosome_normalization!r}")
    if config.env.name not in envs_py.registry():
        raise TrainError(
            f"unknown environment {config.env.name!r}; known: {', '.join(envs_py.registry())}"
        )


def learner_config(config: ml_collections.ConfigDict) -> LearnerConfig:
    ppo = config.ppo
    return LearnerConfig(
        gamma=float(ppo.gamma),
        lam=float(ppo.lam),
        clip_eps=float(ppo.clip_eps),
        value_clip_eps=float(ppo.value_clip_eps),
        vf_coef=float(ppo.vf_coef),
        ent_coef=float(ppo.ent_coef),
        max_grad_norm=float(ppo.max_grad_norm),
        target_kl=float(ppo.target_kl),
        epochs=int(ppo.epochs),
        num_minibatches=int(ppo.num_minibatches),
        accumulation_steps=int(ppo.accumulation_steps),
        actor_lr=float(ppo.actor_lr),
        critic_lr=float(ppo.critic_lr),
        adam_eps=float(ppo.adam_eps),
        temperature=float(config.sampling.temperature),
        normalize_advantages=bool(ppo.normalize_advantages),
        critic_kind=str(config.critic.kind),
    )


def rollout_config(config: ml_collections.ConfigDict, eos_ids: tuple[int, ...]) -> RolloutConfig:
    sampling = SamplingConfig(
        temperature=float(config.sampling.temperature),
        top_k=int(config.sampling.top_k),
        top_p=float(config.sampling.top_p),
        max_new_tokens=int(config.sampling.max_new_tokens),
        stop_token_ids=tuple(int(i) for i in eos_ids),
    )
    return RolloutConfig(
        num_threads=int(config.num_threads),
        rollout_length=int(config.rollout_length),
        prompt_format=str(config.prompt_format),
        system_prompt=str(config.system_prompt),
        max_prompt_tokens=int(config.max_prompt_tokens),
        restricted_sampling=str(config.restricted_sampling),
        twosome_normalization=str(config.twosome_normalization),
        sampling=sampling,
    )


def load_model(config: ml_collections.ConfigDict):
    """(model, tokenizer) for `config.model`, with the configured LoRA and dtype."""
    lora = LoraConfig(
        rank=int(config.lora.rank), alpha=float(config.lora.alpha), targets=tuple(config.lora.targets)
    )
    dtype = DTYPES[config.dtype]
    options = dict(matmul_dtype=MATMUL_DTYPES[config.get("matmul_dtype", "float32")], remat=config.get("remat", "full"))
    if config.model == "tiny-random":
        from poad_jax.models.tiny import tiny_random_model

        return tiny_random_model(seed=int(config.seed), lora=lora, dtype=dtype, **options)
    from poad_jax.models import ModelLoadError, load

    try:
        return load(config.model, dtype=dtype, lora=lora, **options)
    except ModelLoadError as error:
        raise TrainError(str(error)) from None


def load_config_file(path: str | pathlib.Path) -> ml_collections.ConfigDict:
    """`get_config()` of a config file given by path (as `--config=` does)."""
    import importlib.util

    path = pathlib.Path(path)
    if not path.is_file():
        raise TrainError(f"no config file at {path}")
    spec = importlib.util.spec_from_file_location(f"poad_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


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


def run(config: ml_collections.ConfigDict, workdir: str | pathlib.Path | None = None, show_progress: bool = True,
        max_updates: int | None = None) -> RunResult:
    """Trains (or resumes) the run described by `config` in `workdir`.

    `max_updates` stops after that many updates in this call (tests use it
    to interrupt a run).
    """
    validate_config(config)
    workdir = pathlib.Path(workdir) if workdir else default_workdir(config)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))

    method = make_method(config.method, float(config.ppo.gamma), None if config.gamma_w < 0 else float(config.gamma_w))
    lconfig = learner_config(config)
    model, tokenizer = load_model(config)
    head = ValueHead(model.config.hidden_size, tuple(config.critic.hidden_sizes), rngs=nnx.Rngs(int(config.seed) + 1))
    graph, frozen, params = split_policy(model, head)
    if config.critic.kind == "lora":
        params["critic_lora"] = _fresh_critic_lora(model, int(config.seed))
    del model, head

    try:
        envs = envs_py.VectorEnv(
            config.env.name, int(config.num_threads), seed=int(config.seed),
            mode=str(config.env.vector_mode), **dict(config.env.kwargs),
        )
    except (TypeError, ValueError, FileNotFoundError) as error:
        raise TrainError(f"cannot build environment {config.env.name!r}: {error}") from None
    rconfig = rollout_config(config, tuple(tokenizer.eos_token_ids))
    sampler = Sampler()
    collector = RolloutCollector(envs, tokenizer, sampler, method, rconfig, seed=int(config.seed))
    update_fn, update_compiles = make_update_fn(graph, method, lconfig)
    state = init_train_state(params, lconfig, jax.random.key(int(config.seed)))
    target_head = jax.tree.map(jnp.copy, state.params["head"])  # a copy: the state is donated

    checkpointer = checkpoint_lib.RunCheckpointer(workdir, int(config.keep_checkpoints))
    logger = run_logging.MetricsLogger(workdir, tensorboard=bool(config.tensorboard))
    records: list[dict[str, Any]] = []
    rollout_rng = jax.random.key(int(config.seed) + 1)
    if checkpointer.latest_step() is not None:
        state, meta = checkpointer.restore(state)
        collector.env_steps = int(meta["env_steps"])
        collector.stats.finished_returns = list(meta["finished_returns"])
        collector.stats.finished_success = list(meta["finished_success"])
        checkpoint_lib.set_numpy_rng_state(collector.np_rng, meta["numpy_rng"])
        rollout_rng = jax.random.wrap_key_data(jnp.asarray(meta["rollout_rng"], jnp.uint32))
        collector.observations = envs.reset(meta["episode_counters"])
        target_head = jax.tree.map(jnp.copy, state.params["head"])  # restarts from the current head
        records = logger.truncate_after(int(meta["update"]))
        if show_progress:
            print(f"resuming {workdir} from update {meta['update']} ({collector.env_steps} env steps)")

    total = int(config.total_env_steps)
    progress = None
    if show_progress:
        from tqdm import tqdm

        progress = tqdm(total=total, initial=min(collector.env_steps, total), unit="step", dynamic_ncols=True,
                        desc=f"{config.method} {config.env.name}")
    updates_this_call = 0
    try:
        while collector.env_steps < total and (max_updates is None or updates_this_call < max_updates):
            before = dict(collector.timings)
            episodes_before = len(collector.stats.finished_returns)
            rollout_rng, collect_rng = jax.random.split(rollout_rng)
            def on_step(count):
                if progress is not None:
                    progress.update(min(count, total - progress.n))

            steps, next_prompts = collector.collect(merged_actor(graph, frozen, state.params), collect_rng, on_step)
            start = time.perf_counter()
            arrays, next_arrays = pack_batch(steps, next_prompts, method, rconfig, tokenizer.pad_token_id)
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
            metrics = jax.device_get(metrics)
            learner_seconds = time.perf_counter() - start
            update = int(state.update_step)
            if config.critic.target_update_every > 0 and update % int(config.critic.target_update_every) == 0:
                target_head = jax.tree.map(jnp.copy, state.params["head"])  # a copy: the state is donated
            record = {
                "update": update,
                "env_steps": collector.env_steps,
                **episode_summary(collector.stats, since=episodes_before),
                **{k: float(v) for k, v in metrics.items()},
                "batch_prompt_len": int(batch.prompt_len),
                "batch_action_len": int(batch.action_len),
                "compiles_learner": update_compiles(),
                "compiles_sampler": int(sampler.compile_count),
                "seconds_sampling": collector.timings["sampling"] - before["sampling"],
                "seconds_env": collector.timings["env"] - before["env"],
                "seconds_behaviour": behaviour_seconds,
                "seconds_learner": learner_seconds,
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
            }
            records.append(record)
            logger.log(record)
            updates_this_call += 1
            if update % int(config.checkpoint_every) == 0 or collector.env_steps >= total:
                checkpointer.save(update, state, {
                    "update": update,
                    "env_steps": collector.env_steps,
                    "episode_counters": envs.episode_counters,
                    "finished_returns": collector.stats.finished_returns,
                    "finished_success": collector.stats.finished_success,
                    "numpy_rng": checkpoint_lib.numpy_rng_state(collector.np_rng),
                    "rollout_rng": np.asarray(jax.random.key_data(rollout_rng)).tolist(),
                })
            if progress is not None:
                progress.set_postfix(
                    ret=f"{record['episode_return_last100']:.3f}", success=f"{record['success_rate_last100']:.2f}",
                    kl=f"{record['approx_kl']:.3g}",
                )
    finally:
        if progress is not None:
            progress.close()
        logger.close()
        checkpointer.close()
        envs.close()
    if config.plot and records:
        run_logging.plot_curves(records, workdir / "curves.png")
    return RunResult(workdir, records, state)


def enable_compilation_cache() -> None:
    """Persists XLA compilations across runs (a resumed or repeated run skips
    most compile time).  `$JAX_COMPILATION_CACHE_DIR` wins; the default is
    `~/.cache/poad_jax/jax`."""
    import os

    if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        cache = pathlib.Path(os.environ.get("POAD_CACHE", pathlib.Path.home() / ".cache" / "poad_jax")) / "jax"
        jax.config.update("jax_compilation_cache_dir", str(cache))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def main(argv) -> None:
    from absl import flags
    from absl import logging as absl_logging

    del argv
    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax logs every save at INFO
    enable_compilation_cache()
    config = flags.FLAGS.config
    workdir = flags.FLAGS.workdir or None
    try:
        result = run(config, workdir)
    except (TrainError, UnknownMethodError, envs_py.UnknownEnvError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    print()
    print(run_logging.summary_table(result.records))
    print(f"\nrun directory: {result.workdir}")


def cli() -> None:
    from absl import app, flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, "Path to a config file, e.g. configs/datasci.py.", lock_config=True)
    flags.DEFINE_string("workdir", "", "Run directory (default runs/<config>-<method>-<timestamp>); re-use to resume.")
    flags.mark_flags_as_required(["config"])
    app.run(main)


if __name__ == "__main__":
    cli()
