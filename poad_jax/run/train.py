"""The training run: `run(config, workdir)` checks the config, types it once (`typed`: the
`Run` every function below takes) and builds everything, then `training_loop` repeats
`one_update` (rollout -> batch -> one compiled PPO update -> target critic -> log ->
checkpoint -> watchdogs) from the last checkpoint to `total_env_steps`.

`python -m poad_jax.train --config=configs/<task>.py [--workdir=W] [--config.x=y ...]`
(`poad_jax.run.cli`) calls `run`.  Re-running the same command with the same
`--workdir` resumes from the latest checkpoint (`poad_jax.run.resume`);
the directory's `config.json` says what its checkpoints mean
(`poad_jax.run.rundir`).

Writes to the workdir: `config.json`, `metrics.jsonl`, `tensorboard/`,
`curves.png`, `checkpoints/`; DataSciCoding runs also `best_program.py` and
`best_program.json` (`run/best_program.py`); when the run has reached
`total_env_steps`, `finished.json` (a marker a study runner can test).
Nothing is written to the run directory before the configuration, the
directory, the model and the environment have been checked.

Several processes (one per host, `config.distributed`; docs/distributed.md,
"Several hosts"): every process runs this same loop and issues the same compiled
calls; each steps its share of the threads (`build.Placement`), the batch is
assembled from every process's rows, and process 0 alone writes the files
above (Orbax checkpoints are saved and restored by all).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import shutil
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections

import envs_py
from poad_jax.agent.experience import PrefixPlans, behaviour_statistics, groups_with_signal, make_token_batch
from poad_jax.agent.methods import Method
from poad_jax.agent.episodes import EpisodeStats, episode_summary, program_summary, step_summary
from poad_jax.agent.learner import TrainState
from poad_jax.agent.rollout import RolloutCollector, StepRecord, actions_cut_off
from poad_jax.core import flops as flops_lib
from poad_jax.core.token_batch import TokenBatch
from poad_jax.parallel import hosts
from poad_jax.run import best_program as best_lib
from poad_jax.run import checkpoint as checkpoint_lib
from poad_jax.run import hardware
from poad_jax.run import memory as memory_lib
from poad_jax.run import metrics as run_logging
from poad_jax.run import rundir
from poad_jax.run.action_log import ActionLog
from poad_jax.run.build import Built, Placement, build, placement_of
from poad_jax.run.config import Run, TrainError, config_warnings, one_line, typed, validate
from poad_jax.run.progress import NoProgress, RunProgress
from poad_jax.run.resume import checkpoint_meta, restore, run_stats
from poad_jax.sampling import Sampler



class NonFiniteUpdatesError(RuntimeError):
    """The run stopped: `max_nonfinite_updates` updates in a row had minibatch steps whose loss or
    gradient was not finite (each skipped, so the parameters and checkpoints stayed finite)."""


@dataclasses.dataclass
class RunResult:
    workdir: pathlib.Path
    records: list[dict[str, Any]]
    state: Any
    episodes: dict[str, Any] = dataclasses.field(default_factory=dict)  # EpisodeStats.state_dict()
    best: best_lib.BestProgram | None = None
    finished: bool = False
    settings: Run | None = None  # the typed settings the run trained with (its summary reads them)


def run(config: ml_collections.ConfigDict, workdir: str | pathlib.Path | None = None, show_progress: bool = True,
        max_updates: int | None = None) -> RunResult:
    """Trains (or resumes) the run described by `config` in `workdir`.

    The config is checked, its "auto" settings resolved and then typed once (`typed`): everything
    below takes the typed `Run`.  `max_updates` stops after that many updates in this call (tests use
    it to interrupt a run).  Raises TrainError for user mistakes, before anything is written to
    `workdir`.
    """
    validate(config)
    # The processes join before anything touches JAX, so before the "auto" settings resolve (that asks
    # JAX for its backend) and the run is typed: this reads the config's own `distributed` section.
    join_processes(config.distributed)
    workdir = pathlib.Path(workdir) if workdir else rundir.default_workdir(config)
    config = config.copy_and_resolve_references()  # "auto" settings resolve in the run's copy
    chosen = hardware.resolve_config(config, rundir.read_stored_config(workdir) if workdir.is_dir() else None)
    settings = typed(config)  # the run's one typing of its config
    placement = placement_of(settings)  # the devices fit the mesh, checked before anything is written
    # The ConfigDict stays here for what compares or stores the config as it was given: the run
    # directory's config.json and its resume check, and the warnings.
    changes = rundir.prepare_workdir(workdir, config)
    if chosen and show_progress and placement.primary:
        print(chosen, flush=True)
    if placement.primary:
        for warning in config_warnings(config):  # valid settings that make the run learn nothing
            print(warning, file=sys.stderr, flush=True)
    if placement.primary:
        say_expected_memory(settings, show_progress)
    if show_progress and placement.primary:  # a real model's first load converts its GGUF: seconds to a minute
        print(f"loading model {settings.model}", flush=True)
    built = build(settings, placement)
    envs = build_envs(settings, placement.threads, built.seeds.envs)
    created = not workdir.exists()
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        if placement.primary and not checkpoint_lib.checkpoint_steps(workdir):
            stored = rundir.read_stored_config(workdir)
            if stored is not None and rundir.config_differences(stored, rundir.config_as_json(config))[0]:
                rundir.clear_stale_outputs(workdir)
        if placement.primary:
            rundir.write_config(workdir, config, changes)
        return training_loop(settings, workdir, built, envs, show_progress and placement.primary, max_updates)
    except BaseException:
        # A start that failed (or was interrupted) before anything worth keeping leaves no directory.
        if placement.primary and created and not checkpoint_lib.checkpoint_steps(workdir) \
                and not (workdir / best_lib.RECORD_FILE).exists():
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    finally:
        envs.close()


def say_expected_memory(settings: Run, show_progress: bool = True) -> None:
    """The run's expected peak memory in one line (`run.memory`), and a one-line warning on stderr when the
    machine's available memory is below it (the kernel's OOM killer would end the run without a word)."""
    expected = memory_lib.expected_peak(settings)
    if show_progress:
        print(memory_lib.expected_line(expected), flush=True)
    warning = memory_lib.memory_warning(expected, memory_lib.available_bytes())
    if warning:
        print(warning, file=sys.stderr, flush=True)


def describe_placement(settings: Run, placement: Placement) -> None:
    """Prints the devices a run uses when they are more than one (and that packing is off there)."""
    if placement.describe():
        print(placement.describe())
        if settings.prefix_packing:
            print("prefix_packing is off on a mesh: each device runs its rows as they are")


def learn_from_rollout(settings: Run, built: Built, update_fn, state: TrainState, value_head, steps, next_prompts):
    """One rollout's learning: its padded arrays, the behaviour pass (old log-probs and values under the
    current actor and `value_head`), the TokenBatch and one compiled PPO update.  Returns the new state, the
    update's metrics on the host, the batch, the prefix plans and the seconds of the behaviour pass and the
    learner, and the batch's group signal (`group_signal_record`) (`state` is donated to the update)."""
    method, placement = built.method, built.placement
    start = time.perf_counter()
    arrays, next_arrays = placement.batch_arrays(steps, next_prompts, method, built.rollout,
                                                 built.tokenizer.pad_token_id)
    signal = group_signal_record(method, arrays, len(steps))
    plans = placement.prefix_plans(arrays, next_arrays, method, settings)
    stats = behaviour_statistics(built.graph, built.frozen, state.params, value_head, arrays, next_arrays,
                                 method=method, temperature=built.learner.temperature,
                                 critic_kind=built.learner.critic_kind, plans=plans,
                                 reference_logprobs=built.learner.ref_kl_coef > 0)
    batch = make_token_batch(arrays, stats, prefix_plan=plans.learner if plans else None)
    jax.block_until_ready(batch)
    behaviour_seconds, start = time.perf_counter() - start, time.perf_counter()
    state, metrics = update_fn(state, built.frozen, batch)
    metrics = jax.device_get(hosts.local_copy(metrics))
    seconds = {"behaviour": behaviour_seconds, "learner": time.perf_counter() - start}
    return state, metrics, batch, plans, seconds, signal


