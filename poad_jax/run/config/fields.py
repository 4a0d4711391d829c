"""The one walker of dotted names ("ppo.actor_lr"), and the one filling of a stored config's
missing fields with their declared defaults."""

from __future__ import annotations

import copy
import difflib
from typing import Any

import ml_collections

from poad_jax.run.config.errors import ConfigError
from poad_jax.run.config.settings import default_config


class UnknownFieldError(ConfigError):
    """A dotted name that names no field: `missing` is the first part not found under
    `parent` ("" for the top level); `suggestion` the closest existing dotted name, or None."""

    def __init__(self, dotted: str, parent: str, missing: str, suggestion: str | None):
        hint = f"; did you mean {suggestion}?" if suggestion else ""
        super().__init__(f"unknown config field {dotted}{hint}")
        self.dotted, self.parent, self.missing, self.suggestion = dotted, parent, missing, suggestion


def field_parent(config: Any, dotted: str) -> tuple[Any, str]:
    """(the node holding field `dotted`, its last part): `(config.a, "b")` for "a.b".
    UnknownFieldError (with the closest name) if a part names nothing."""
    parts = dotted.split(".")
    node: Any = config
    for depth, part in enumerate(parts):
        keys = list(node.keys()) if isinstance(node, (ml_collections.ConfigDict, dict)) else []
        if part not in keys:
            parent = ".".join(parts[:depth])
            close = difflib.get_close_matches(part, keys, n=1)
            suggestion = ".".join(parts[:depth] + close) if close else None
            raise UnknownFieldError(dotted, parent, part, suggestion)
        if depth < len(parts) - 1:
            node = node[part]
    return node, parts[-1]


def field_value(config: ml_collections.ConfigDict, dotted: str) -> Any:
    """`config.a.b` for "a.b"; ConfigError if the config has no such field."""
    try:
        node, last = field_parent(config, dotted)
    except UnknownFieldError:
        raise ConfigError(f"the config has no field {dotted} (start config files from "
                          "poad_jax.run.config.default_config())") from None
    return node[last]


def _fill(node: ml_collections.ConfigDict, defaults: ml_collections.ConfigDict) -> None:
    for key, value in defaults.items():
        if key not in node:
            node[key] = value
        elif isinstance(value, ml_collections.ConfigDict) and isinstance(node[key], ml_collections.ConfigDict):
            _fill(node[key], value)


def completed(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """A copy of `config` with every field it lacks set to its declared default: a run directory's
    `config.json` written before the field existed ran as its default.  The one place a reader
    fills an absent field (the readers of a stored config call it; the library reads fields directly)."""
    filled = copy.deepcopy(config)
    with filled.unlocked():
        _fill(filled, default_config())
    return filled
