"""Resuming a run: what a checkpoint records besides the train state, and bringing
the rollouts back to it.

A checkpoint's meta record holds the update and env steps, every thread's
episode counter and the episode in progress (its actions, to replay it), the
episode history, the NumPy generator, the rollout key and the metric
history.  Several processes each record their own part (`hosts`); a run
resumed with another number of processes restarts the episodes in progress.
"""

from __future__ import annotations

import pathlib
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import envs_py
from poad_jax.agent.learner import TrainState
from poad_jax.agent.episodes import EpisodeStats, merge_episode_states
from poad_jax.agent.rollout import RolloutCollector
from poad_jax.parallel import hosts
from poad_jax.run import checkpoint as checkpoint_lib
from poad_jax.run import metrics as run_logging
from poad_jax.run.build import Placement


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
    observation they led to, the return so far and the env's own record of the episode where it keeps
    one (`VectorEnv.episode_states`: DataSciCoding's improvement episodes), so that a resumed run
    continues each episode where the checkpoint left it (`restore_episodes`) rather than restarting it."""
    return {"actions": envs.episode_actions, "states": envs.episode_states,
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
    """Resets the envs to their checkpointed episodes and restores each episode in progress (its env's
    saved state, or else a replay of its actions; checked against the observation's digest); restores
    the running returns.  Checkpoints written
    before episodes were kept, or under another process layout, restart every episode.  Returns the
    threads (this process's) whose episode restarted although one was in progress."""
    saved = meta.get("in_progress")
    if saved is None or not same_layout:
        collector.observations = envs.reset(counters)
        return []
    mine = slice(first_thread, first_thread + envs.num_envs)
    actions, digests, returns = saved["actions"][mine], saved["digests"][mine], saved["returns"][mine]
    states = saved["states"][mine] if "states" in saved else None  # older checkpoints: replayed
    collector.observations, restarted = envs.resume(counters, actions, digests, states)
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


def restore(checkpointer: checkpoint_lib.RunCheckpointer, state: TrainState, collector: RolloutCollector, envs,
            logger: run_logging.MetricsLogger, placement: Placement, rollout_rng: jax.Array,
            workdir: pathlib.Path, say=print) -> tuple[TrainState, jax.Array, list[dict[str, Any]]]:
    """(train state, rollout key, metric records) to go on from: the newest intact checkpoint's,
    with the collector, the envs and the log brought to it; or, without a checkpoint, the ones
    given and an empty log (updates logged by a killed start are redone).  `say` prints the
    resume line (None: silent)."""
    restored = checkpointer.restore_newest_intact(state, warn=lambda line: print(line, file=sys.stderr))
    if restored is None:
        logger.replace([])
        return state, rollout_rng, []
    state, meta, _ = restored
    collector.env_steps = int(meta["env_steps"])
    counters, episodes, numpy_rng = host_meta(meta, placement.index, placement.count, placement.first_thread,
                                             envs.num_envs)
    collector.stats.load_state_dict(episodes)
    if numpy_rng is not None:
        checkpoint_lib.set_numpy_rng_state(collector.np_rng, numpy_rng)
    rollout_rng = jax.random.wrap_key_data(jnp.asarray(meta["rollout_rng"], jnp.uint32))
    restarted = restore_episodes(meta, collector, envs, counters, placement.first_thread,
                                 same_process_layout(meta, placement.count))
    if restarted:
        print(f"warning: {len(restarted)} episode(s) in progress at the checkpoint did not replay to the "
              f"same observation (threads {[placement.first_thread + b for b in restarted]}); they restart",
              file=sys.stderr)
    if meta.get("metrics") is not None:  # the log agrees with the checkpoint, even if deleted
        records = list(meta["metrics"])
        logger.replace(records)
    else:  # checkpoints written before the history was kept in them
        records = logger.truncate_after(int(meta["update"]))
    if say is not None:
        say(f"resuming {workdir} from update {meta['update']} ({collector.env_steps} env steps)")
    return state, rollout_rng, records
