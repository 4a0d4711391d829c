"""What an environment family imports: the interface's types and `register`.

The interface lives in `envs_py.interface`, the registry in `envs_py.registry`
and the vectorisation in `envs_py.vector`; this module hands the names a
family's module imports on, so `from envs_py.base import ...` keeps working.
"""

from envs_py.interface import Observation, StepAfterDoneError, StepResult, TextEnv, observation_digest
from envs_py.registry import EnvSpec, UnknownEnvError, make, register, registry, spec
from envs_py.vector import VectorEnv

__all__ = ["EnvSpec", "Observation", "StepAfterDoneError", "StepResult", "TextEnv", "UnknownEnvError", "VectorEnv",
           "make", "observation_digest", "register", "registry", "spec"]