def learn_or_count(settings: Run, built: Built, learner, state: TrainState, value_head,
                   steps, next_prompts, sampler_since) -> tuple[TrainState, dict[str, Any], dict[str, float]]:
    """One update (`learn_from_rollout`) with its record's fields (the learner's metrics, the batch's
    and the cost's: `batch_record`) and seconds; with `learn=False` the update is only counted (the
    policy stays as it started; no behaviour pass, no learner) and its fields are the sampler's
    (`sampling_record`).  `learner` is (update_fn, its compile counter), `sampler_since` (the sampler,
    its FLOP count before this update's rollout)."""
    (update_fn, update_compiles), (sampler, sampler_flops) = learner, sampler_since
    if not settings.learn:
        state = dataclasses.replace(state, update_step=state.update_step + 1)
        return state, sampling_record(steps, built.rollout, sampler, sampler_flops), {}
    state, metrics, batch, plans, seconds, signal = learn_from_rollout(settings, built, update_fn, state, value_head,
                                                                       steps, next_prompts)
    fields = {**{k: float(v) for k, v in metrics.items()}, **signal,
              **batch_record(settings, built.method, steps, built.rollout, batch, sampler, sampler_flops,
                             update_compiles(), plans, rowwise_output=built.graph.constrain is None)}
    return state, fields, seconds


