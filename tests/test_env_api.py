"""The shared environment API on the Overcooked and VirtualHome families.

Registry, `make` errors, the `TextEnv` contract, and `VectorEnv` (inline,
threads, processes) agreeing step for step with single environments.
"""

from __future__ import annotations

import pathlib
import random
import subprocess
import sys

import pytest

import envs_py

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]

OUR_NAMES = (
    "overcooked/tomato_salad",
    "overcooked/tomato_lettuce_salad",
    "virtualhome/food_preparation",
    "virtualhome/entertainment",
    "virtualhome/food_preparation_cheese",
    "virtualhome/food_preparation_hamburger",
    "virtualhome/food_preparation_apple_pie",
    "virtualhome/food_preparation_pizza",
    "virtualhome/food_preparation_washing_plate",
    "virtualhome/food_preparation_laundry",
)


def test_registry_lists_every_env_with_a_one_line_description():
    names = envs_py.registry()
    for name in OUR_NAMES:
        assert name in names
        description = names[name]
        assert description.strip() and "\n" not in description


def test_unknown_name_raises_unknown_env_error_listing_known_names():
    with pytest.raises(envs_py.UnknownEnvError) as error:
        envs_py.make("overcooked/soup")
    message = str(error.value)
    assert "overcooked/soup" in message and "overcooked/tomato_salad" in message


def test_bad_keyword_is_one_clear_error():
    with pytest.raises(TypeError, match="colour"):
        envs_py.make("virtualhome/entertainment", colour="red")
    with pytest.raises(ValueError, match="max_steps"):
        envs_py.make("virtualhome/entertainment", max_steps=0)


@pytest.mark.parametrize("name", OUR_NAMES)
def test_text_env_contract(name):
    env = envs_py.make(name)
    assert isinstance(env, envs_py.TextEnv)
    obs = env.reset(seed=0)
    assert isinstance(obs, envs_py.Observation) and isinstance(obs.text, str) and obs.text
    assert isinstance(obs.actions, tuple) and obs.actions and all(isinstance(a, str) for a in obs.actions)
    result = env.step(obs.actions[0])
    assert isinstance(result, envs_py.StepResult)
    assert isinstance(result.reward, float) and isinstance(result.done, bool)
    assert isinstance(result.info["state_vector"], list)
    assert result.info["invalid_action"] is False and isinstance(result.info["success"], bool)
    if name.startswith("overcooked/"):
        assert result.info["primitive_steps"] >= 1


def _policy_actions(seed: int, observations: list[envs_py.Observation]) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(o.actions) for o in observations]


def _single_env_trace(name: str, num_envs: int, seed: int, steps: int) -> list:
    """What VectorEnv must produce, computed with plain single envs and manual auto-reset."""
    envs = [envs_py.make(name) for _ in range(num_envs)]
    episodes = [0] * num_envs
    obs = [env.reset(seed=seed + i) for i, env in enumerate(envs)]
    trace = []
    for t in range(steps):
        actions = _policy_actions(t, obs)
        row = []
        for i, env in enumerate(envs):
            result = env.step(actions[i])
            if result.done:
                episodes[i] += 1
                final = result.observation
                obs[i] = env.reset(seed=seed + i + episodes[i] * num_envs)
                row.append((result.reward, True, final, obs[i]))
            else:
                obs[i] = result.observation
                row.append((result.reward, False, None, obs[i]))
        trace.append(row)
    return trace


@pytest.mark.parametrize("mode", ["inline", "threads", "processes"])
def test_vector_env_agrees_with_single_envs(mode):
    # Enough steps that both Overcooked envs finish and auto-reset at least once.
    name, num_envs, seed, steps = "overcooked/tomato_salad", 2, 7, 70
    expected = _single_env_trace(name, num_envs, seed, steps)
    with envs_py.VectorEnv(name, num_envs, seed=seed, mode=mode) as vec:
        obs = vec.reset()
        resets = 0
        for t in range(steps):
            results = vec.step(_policy_actions(t, obs))
            got = [
                (r.reward, r.done, r.info.get("final_observation"), r.observation) for r in results
            ]
            assert got == expected[t], f"step {t}"
            resets += sum(r.done for r in results)
            obs = [r.observation for r in results]
    assert resets >= num_envs


@pytest.mark.parametrize("mode", ["inline", "threads", "processes"])
def test_resume_replays_each_episode_in_progress_to_where_it_was(mode):
    """`VectorEnv.resume(counters, episode_actions, digests)` in fresh envs continues exactly where the
    first envs were: the same observations, then the same steps (rewards, ends, resets) as the first
    envs stepped on; a wrong digest or a replay that ends early restarts that env's episode."""
    name, num_envs, seed = "overcooked/tomato_salad", 2, 7
    with envs_py.VectorEnv(name, num_envs, seed=seed, mode=mode) as first:
        obs = first.reset()
        for t in range(45):  # mid-episode for both, after at least one auto-reset
            obs = [r.observation for r in first.step(_policy_actions(t, obs))]
        counters, actions = first.episode_counters, first.episode_actions
        assert all(actions) and any(counters), (counters, [len(a) for a in actions])
        digests = [envs_py.observation_digest(o) for o in obs]
        with envs_py.VectorEnv(name, num_envs, seed=seed, mode=mode) as second:
            resumed, restarted = second.resume(counters, actions, digests)
            assert resumed == obs and restarted == []
            assert second.episode_actions == actions and second.episode_counters == counters
            for t in range(45, 70):
                a, b = first.step(_policy_actions(t, obs)), second.step(_policy_actions(t, obs))
                assert [(r.reward, r.done, r.observation) for r in a] == [(r.reward, r.done, r.observation) for r in b]
                obs = [r.observation for r in a]
        with envs_py.VectorEnv(name, num_envs, seed=seed, mode=mode) as third:
            fresh = third.reset(counters)
            resumed, restarted = third.resume(counters, actions, ["0" * 16, digests[1]])
            assert restarted == [0] and resumed[0] == fresh[0] and third.episode_actions[0] == []
            assert third.episode_actions[1] == actions[1]


def test_vector_env_seeds_each_episode_distinctly():
    with envs_py.VectorEnv("virtualhome/food_preparation", 3, seed=10) as vec:
        vec.reset()
        envs = [worker.env for worker in vec._workers]
        assert [env.seed for env in envs] == [10, 11, 12]
        for _ in range(50):  # invalid actions until the step limit ends every episode
            results = vec.step(["not an action"] * 3)
        assert all(r.done and r.info["invalid_action"] and r.info["truncated"] for r in results)
        assert [env.seed for env in envs] == [13, 14, 15]


def test_step_after_done_raises_for_every_family():
    for name in ("overcooked/tomato_salad", "virtualhome/entertainment"):
        env = envs_py.make(name)
        obs = env.reset()
        result = None
        while result is None or not result.done:
            result = env.step("invalid")
        with pytest.raises(envs_py.StepAfterDoneError):
            env.step(obs.actions[0])


@pytest.mark.parametrize("name", ["overcooked/tomato_salad", "virtualhome/food_preparation"])
def test_step_with_a_number_points_to_step_id(name):
    env = envs_py.make(name)
    env.reset()
    with pytest.raises(TypeError, match="step_id"):
        env.step(0)


def test_envs_py_never_imports_jax():
    code = (
        "import sys, envs_py\n"
        "for name in envs_py.registry():\n"
        "    if name.split('/')[0] in ('overcooked', 'virtualhome'):\n"
        "        env = envs_py.make(name); obs = env.reset(); env.step(obs.actions[0])\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'flax', 'optax'))\n"
        "assert not bad, bad\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr
