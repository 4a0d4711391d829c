"""`VectorEnv`: N copies of one environment, stepped together, their outputs checked.

The copies live in this process (stepped one after another or in a thread
pool) or each in a spawned worker process (`_ProcessWorker`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
from typing import Any, Callable, Sequence

from envs_py.checks import EnvCallError, EnvError, check_observation, check_step_result
from envs_py.interface import Observation, StepResult, TextEnv, observation_digest
from envs_py.registry import make


def _episode_seed(base_seed: int | None, env_index: int, episode: int, num_envs: int) -> int | None:
    """Seed of episode `episode` of env `env_index`: distinct for every pair."""
    if base_seed is None:
        return None
    return base_seed + env_index + episode * num_envs


def env_episode_state(env: TextEnv) -> dict[str, Any] | None:
    """The env's episode in progress as JSON-able values (`env.episode_state()`), or None for an env
    without that method (or one that returns None): such an episode is resumed by replaying its
    actions.  An env that keeps its episode's state (DataSciCoding's improvement episodes) also has
    `restore_episode(state) -> Observation`, which puts it back exactly."""
    method = getattr(env, "episode_state", None)
    return None if method is None else method()


class _InlineWorker:
    """Holds one env in this process."""

    def __init__(self, factory: Callable[[], TextEnv]):
        self.env = factory()

    def reset(self, seed):
        return self.env.reset(seed=seed)

    def step(self, action):
        return self.env.step(action)

    def episode_state(self):
        return env_episode_state(self.env)

    def restore_episode(self, state):
        return self.env.restore_episode(state)

    def close(self):
        close = getattr(self.env, "close", None)
        if close is not None:
            close()


def _process_worker_main(conn, name, kwargs):
    env = make(name, **kwargs)
    while True:
        command, arg = conn.recv()
        if command == "close":
            close = getattr(env, "close", None)
            if close is not None:
                close()
            conn.close()
            return
        try:
            if command == "reset":
                result = env.reset(seed=arg)
            elif command == "episode_state":
                result = env_episode_state(env)
            elif command == "restore_episode":
                result = env.restore_episode(arg)
            else:
                result = env.step(arg)
            conn.send(("ok", result))
        except BaseException as error:  # sent back and re-raised in the parent
            conn.send(("error", error))


class _ProcessWorker:
    """Holds one env in a spawned worker process (the env is built there)."""

    def __init__(self, name: str, kwargs: dict[str, Any]):
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=_process_worker_main, args=(child, name, kwargs), daemon=True
        )
        self.process.start()
        child.close()

    def _call(self, command, arg):
        self.conn.send((command, arg))
        status, value = self.conn.recv()
        if status == "error":
            raise value
        return value

    def reset(self, seed):
        return self._call("reset", seed)

    def step(self, action):
        return self._call("step", action)

    def episode_state(self):
        return self._call("episode_state", None)

    def restore_episode(self, state):
        return self._call("restore_episode", state)

    def close(self):
        try:
            self.conn.send(("close", None))
        except (BrokenPipeError, OSError):
            pass
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()


class VectorEnv:
    """N copies of one environment, auto-reset, seeded, their outputs checked.

    `step(actions)` steps every env; an env whose episode ends is reset at
    once: its `StepResult` keeps the terminal `reward`/`done=True`, carries
    the terminal observation in `info["final_observation"]`, and its
    `observation` is the first observation of the next episode.  Episode `k`
    of env `i` is reset with seed `seed + i + k * num_envs`; with `group_size` G,
    the G envs of group g = i // G share their seeds: `seed + g + k * num_envs / G`
    (the group-relative methods' trajectories start from one state).  Each env's
    actions since its last reset are kept (`episode_actions`), so that
    `resume` can put a resumed run's envs back in the middle of their
    episodes by replaying them (the environments are deterministic given
    the reset seed and the actions).

    Every `reset` and `step` result is checked (`envs_py.checks`): a value
    the trainer cannot use raises EnvOutputError and an exception of the
    environment's own EnvCallError, each naming the environment, the thread
    and the call.

    Modes:
      "inline": envs live in this process and step one after another (cheap
        envs such as Overcooked and VirtualHome).
      "threads": envs live in this process and step concurrently in a thread
        pool (envs whose step waits on a subprocess, such as DataSciCoding's
        sandbox).
      "processes": each env lives in a spawned worker process (expensive
        pure-Python envs).
    """

    def __init__(
        self,
        name: str,
        num_envs: int,
        seed: int | None = 0,
        mode: str = "inline",
        group_size: int = 1,
        **env_kwargs: Any,
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if group_size < 1 or num_envs % group_size:
            raise ValueError(f"group_size must divide num_envs ({num_envs}), got {group_size}")
        self.group_size = group_size
        if mode not in ("inline", "threads", "processes"):
            raise ValueError(f"mode must be inline, threads or processes, got {mode!r}")
        self.name = name
        self.num_envs = num_envs
        self.seed = seed
        self.mode = mode
        if mode == "processes":
            make(name, **env_kwargs)  # fail here, with a clear error, not in a worker
            self._workers = [_ProcessWorker(name, env_kwargs) for _ in range(num_envs)]
        else:
            self._workers = [
                _InlineWorker(lambda: make(name, **env_kwargs)) for _ in range(num_envs)
            ]
        self._pool = (
            concurrent.futures.ThreadPoolExecutor(max_workers=num_envs)
            if mode in ("threads", "processes")
            else None
        )
        self._episodes = [0] * num_envs
        self._episode_actions: list[list[str]] = [[] for _ in range(num_envs)]

    def _map(self, fn: Callable[[int], Any]) -> list[Any]:
        if self._pool is None:
            return [fn(i) for i in range(self.num_envs)]
        return list(self._pool.map(fn, range(self.num_envs)))

    def _call(self, i: int, call: str, *args: Any) -> Any:
        """Worker i's `reset`, `step` or `restore_episode`, the environment's own exceptions raised as
        EnvCallError (the original as its cause) and what it returns checked (`envs_py.checks`:
        EnvOutputError)."""
        try:
            result = getattr(self._workers[i], call)(*args)
        except EnvError:
            raise
        except Exception as error:
            raise EnvCallError(self.name, i, call, error) from error
        if call in ("reset", "restore_episode"):
            check_observation(result, self.name, i, call)
        else:
            check_step_result(result, self.name, i)
        return result

    def _reset_one(self, i: int) -> Observation:
        groups = self.num_envs // self.group_size  # the envs of a group share their episodes' seeds
        seed = _episode_seed(self.seed, i // self.group_size, self._episodes[i], groups)
        self._episode_actions[i] = []
        return self._call(i, "reset", seed)

    @property
    def episode_counters(self) -> list[int]:
        """How many episodes each env has finished (drives the reset seeds)."""
        return list(self._episodes)

    @property
    def episode_actions(self) -> list[list[str]]:
        """Each env's actions since its last reset (its episode so far)."""
        return [list(actions) for actions in self._episode_actions]

    def reset(self, episode_counters: Sequence[int] | None = None) -> list[Observation]:
        """Resets every env and returns observations.

        Episode counters restart at 0, or at `episode_counters` (to resume a
        run: each env starts the episode, and seed, it would have started next).
        """
        if episode_counters is None:
            self._episodes = [0] * self.num_envs
        else:
            if len(episode_counters) != self.num_envs:
                raise ValueError(f"expected {self.num_envs} episode counters, got {len(episode_counters)}")
            self._episodes = [int(c) for c in episode_counters]
        return self._map(self._reset_one)

    @property
    def episode_states(self) -> list[dict[str, Any] | None]:
        """Each env's episode in progress as its env keeps it (`env_episode_state`; None for an env
        that keeps none): what `resume` restores instead of replaying actions."""
        return self._map(lambda i: self._workers[i].episode_state())

    def resume(self, episode_counters: Sequence[int], episode_actions: Sequence[Sequence[str]],
               digests: Sequence[str | None] | None = None,
               states: Sequence[dict[str, Any] | None] | None = None) -> tuple[list[Observation], list[int]]:
        """Puts every env back where a checkpoint left it: `reset(episode_counters)`, then env i restores
        `states[i]` (its `episode_states` entry, when it has one: exact, nothing re-run) or else replays
        `episode_actions[i]` (its episode so far).  An env whose replay ends the episode early, or (when
        `digests` are given) leads to an observation whose `observation_digest` differs, restarts its
        episode instead, as a plain reset would.  Returns (observations, the envs that restarted)."""
        if len(episode_actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} action lists, got {len(episode_actions)}")
        if digests is not None and len(digests) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} observation digests, got {len(digests)}")
        if states is not None and len(states) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} episode states, got {len(states)}")
        observations = self.reset(episode_counters)

        def replay(i: int) -> tuple[Observation, bool]:
            observation = observations[i]
            if states is not None and states[i] is not None:
                observation = self._call(i, "restore_episode", states[i])
                self._episode_actions[i] = [str(action) for action in episode_actions[i]]
            else:
                for action in episode_actions[i]:
                    result = self._call(i, "step", str(action))
                    if result.done:
                        return self._reset_one(i), False
                    self._episode_actions[i].append(str(action))
                    observation = result.observation
            expected = None if digests is None else digests[i]
            if expected is not None and observation_digest(observation) != expected:
                return self._reset_one(i), False
            return observation, True

        replayed = self._map(replay)
        return [o for o, _ in replayed], [i for i, (_, ok) in enumerate(replayed) if not ok]

    def step(self, actions: Sequence[str | None]) -> list[StepResult | None]:
        """Steps env i with actions[i]; finished episodes are reset at once.  An action None
        leaves its env as it is (its result is None)."""
        if len(actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions, got {len(actions)}")

        def step_one(i: int) -> StepResult | None:
            if actions[i] is None:
                return None
            result = self._call(i, "step", actions[i])
            if not result.done:
                self._episode_actions[i].append(actions[i])
                return result
            self._episodes[i] += 1
            info = dict(result.info, final_observation=result.observation)
            return dataclasses.replace(result, observation=self._reset_one(i), info=info)

        return self._map(step_one)

    def close(self) -> None:
        for worker in self._workers:
            worker.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def __enter__(self) -> "VectorEnv":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