# ---------------------------------------------------------------------------
# The training loop: `one_update` repeated (PureJaxRL's shape).


@dataclasses.dataclass(frozen=True)
class Loop:
    """What every update of a run uses and none changes: the settings and built parts, the compiled
    update, the sampler and the collector, the run's writers, and (once resumed) the progress line and
    the update the run ends at."""

    settings: Run
    built: Built
    workdir: pathlib.Path
    envs: envs_py.VectorEnv
    learner: tuple[Callable, Callable[[], int]]  # (update_fn, its compile counter)
    sampler: Sampler
    collector: RolloutCollector
    checkpointer: checkpoint_lib.RunCheckpointer
    logger: run_logging.MetricsLogger
    keeper: Any  # best_lib.BestProgramKeeper, or _NoBestProgram outside process 0
    action_log: ActionLog
    progress: Any = dataclasses.field(default_factory=NoProgress)  # RunProgress when shown
    last_update: int = 0


@dataclasses.dataclass(frozen=True)
class LoopState:
    """What one update hands the next: the train state, the rollouts' key, the run's records (a list
    the updates append to), the target critic's head, the run's episodes, the last update's KL and the
    watchdogs."""

    state: TrainState
    rollout_rng: jax.Array
    records: list[dict[str, Any]]
    target_head: Any
    episodes: EpisodeStats
    last_kl: float | None
    watchdogs: Watchdogs


def training_loop(settings: Run, workdir: pathlib.Path, built: Built, envs: envs_py.VectorEnv,
                  show_progress: bool = True, max_updates: int | None = None) -> RunResult:
    """The outer loop, from the last checkpoint (if any) to `total_env_steps`: `one_update` repeated,
    each collecting a rollout with the current actor, running one compiled PPO update on it, logging
    the record and saving a checkpoint."""
    loop, state = start_loop(settings, workdir, built, envs, show_progress)
    updates_this_call = 0
    try:
        loop, carry = resumed(loop, state, show_progress)
        while loop.collector.env_steps < settings.total_env_steps and \
                (max_updates is None or updates_this_call < max_updates):
            carry = one_update(loop, carry)
            updates_this_call += 1
    finally:
        loop.progress.close()
        loop.logger.close()
        loop.checkpointer.close()
    episodes = carry.episodes.state_dict()
    records = carry.records
    if settings.plot and records and built.placement.primary:
        run_logging.plot_curves(records, workdir / "curves.png", episodes)
    finished = bool(records) and records[-1]["env_steps"] >= settings.total_env_steps
    return RunResult(workdir, records, carry.state, episodes, loop.keeper.best, finished, settings)


