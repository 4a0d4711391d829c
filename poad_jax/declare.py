"""How a setting is declared: one dataclass field holds its default, type, meaning and check.

Each layer declares the settings it reads in the dataclass it runs on, beside
the code that reads them: the learner's in `agent.learner_config.LearnerConfig`
(`config.ppo`), the sampler's in `sampling.config.SamplingConfig`
(`config.sampling`), the rollouts' in `agent.rollout_config.RolloutConfig`
(top-level fields), the credit schemes' in `agent.method_config.MethodConfig`
(top-level fields), the group methods' in `core.group_advantages.GroupConfig`
(`config.group`), the critic's in `core.critic_config.CriticConfig`
(`config.critic`); the run's own in `run.config.settings`.  A field is

- `setting(default, meaning, check)`: a setting of the command-line config;
- `section(Cls, meaning)`: a sub-section (`config.ppo`), declared by `Cls`;
  either takes `resumable=<kind>` when a re-run of a run directory may change
  it (a section: any of its settings) without changing what the checkpoints
  mean, the kind saying what a change affects (`Resumable`); the run's table of
  such fields is derived from the declarations (`resumable_settings`);
- `inline(Cls, meaning)`: `Cls`'s settings at this level of the config
  (`config.num_threads`, not `config.rollout.num_threads`), `Cls` the typed
  object the run builds from them;
- `derived(meaning, default)`: not a setting but a value the run's boundary
  sets from other settings or from the run (`LearnerConfig.temperature` is
  `sampling.temperature`; `SamplingConfig.stop_token_ids` the tokenizer's).

`run.config` composes these declarations into the command-line config
(`as_config_dict`), runs their checks (`declared_leaves`), and builds the typed
objects back from a config once (`typed_tree`).  A field's check is its rule
when it has one (`Check`, `OneOf`, `at_least`, ...); else, for a
`Literal[...]` type, one of the type's values; else its type itself.

No JAX and no ml_collections: every layer imports it, and a config file loads without JAX.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, Callable, Literal, Mapping

MEANING, CHECK, SECTION, INLINE, DERIVED = "meaning", "check", "section", "inline", "derived"  # metadata keys
RESUMABLE = "resumable"  # metadata key: what a re-run's change of the setting affects

# What a change of a setting a re-run may change affects: "length" (how long the run trains), "outputs"
# (what it writes besides checkpoints), "checkpoints" (how often and how many), "label" (its name),
# "speed" (how the same numbers are computed), "layout" (devices and processes: the same numbers up to
# float rounding).  Any other setting's change is refused in a directory with checkpoints.
Resumable = Literal["length", "outputs", "checkpoints", "label", "speed", "layout"]
RESUMABLE_KINDS: tuple[str, ...] = typing.get_args(Resumable)


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


def setting(default: Any, meaning: str, check: Check | OneOf | None = None, *,
            resumable: Resumable | None = None) -> Any:
    """A field's one declaration: its default, one-line meaning and check (None: the check its
    type implies, `type_check`), and, if a re-run may change it, what a change affects (`resumable`,
    one of `RESUMABLE_KINDS`).  A dict default becomes an empty sub-tree of free keys."""
    metadata = {MEANING: meaning, CHECK: check, **_resumable(resumable)}
    if isinstance(default, dict):
        return dataclasses.field(default_factory=lambda: dict(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def section(cls: type, meaning: str, *, resumable: Resumable | None = None) -> Any:
    """A sub-section of the config (`config.ppo`), declared by its own dataclass `cls`; `resumable`:
    a re-run may change any of its settings, and what a change affects."""
    return dataclasses.field(default_factory=_no_default(cls),
                             metadata={MEANING: meaning, SECTION: cls, **_resumable(resumable)})


def _resumable(kind: str | None) -> dict[str, str]:
    """The metadata that marks a field resumable (none for None); ValueError for an unknown kind."""
    if kind is None:
        return {}
    if kind not in RESUMABLE_KINDS:
        raise ValueError(f"resumable must be one of {', '.join(RESUMABLE_KINDS)}, got {kind!r}")
    return {RESUMABLE: kind}


def inline(cls: type, meaning: str) -> Any:
    """`cls`'s settings spliced into this level of the config (their names unprefixed), and `cls`
    the typed object a run builds from them."""
    return dataclasses.field(default_factory=_no_default(cls), metadata={MEANING: meaning, INLINE: cls})


_REQUIRED = object()


def derived(meaning: str, default: Any = _REQUIRED) -> Any:
    """A field that is not a setting: the run's boundary sets it (from other settings or from the
    run); without a default it must be given (a keyword-only dataclass allows that after the settings)."""
    metadata = {MEANING: meaning, DERIVED: True}
    if default is _REQUIRED:
        return dataclasses.field(metadata=metadata)
    if isinstance(default, (dict, tuple, list)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _no_default(cls: type) -> Callable[[], Any]:
    def refuse():
        raise TypeError(f"{cls.__name__} has derived fields: build the tree with run.config.typed(config)")
    return refuse


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
    """One declared setting: its dotted name, type, default, meaning and check, and the class that
    declares it."""

    dotted: str
    kind: Any
    default: Any
    meaning: str
    check: Check | OneOf
    owner: type


def default_of(field: dataclasses.Field) -> Any:
    return field.default_factory() if field.default is dataclasses.MISSING else field.default


def is_setting(field: dataclasses.Field) -> bool:
    return CHECK in field.metadata


def declared_leaves(cls: type, prefix: str = "") -> list[Declared]:
    """Every setting `cls` declares, sub-sections walked ("ppo.gamma") and inline classes spliced in
    place, in declaration order; derived fields are not settings."""
    hints = typing.get_type_hints(cls)
    leaves = []
    for field in dataclasses.fields(cls):
        dotted = prefix + field.name
        if SECTION in field.metadata:
            leaves += declared_leaves(field.metadata[SECTION], dotted + ".")
        elif INLINE in field.metadata:
            leaves += declared_leaves(field.metadata[INLINE], prefix)
        elif is_setting(field):
            rule = field.metadata.get(CHECK) or type_check(hints[field.name])
            leaves.append(Declared(dotted, hints[field.name], default_of(field), field.metadata.get(MEANING, ""),
                                   dataclasses.replace(rule, field=dotted), cls))
    return leaves


def resumable_settings(cls: type, prefix: str = "") -> dict[str, str]:
    """{dotted name: what a change affects} of every setting and section `cls` declares `resumable`, in
    declaration order (a resumable section is one entry, its dotted name covering its sub-tree;
    the other sections are walked, inline classes spliced in place)."""
    found = {}
    for field in dataclasses.fields(cls):
        dotted = prefix + field.name
        if RESUMABLE in field.metadata:
            found[dotted] = field.metadata[RESUMABLE]
        elif SECTION in field.metadata:
            found.update(resumable_settings(field.metadata[SECTION], dotted + "."))
        elif INLINE in field.metadata:
            found.update(resumable_settings(field.metadata[INLINE], prefix))
    return found


def as_value(kind: Any, value: Any) -> Any:
    """A checked config value as its declared type: a number stored as an int becomes a float, a
    list (JSON has no tuples) a tuple, a config sub-tree a dict."""
    if kind is float:
        return float(value)
    if kind in (int, bool, str):
        return kind(value)
    if typing.get_origin(kind) is tuple:
        item = typing.get_args(kind)[0]
        return tuple(as_value(item, v) for v in value)
    if kind is dict:
        return {k: (v.to_dict() if hasattr(v, "to_dict") else v) for k, v in value.items()}
    return value


def typed_tree(cls: type, values: Mapping[str, Any], derive: Callable[[type, str, dict], Any],
               prefix: str = "") -> Any:
    """`cls` built from the nested mapping `values` (a checked config): each setting as its
    declared type, each section and inline class built the same way (an inline class from this
    level's values), each derived field `derive(cls, name, built)` with `built` the fields built so
    far at this level (sections first, so a derived field may read them; `derive` returns
    `dataclasses.MISSING` to leave a field its default)."""
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    built: dict[str, Any] = {}
    for field in fields:
        if SECTION in field.metadata:
            built[field.name] = typed_tree(field.metadata[SECTION], values[field.name], derive,
                                           f"{prefix}{field.name}.")
    for field in fields:
        if INLINE in field.metadata:
            built[field.name] = typed_tree(field.metadata[INLINE], values, derive, prefix)
        elif is_setting(field):
            built[field.name] = as_value(hints[field.name], values[field.name])
    for field in fields:
        if DERIVED in field.metadata:
            value = derive(cls, field.name, built)
            if value is not dataclasses.MISSING:
                built[field.name] = value
    return cls(**{f.name: built[f.name] for f in fields if f.name in built})


class SettingError(ValueError):
    """A value its declaration's check refuses, in one line naming the field."""


def refusal(check: Check | OneOf, value: Any) -> str | None:
    """Why `value` breaks `check` (one line naming `check.field`), or None when it passes."""
    if isinstance(check, OneOf):
        choices = check.choices()
        listed = ", ".join(str(c) for c in choices)
        if check.many:
            if len(value) and all(v in choices for v in value):
                return None
            return f"{check.field} must be one or more of {listed}, got {tuple(value)}"
        if value in choices:
            return None
        if check.noun:
            return f"unknown {check.noun} {value!r} ({check.field}); choose one of {listed}"
        return f"{check.field} must be one of {listed}, got {_shown(value)}"
    try:
        ok = bool(check.ok(value))
    except (TypeError, ValueError):  # e.g. a string where a number belongs
        ok = False
    if isinstance(value, float) and math.isnan(value):
        ok = False
    if ok:
        return None
    why = f" ({check.why})" if check.why else ""
    return f"{check.field} must be {check.must}, got {_shown(value)}{why}"


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def hold_to_declarations(instance: Any) -> None:
    """For a declaring dataclass's `__post_init__`: SettingError if a setting breaks its declared check
    (the rule `validate` applies to a config), then each setting as its declared type (an int given
    for a float becomes a float, a list a tuple), so an object built directly equals one built by
    `run.config.typed`."""
    hints = typing.get_type_hints(type(instance))
    for leaf in declared_leaves(type(instance)):
        value = getattr(instance, leaf.dotted)
        problem = refusal(leaf.check, value)
        if problem:
            raise SettingError(problem)
        object.__setattr__(instance, leaf.dotted, as_value(hints[leaf.dotted], value))
