"""How a setting is declared: one dataclass field holds its default, type, meaning and check.

A section of the training config is a frozen dataclass (`settings.PPO`, ...)
whose fields are `setting(default, meaning, check)`, or `section(Cls, meaning)`
for a sub-section.  Everything else derives from these declarations:
`as_config_dict` makes the ml_collections ConfigDict the config files start
from and the command line overrides (`--config.ppo.actor_lr=...`), and
`declared_leaves` gives every field's dotted name, type, default, meaning
and check, which `checks.CHECKS` runs.

A field's check is its rule when it has one (`Check`, `OneOf`, `at_least`,
...); else, for a `Literal[...]` type, one of the type's values; else its
type itself (an integer, a string, True or False, ...).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Callable, Literal

import ml_collections

MEANING, CHECK, SECTION = "meaning", "check", "section"  # the metadata keys of a declared field


@dataclasses.dataclass(frozen=True)
class Check:
    """A field's rule: `ok(value)` must hold; else `<field> must be <must>, got <value> (<why>)`.
    `field` is the dotted name, set where the checks are derived from the declarations."""

    ok: Callable[[Any], bool]
    must: str
    why: str = ""
    field: str = ""


@dataclasses.dataclass(frozen=True)
class OneOf:
    """The field's value is one of `choices()` (a function: some lists live in JAX modules,
    imported only when a config is validated).  `noun` words the error as
    `unknown <noun> <value>; choose one of ...`; `many`: the value is a
    non-empty sequence of choices."""

    choices: Callable[[], tuple[str, ...]]
    noun: str = ""
    many: bool = False
    field: str = ""


def at_least(low: float, why: str = "") -> Check:
    return Check(lambda v: v >= low, f">= {low}", why)


def above(low: float, why: str = "") -> Check:
    return Check(lambda v: v > low, f"> {low}", why)


def within(low: float, high: float, open_low: bool = False, why: str = "") -> Check:
    """low <= v <= high, or low < v <= high with `open_low`."""
    if open_low:
        return Check(lambda v: low < v <= high, f"in ({low}, {high}]", why)
    return Check(lambda v: low <= v <= high, f"in [{low}, {high}]", why)


def setting(default: Any, meaning: str, check: Check | OneOf | None = None) -> Any:
    """A field's one declaration: its default, one-line meaning and check (None: the check its
    type implies, `type_check`).  A dict default becomes an empty sub-tree of free keys."""
    metadata = {MEANING: meaning, CHECK: check}
    if isinstance(default, dict):
        return dataclasses.field(default_factory=lambda: dict(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def section(cls: type, meaning: str) -> Any:
    """A sub-section of the config (`config.ppo`), declared by its own dataclass `cls`."""
    return dataclasses.field(default_factory=cls, metadata={MEANING: meaning, SECTION: cls})


def type_check(kind: Any) -> Check | OneOf:
    """The check a field's type implies: a `Literal`'s values, else the type."""
    if typing.get_origin(kind) is Literal:
        return OneOf(lambda: typing.get_args(kind))
    if kind is bool:
        return Check(lambda v: isinstance(v, bool), "True or False")
    if kind is int:
        return Check(lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer")
    if kind is float:
        return Check(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number")
    if kind is str:
        return Check(lambda v: isinstance(v, str), "a string")
    if kind is dict:
        return Check(lambda v: hasattr(v, "items"), "a mapping of names to values")
    raise TypeError(f"no check for a setting of type {kind}: declare one")


@dataclasses.dataclass(frozen=True)
class Declared:
    """One declared field of the config: its dotted name, type, default, meaning and check."""

    dotted: str
    kind: Any
    default: Any
    meaning: str
    check: Check | OneOf


def _default(field: dataclasses.Field) -> Any:
    return field.default_factory() if field.default is dataclasses.MISSING else field.default


def declared_leaves(cls: type, prefix: str = "") -> list[Declared]:
    """Every setting `cls` declares, sub-sections walked ("ppo.gamma"), in declaration order."""
    hints = typing.get_type_hints(cls)
    leaves = []
    for field in dataclasses.fields(cls):
        dotted = prefix + field.name
        if SECTION in field.metadata:
            leaves += declared_leaves(field.metadata[SECTION], dotted + ".")
            continue
        rule = field.metadata.get(CHECK) or type_check(hints[field.name])
        leaves.append(Declared(dotted, hints[field.name], _default(field), field.metadata.get(MEANING, ""),
                               dataclasses.replace(rule, field=dotted)))
    return leaves


def as_config_dict(cls: type) -> ml_collections.ConfigDict:
    """The ConfigDict of `cls`'s declared defaults, sub-sections as sub-trees, in declaration order."""
    config = ml_collections.ConfigDict()
    for field in dataclasses.fields(cls):
        if SECTION in field.metadata:
            config[field.name] = as_config_dict(field.metadata[SECTION])
        else:
            value = _default(field)
            config[field.name] = ml_collections.ConfigDict(value) if isinstance(value, dict) else value
    return config