def start_loop(settings: Run, workdir: pathlib.Path, built: Built, envs: envs_py.VectorEnv,
               show_progress: bool) -> tuple[Loop, TrainState]:
    """The run's `Loop` (the compiled update, the sampler, the collector on this process's threads, the
    writers) and the initial train state."""
    placement, method, rconfig, seeds = built.placement, built.method, built.rollout, built.seeds
    if show_progress:
        describe_placement(settings, placement)
    update_fn, update_compiles, state = placement.learner(built.graph, method, built.learner, built.params,
                                                          seeds.learner)
    sampler = placement.sampler(built.graph, built.frozen, built.params, rconfig.prompt_buckets)
    collector = RolloutCollector(envs, built.tokenizer, sampler, method, rconfig, seed=seeds.numpy)
    warning = vocabulary_warning(built.tokenizer, collector.observations)
    if warning and placement.primary:
        print(warning, file=sys.stderr, flush=True)
    placement.own_threads(collector, settings.rollout.num_threads, settings.seed)
    checkpointer = checkpoint_lib.RunCheckpointer(workdir, settings.keep_checkpoints)
    logger = run_logging.MetricsLogger(workdir, tensorboard=settings.tensorboard and placement.primary,
                                       write=placement.primary)
    keeper = best_lib.BestProgramKeeper(workdir, settings.env.name, settings.env.kwargs) if placement.primary \
        else _NoBestProgram()
    action_log = ActionLog(workdir, enabled=settings.log_actions, primary=placement.primary)
    loop = Loop(settings, built, workdir, envs, (update_fn, update_compiles), sampler, collector, checkpointer,
                logger, keeper, action_log)
    return loop, state


def resumed(loop: Loop, state: TrainState, show_progress: bool) -> tuple[Loop, LoopState]:
    """The loop and the first update's `LoopState` from the newest checkpoint (`resume.restore`; the
    initial `state` without one): the action log cut to it, a fresh target critic, the finished marker
    removed while steps remain, the progress line and the watchdogs' streaks as the records left them."""
    settings, collector, placement, workdir = loop.settings, loop.collector, loop.built.placement, loop.workdir
    total = settings.total_env_steps
    state, rollout_rng, records = restore(loop.checkpointer, state, collector, loop.envs, loop.logger, placement,
                                          loop.built.seeds.rollout, workdir, say=print if show_progress else None)
    loop.action_log.truncate_after(int(state.update_step))  # a killed run's update in flight is run again
    target_head = jax.tree.map(jnp.copy, state.params["head"])  # a copy: the state is donated
    if collector.env_steps < total and placement.primary:
        (workdir / rundir.FINISHED_FILE).unlink(missing_ok=True)
    episodes = run_stats(collector.stats)  # the whole run's episodes (all processes')
    progress = RunProgress(total, collector.env_steps, f"{settings.method} {settings.env.name}") if show_progress \
        else NoProgress()
    last_update = final_update(settings, int(state.update_step), collector.env_steps, total)
    loop = dataclasses.replace(loop, progress=progress, last_update=last_update)
    watchdogs = Watchdogs.resumed(settings, records)
    return loop, LoopState(state, rollout_rng, records, target_head, episodes, None, watchdogs)


