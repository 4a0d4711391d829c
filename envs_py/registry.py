"""Environments by name: `register` an entry point, `make` one.

Environments register under a name (`"virtualhome/food_preparation"`) with an
entry point string `"module:callable"`, so importing `envs_py` imports no
environment until `make` asks for it.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

from envs_py.interface import TextEnv


class UnknownEnvError(KeyError):
    """Raised by `make` for a name that is not registered."""

    def __str__(self) -> str:  # KeyError would quote the whole message.
        return str(self.args[0])


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """A registered environment: name, `module:callable` entry point, kwargs."""

    name: str
    entry_point: str
    description: str
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def resolve(self) -> Callable[..., TextEnv]:
        module_name, _, attr = self.entry_point.partition(":")
        return getattr(importlib.import_module(module_name), attr)


_REGISTRY: dict[str, EnvSpec] = {}

# Modules that register environments when imported.  `registry()` and `make()`
# import them on first use; each is optional so that a missing optional
# dependency in one family never hides the others.
_FAMILY_MODULES = (
    "envs_py.overcooked",
    "envs_py.virtualhome",
    "envs_py.datasci",
    "envs_py.toy",
    "envs_py.synthetic",
)
_families_loaded = False


def register(name: str, entry_point: str, description: str, **kwargs: Any) -> None:
    """Registers an environment constructor under `name` (idempotent)."""
    _REGISTRY[name] = EnvSpec(name, entry_point, description, dict(kwargs))


def _load_families() -> None:
    global _families_loaded
    if _families_loaded:
        return
    _families_loaded = True
    for module_name in _FAMILY_MODULES:
        try:
            importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            # Only a family that is absent is skipped; a family that exists
            # but fails to import because of its own bug must surface.
            if error.name != module_name:
                raise


def registry() -> dict[str, str]:
    """Returns {name: one-line description} of every registered environment."""
    _load_families()
    return {name: spec.description for name, spec in sorted(_REGISTRY.items())}


def spec(name: str) -> EnvSpec:
    """The registration of `name` (its entry point and default kwargs); UnknownEnvError if none."""
    _load_families()
    if name not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY)) or "(none)"
        raise UnknownEnvError(f"unknown environment {name!r}; known: {known}")
    return _REGISTRY[name]


def make(name: str, **kwargs: Any) -> TextEnv:
    """Builds the environment registered as `name`; kwargs override defaults."""
    registered = spec(name)
    return registered.resolve()(**{**registered.kwargs, **kwargs})
