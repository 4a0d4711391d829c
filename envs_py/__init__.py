"""Text environments for language agents (pure Python/NumPy; no JAX).

    import envs_py
    env = envs_py.make("virtualhome/food_preparation")
    obs = env.reset(seed=0)            # Observation(text, actions)
    result = env.step(obs.actions[0])  # StepResult(observation, reward, done, info)
"""

from envs_py.checks import EnvCallError, EnvError, EnvOutputError
from envs_py.interface import Observation, StepAfterDoneError, StepResult, TextEnv, observation_digest
from envs_py.registry import EnvSpec, UnknownEnvError, make, register, registry, spec
from envs_py.vector import VectorEnv

__all__ = [
    "EnvCallError",
    "EnvError",
    "EnvOutputError",
    "EnvSpec",
    "Observation",
    "StepAfterDoneError",
    "StepResult",
    "TextEnv",
    "UnknownEnvError",
    "VectorEnv",
    "make",
    "observation_digest",
    "register",
    "registry",
    "spec",
]