def one_update(loop: Loop, carry: LoopState) -> LoopState:
    """One update: a rollout with the current actor, its learning (`learn_or_count`, against the target
    critic when there is one), the target critic's copy, the record logged, a checkpoint, the progress
    line and the watchdogs (which may stop the run)."""
    settings, collector, sampler, progress = loop.settings, loop.collector, loop.sampler, loop.progress
    before, sampler_flops = dict(collector.timings), sampler.matmul_flops
    episodes_before, counters_before = len(carry.episodes.finished_returns), carry.episodes.counters()
    tallies_before = carry.episodes.program_tallies()  # DataSciCoding: estimators and failure stages
    rollout_rng, steps, next_prompts = collect_rollout(loop, carry)
    episodes = run_stats(collector.stats)
    progress.phase(f"update {int(carry.state.update_step) + 1}/{loop.last_update}: learning")
    critic = settings.critic.target_update_every
    value_head = carry.target_head if critic > 0 else carry.state.params["head"]
    state, learned, learn_seconds = learn_or_count(settings, loop.built, loop.learner, carry.state, value_head,
                                                   steps, next_prompts, (sampler, sampler_flops))
    seconds = {"sampling": collector.timings["sampling"] - before["sampling"],
               "env": collector.timings["env"] - before["env"], **learn_seconds}
    update = int(state.update_step)
    target_head = carry.target_head
    if critic > 0 and update % critic == 0:
        target_head = jax.tree.map(jnp.copy, state.params["head"])  # a copy: the state is donated
    record = {"update": update, "env_steps": collector.env_steps,
              **episode_summary(episodes, since=episodes_before),
              **step_summary(episodes, counters_before), **program_summary(episodes, tallies_before),
              **learned,
              **{f"seconds_{phase}": value for phase, value in seconds.items()},
              "peak_rss_mb": memory_lib.peak_rss_mb()}
    loop.logger.log(record)
    carry.records.append(record)
    save_update(loop, state, rollout_rng, carry.records)
    last_kl = record.get("approx_kl")
    progress.show(run_logging.progress_postfix(episodes.state_dict(), last_kl,
                                               nonfinite_steps=run_logging.count_nonfinite_steps(carry.records)))
    say = progress.note if loop.built.placement.primary else _say_nothing
    watchdogs = carry.watchdogs.after(record, steps, say)
    return LoopState(state, rollout_rng, carry.records, target_head, episodes, last_kl, watchdogs)


def collect_rollout(loop: Loop, carry: LoopState) -> tuple[jax.Array, list[list[StepRecord]], list[list[int]]]:
    """(the next rollout key, the steps, the next prompts) of one rollout with the current actor, each
    step's results offered to the best-program keeper and the action log."""
    progress, sampler = loop.progress, loop.sampler
    update_in_flight = int(carry.state.update_step) + 1
    progress.phase(f"update {update_in_flight}/{loop.last_update}: rollout")
    rollout_rng, collect_rng = jax.random.split(carry.rollout_rng)

    def on_step(new_steps):
        progress.advance(new_steps, run_logging.progress_postfix(
            carry.episodes.state_dict(), carry.last_kl,
            nonfinite_steps=run_logging.count_nonfinite_steps(carry.records)))

    def on_results(results, first_env_step, actions):
        loop.keeper.offer(results, first_env_step, update_in_flight)
        loop.action_log.append(update_in_flight, first_env_step, actions, results)

    sampler.set_lora(hosts.local_copy(carry.state.params["actor"]))
    steps, next_prompts = loop.collector.collect(loop.built.placement.rollout_key(collect_rng), on_step, on_results)
    sampler.release_copies()  # learning runs without the sampler's per-layer copies of the base
    return rollout_rng, steps, next_prompts


def save_update(loop: Loop, state: TrainState, rollout_rng: jax.Array, records: list[dict[str, Any]]) -> None:
    """The update's checkpoint (every `checkpoint_every` updates and the last) and, when the run has
    reached `total_env_steps`, the finished marker."""
    collector, total, update = loop.collector, loop.settings.total_env_steps, records[-1]["update"]
    if update % loop.settings.checkpoint_every == 0 or collector.env_steps >= total:
        loop.progress.phase(f"update {update}/{loop.last_update}: saving")
        loop.checkpointer.save(update, state, checkpoint_meta(update, collector, loop.envs, rollout_rng, records))
    if collector.env_steps >= total and loop.built.placement.primary:
        rundir.write_finished_marker(loop.workdir, records[-1], total)


def _say_nothing(line: str) -> None:
    del line


@dataclasses.dataclass(frozen=True)
class Watchdogs:
    """The two streaks a run watches over its updates: updates in a row with minibatch steps skipped as
    non-finite (the run stops at `max_nonfinite_updates`) and a group method's updates in a row without
    an episode group of differing returns (a warning at `SILENT_GROUP_UPDATES`)."""

    settings: Run
    nonfinite: int = 0
    silent: int = 0

    @classmethod
    def resumed(cls, settings: Run, records: list[dict[str, Any]]) -> Watchdogs:
        """The streaks as a resumed run's `records` left them."""
        return cls(settings, trailing_nonfinite_updates(records), trailing_silent_updates(records))

    def after(self, record: dict[str, Any], steps: list[list[StepRecord]], say) -> Watchdogs:
        """The streaks with the update of `record` (and of the rollout `steps`): `say` gets the silent
        groups' warning the update the streak reaches `SILENT_GROUP_UPDATES`; NonFiniteUpdatesError
        (`nonfinite_stop_message`) once `max_nonfinite_updates` updates in a row had non-finite steps."""
        silent = self.silent + 1 if record.get("groups_with_signal") == 0 else 0
        if silent == SILENT_GROUP_UPDATES:
            say(silent_groups_warning(self.settings, silent, record))
        nonfinite = self.nonfinite + 1 if record.get("nonfinite_steps") else 0
        if nonfinite >= self.settings.max_nonfinite_updates:
            raise NonFiniteUpdatesError(nonfinite_stop_message(self.settings, record, nonfinite, steps))
        return Watchdogs(self.settings, nonfinite, silent)


def trailing_nonfinite_updates(records: list[dict[str, Any]]) -> int:
    """How many of the last `records` in a row had a minibatch step skipped as non-finite (a resumed
    run goes on counting where the checkpoint left it)."""
    count = 0
    for record in reversed(records):
        if not record.get("nonfinite_steps"):
            break
        count += 1
    return count


def nonfinite_stop_message(settings: Run, record: dict[str, Any], streak: int,
                           steps: list[list[StepRecord]]) -> str:
    """Why the run stops after `streak` updates with non-finite steps, and the three likely causes
    with this run's values (the rollout's largest |reward|, the rates, the matmul precision)."""
    largest = max((abs(r.reward) for records in steps for r in records), default=0.0)
    minibatch_steps = settings.ppo.epochs * settings.ppo.num_minibatches
    return (f"{streak} updates in a row had minibatch steps with a non-finite loss or gradient "
            f"({int(record['nonfinite_steps'])} of {minibatch_steps} skipped in update {record['update']}), "
            f"so the run stopped; likely causes: the reward scale (|reward| up to {largest:.3g} in its rollout), "
            f"the learning rate (ppo.actor_lr={settings.ppo.actor_lr:g}, "
            f"ppo.critic_lr={settings.ppo.critic_lr:g}) or the precision (matmul_dtype={settings.matmul_dtype})")


def join_processes(distributed) -> None:
    """Joins a multi-process run (the run's `distributed` settings: `coordinator`, `num_processes`,
    `process_id`; nothing for one process); TrainError (one line) when it cannot."""
    try:
        hosts.initialize(distributed)
    except Exception as error:  # unreachable coordinator, JAX already started, no cluster detected, ...
        raise TrainError(f"cannot join the run's processes (distributed.coordinator {distributed.coordinator!r}): "
                         f"{one_line(error)}") from None


def build_envs(settings: Run, num_envs: int | None = None, seed: int | None = None) -> envs_py.VectorEnv:
    """The run's vector env (default: all `num_threads` threads, seeded by
    `settings.seed`; a process of a multi-process run builds its share);
    TrainError (one line) for anything the user can fix (kwargs, data files)."""
    try:
        return envs_py.VectorEnv(
            settings.env.name, settings.rollout.num_threads if num_envs is None else num_envs,
            seed=settings.seed if seed is None else seed,
            mode=settings.env.vector_mode, group_size=max(settings.rollout.group_size, 1), **settings.env.kwargs,
        )
    except Exception as error:  # construction runs user-chosen kwargs and data files: say what failed
        raise TrainError(f"cannot build environment {settings.env.name!r}: {one_line(error)}") from None


def vocabulary_warning(tokenizer, observations: list[envs_py.Observation]) -> str | None:
    """One line when a tokenizer with a closed vocabulary (`tiny-random`'s word tokenizer) lacks words of
    the actions the environment first offers: each becomes `<unk>`, and actions that differ only in
    such words look the same to the model (the agent cannot tell them apart).  None otherwise (a real
    tokenizer covers any text; a prompt word it lacks costs less, and the toy's own prompts have some)."""
    if not hasattr(tokenizer, "unknown_words"):
        return None
    actions = list(dict.fromkeys(a for o in observations for a in (o.actions or ())))  # free-form: none
    unknown = list(dict.fromkeys(w for action in actions for w in tokenizer.unknown_words(action)))
    if not unknown:
        return None
    same = []  # actions offered together that encode alike
    for observation in observations:
        if not observation.actions:
            continue
        encoded = [tuple(tokenizer.encode(a)) for a in observation.actions]
        same += [a for a, e in zip(observation.actions, encoded) if encoded.count(e) > 1 and a not in same]
    shown = ", ".join(repr(w) for w in unknown[:6]) + (", ..." if len(unknown) > 6 else "")
    what = (f"actions {', '.join(repr(a) for a in same[:4])} look the same to the model" if same
            else "the model reads them all as one word")
    return (f"warning: the tiny-random model's {tokenizer.vocab_size}-token vocabulary lacks {len(unknown)} word(s) "
            f"of this environment's actions ({shown}): each becomes <unk>, so {what}; use a real model "
            f"(--config.model=smollm2-135m-instruct) or the words in poad_jax/models/tiny.py")


class _NoBestProgram:
    """The best-program keeper of a process other than 0: writes nothing."""

    best = None

    def offer(self, results, first_env_step: int, update: int) -> bool:
        del results, first_env_step, update
        return False


def final_update(settings: Run, update: int, env_steps: int, total: int) -> int:
    """The update the run ends at: `update` plus the updates (of num_threads x rollout_length
    env steps, all processes') that `total - env_steps` needs, rounded up."""
    per_update = settings.rollout.num_threads * settings.rollout.rollout_length
    return update + max(0, -(-(total - env_steps) // per_update))


def batch_record(settings: Run, method: Method, steps: list[list[StepRecord]], rconfig,
                 batch: TokenBatch, sampler: Sampler, sampler_flops_before: int,
                 learner_compiles: int, plans: PrefixPlans | None = None,
                 rowwise_output: bool = False) -> dict[str, int]:
    """An update's batch fields: the actions the token limit cut off (all processes'), the batch's
    prompt and action lengths (and, packed with the common prompt prefix once, the prefix's and the
    learner's packed length), and its cost (`update_cost_record`)."""
    packed = {} if plans is None or plans.learner is None else {
        "batch_prefix_len": plans.learner.prefix_len, "batch_packed_len": plans.learner.packed_len}
    return {**sampling_record(steps, rconfig, sampler, sampler_flops_before),
            "batch_prompt_len": int(batch.prompt_len), "batch_action_len": int(batch.action_len), **packed,
            **update_cost_record(settings, method, batch, sampler, learner_compiles, plans, rowwise_output)}


def group_signal_record(method: Method, arrays: dict, rollout_length: int) -> dict[str, int]:
    """A group method's update fields from its packed batch `arrays` ({} for the other methods; one process,
    as `config.checks` requires): `groups`, its episode groups, and `groups_with_signal`, those whose
    advantages are not all 0 (`experience.groups_with_signal`)."""
    if method.group is None:
        return {}
    with_signal, groups = groups_with_signal(arrays["advantages"], method.group.size, rollout_length)
    return {"groups_with_signal": with_signal, "groups": groups}


SILENT_GROUP_UPDATES = 10  # updates in a row without a group of differing returns before the run says so


def trailing_silent_updates(records: list[dict[str, Any]]) -> int:
    """How many of the last `records` in a row were a group method's updates whose every advantage was 0
    (`groups_with_signal` 0; a resumed run goes on counting where the checkpoint left it)."""
    count = 0
    for record in reversed(records):
        if record.get("groups_with_signal") != 0:
            break
        count += 1
    return count


def silent_groups_warning(settings: Run, streak: int, record: dict[str, Any]) -> str:
    """One line: a group method's last `streak` updates had no episode group whose returns differ, so the
    policy loss had no gradient; what moved the policy instead, and what finds a reward sooner."""
    moved_by = [name for name, value in (("the entropy bonus", settings.ppo.ent_coef),
                                         ("the KL penalty", settings.ppo.ref_kl_coef)) if value > 0]
    returns = record.get("episode_return")
    mean_return = f"; mean episode return {returns:.3f}" if isinstance(returns, float) and math.isfinite(returns) \
        else ""
    return (f"warning: {settings.method}: in the last {streak} updates no episode group had trajectories whose "
            f"returns differ ({record['groups']} group(s) in update {record['update']}{mean_return}), so every "
            f"advantage is 0, the policy loss has no gradient and only {' and '.join(moved_by) or 'nothing'} "
            f"moves the policy. If no trajectory reaches a reward, {reward_remedies(settings)} can find one sooner")


def reward_remedies(settings: Run) -> str:
    """What lets a group method meet a reward sooner, with this run's episode length."""
    return (f"longer episodes (--config.rollout_length, {settings.rollout.rollout_length} now), more trajectories "
            "per group (--config.num_threads, --config.group.size) or a method with a critic (--config.method=poad)")


def sampling_record(steps: list[list[StepRecord]], rconfig, sampler: Sampler,
                    sampler_flops_before: int) -> dict[str, int]:
    """An update's rollout fields (all of them when the run does not learn, `learn=False`): the actions
    the token limit cut off (all processes'), the sampler's compilations so far and the matmul FLOPs of
    its calls since `sampler_flops_before` (this process's)."""
    return {"actions_cut_off": sum(hosts.allgather_json(actions_cut_off(steps, rconfig))),
            "compiles_sampler": int(sampler.compile_count),
            "flops_sampler": int(sampler.matmul_flops - sampler_flops_before)}


def update_cost_record(settings: Run, method: Method, batch: TokenBatch, sampler: Sampler,
                       learner_compiles: int, plans: PrefixPlans | None = None,
                       rowwise_output: bool = False) -> dict[str, int]:
    """An update's learning cost fields: the learner's compilations so far and the matmul FLOPs
    (`poad_jax.core.flops`) of its behaviour pass and its learner update (the whole batch's), over
    the packed rows where `plans` packed them (the sampler's are `sampling_record`'s)."""
    plans = PrefixPlans(None, None, None) if plans is None else plans

    def passes_over(plan):
        if plan is None:
            return method.scheme.passes(batch.tokens.shape, batch.action_len)
        return method.scheme.passes(batch.tokens.shape, batch.action_len, plan)  # token level only

    passes, behaviour_passes = passes_over(plans.learner), passes_over(plans.rows)
    bootstrap = None if plans.next_rows is None else flops_lib.Pass(1, plans.next_rows.packed_len)
    counted = flops_lib.update_flops(
        sampler.model_config, passes, head_sizes=settings.critic.hidden_sizes, next_rows=batch.num_threads,
        prompt_len=batch.prompt_len, critic_kind=settings.critic.kind if method.uses_critic else "none",
        remat=settings.remat, epochs=settings.ppo.epochs,
        sampler_logprobs=settings.rollout.behaviour_logprobs == "sampler", behaviour_passes=behaviour_passes,
        bootstrap=bootstrap, reference_logprobs=settings.ppo.ref_kl_coef > 0, rowwise_output=rowwise_output)
    return {"compiles_learner": int(learner_compiles),
            "flops_behaviour": counted["behaviour"], "flops_learner": counted["learner"]}
