"""Every setting is declared once, beside the code that reads it: its default, type, one-line meaning
and check sit in one dataclass field of the layer's own object (`LearnerConfig` for `config.ppo`,
`SamplingConfig` for `config.sampling`, `RolloutConfig` for the rollouts' top-level fields,
`GroupConfig` for `config.group`, `CriticConfig` for `config.critic`; the run's own in `run/config/settings.py`), and the command-line
config, its checks and the typed objects the library runs on all derive from those declarations."""

from __future__ import annotations

import ast
import dataclasses
import json
import pathlib
import re
import typing
from typing import Literal

import pytest

from poad_jax import declare
from poad_jax.agent.learner import LearnerConfig
from poad_jax.agent.method_config import MethodConfig
from poad_jax.agent.rollout import RolloutConfig
from poad_jax.core.critic_config import CriticConfig
from poad_jax.core.group_advantages import GroupConfig
from poad_jax.models.config import LoraConfig
from poad_jax.run import config as config_lib
from poad_jax.run.config import boundary, settings
from poad_jax.sampling import SamplingConfig

REPO = pathlib.Path(__file__).resolve().parents[1]
# `default_config()` as it was before the settings were declared once (issue 43), as config.json stores it.
BEFORE = REPO / "tests" / "fixtures" / "default_config_before_issue43.json"


def declaring_classes(cls: type, prefix: str = ""):
    """(dotted prefix, class) for `cls` and every section and inline class below it."""
    yield prefix, cls
    for field in dataclasses.fields(cls):
        if declare.SECTION in field.metadata:
            yield from declaring_classes(field.metadata[declare.SECTION], f"{prefix}{field.name}.")
        elif declare.INLINE in field.metadata:
            yield from declaring_classes(field.metadata[declare.INLINE], prefix)


DECLARED = [(f"{prefix}{field.name}", cls, field) for prefix, cls in declaring_classes(settings.Run)
            for field in dataclasses.fields(cls)]


def json_leaves(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and key != "kwargs":
            out.update(json_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def has_type(value, kind) -> bool:
    """Whether a declared default is a value of its declared type."""
    if typing.get_origin(kind) is Literal:
        return value in typing.get_args(kind)
    if typing.get_origin(kind) is tuple:
        (item, _) = typing.get_args(kind)
        return isinstance(value, tuple) and all(isinstance(v, item) for v in value)
    if kind is float:
        return isinstance(value, float)
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))


@pytest.mark.parametrize("dotted, cls, field", DECLARED, ids=[d for d, _, _ in DECLARED])
def test_every_field_declares_its_default_type_meaning_and_check_in_one_place(dotted, cls, field):
    """A field of a declaring class is a setting (default, type, one-line meaning, check), a section or
    inline class (its own declarations), or a derived value the run sets (a one-line meaning)."""
    kind = typing.get_type_hints(cls)[field.name]
    meaning = field.metadata.get(declare.MEANING)
    assert isinstance(meaning, str) and meaning.strip() and "\n" not in meaning, f"{dotted}: no one-line meaning"
    if declare.SECTION in field.metadata or declare.INLINE in field.metadata:
        assert kind is field.metadata.get(declare.SECTION, field.metadata.get(declare.INLINE)), dotted
        return
    if declare.DERIVED in field.metadata:
        return
    assert field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING, dotted
    assert declare.CHECK in field.metadata, f"{dotted}: declared without `setting(...)`"
    default = declare.default_of(field)
    assert has_type(default, kind), f"{dotted}: default {default!r} is not a {kind}"
    check = field.metadata[declare.CHECK] or declare.type_check(kind)  # an explicit rule, or its type's
    assert isinstance(check, (declare.Check, declare.OneOf)), dotted


def test_the_checks_are_the_declared_fields_one_each():
    """`CHECKS` has one check per declared setting, and the config has exactly the declared fields."""
    declared = [leaf.dotted for leaf in declare.declared_leaves(settings.Run)]
    assert [check.field for check in config_lib.CHECKS] == declared
    assert set(json_leaves(json.loads(config_lib.default_config().to_json_best_effort()))) == set(declared)


def test_the_defaults_pass_their_checks():
    config = config_lib.default_config()
    for check in config_lib.CHECKS:
        config_lib.check_field(config, check)
    config_lib.validate(config)


def test_mode_strings_are_literal_types_checked_once():
    """A setting with a fixed list of strings is a `Literal`, whose values are its check."""
    for leaf in declare.declared_leaves(settings.Run):
        if typing.get_origin(leaf.kind) is Literal:
            assert isinstance(leaf.check, declare.OneOf) and leaf.check.choices() == typing.get_args(leaf.kind)
    mode = {leaf.dotted: leaf.kind for leaf in declare.declared_leaves(settings.Run)}
    assert mode["ppo.kl_skip"] == Literal["update", "actor"]
    assert mode["behaviour_logprobs"] == Literal["recompute", "sampler", "auto"]
    assert config_lib.DTYPES == ("float32", "bfloat16", "float16")
    assert config_lib.MATMUL_DTYPES == ("float32", "bfloat16")


def test_the_generated_defaults_are_the_ones_before_the_declarations():
    """Every field `default_config()` had before issue 43 keeps its value and type (new fields may be added)."""
    before = json_leaves(json.loads(BEFORE.read_text()))
    now = json_leaves(json.loads(config_lib.default_config().to_json_best_effort()))
    for dotted, value in before.items():
        assert dotted in now, f"{dotted} disappeared"
        assert (now[dotted], type(now[dotted])) == (value, type(value)), dotted


@pytest.mark.parametrize("section, declaring, part", [
    ("ppo", LearnerConfig, "ppo"), ("sampling", SamplingConfig, "sampling"), ("group", GroupConfig, "group"),
    ("lora", LoraConfig, "lora"), ("critic", CriticConfig, "critic"), ("", RolloutConfig, "rollout"),
    ("", MethodConfig, "scheme")])
def test_each_layer_declares_the_settings_it_reads_and_the_config_composes_them(section, declaring, part):
    """The learner, the sampler, the group methods, the adapters, the critic, the rollouts and the credit schemes
    each run on the class that declares their settings; the command-line config has its settings where the run's
    tree places it (a section, or the top level for the inline rollouts and schemes), and `typed` gives back that
    same class (as `part` of the typed tree)."""
    placed = {leaf.dotted: leaf.owner for leaf in declare.declared_leaves(settings.Run)}
    own = [leaf.dotted for leaf in declare.declared_leaves(declaring)]
    assert own, declaring
    for name in own:
        assert placed[f"{section}.{name}" if section else name] is declaring
    tree = config_lib.typed(config_lib.default_config())
    assert type(getattr(tree, part)) is declaring


def test_every_command_line_field_maps_to_exactly_one_declaration():
    """No setting is declared twice: the dotted names are unique, and no declaring class is placed twice."""
    leaves = declare.declared_leaves(settings.Run)
    dotted = [leaf.dotted for leaf in leaves]
    assert len(dotted) == len(set(dotted))
    classes = [cls for _, cls in declaring_classes(settings.Run)]
    assert len(classes) == len(set(classes))


def _package_sources():
    for root in ("poad_jax", "envs_py"):
        for path in sorted((REPO / root).rglob("*.py")):
            yield path, path.read_text()


def test_a_settings_meaning_is_written_once_in_the_package():
    """A declaration is not restated: each setting's one-line meaning occurs once in the package's
    source (in its declaration), not again in a docstring or comment of another class."""
    def words(text: str) -> str:  # quotes, escapes and line breaks between string parts dropped
        return re.sub(r"[^a-z0-9]+", " ", text.lower())

    texts = words("\n".join(text for _, text in _package_sources()))
    for leaf in declare.declared_leaves(settings.Run):
        if len(leaf.meaning) >= 30:  # short meanings ("Adam's epsilon") may well recur as prose
            count = texts.count(words(leaf.meaning))
            assert count == 1, f"{leaf.dotted}: its meaning is written {count} times"


CAST = re.compile(r"\b(int|float|bool|str|tuple)\((config|cfg|self\.config|run_config)\.[a-z_.]+\)")


def test_no_cast_of_a_config_value_remains_in_the_package():
    """The config is turned into typed objects once (`typed`): no `int(config.x)` or the like anywhere."""
    found = [f"{path.relative_to(REPO)}:{n}" for path, text in _package_sources()
             for n, line in enumerate(text.splitlines(), 1) if CAST.search(line)]
    assert not found, found


def test_below_run_nothing_reads_a_config_dict():
    """The layers below the command line (`agent`, `core`, `models`, `sampling`, `parallel`, `envs_py`)
    import no ml_collections: they take the typed objects."""
    layers = [REPO / "poad_jax" / name for name in ("agent", "core", "models", "sampling", "parallel")]
    layers.append(REPO / "envs_py")
    for layer in layers:
        for path in layer.rglob("*.py"):
            imported = {alias.name.split(".")[0] for node in ast.walk(ast.parse(path.read_text()))
                        if isinstance(node, ast.Import) for alias in node.names}
            imported |= {(node.module or "").split(".")[0] for node in ast.walk(ast.parse(path.read_text()))
                         if isinstance(node, ast.ImportFrom)}
            assert "ml_collections" not in imported, path.relative_to(REPO)


def test_typed_gives_each_setting_its_declared_type_and_sets_the_derived_fields():
    """An int where a float is declared becomes a float, a JSON list a tuple; the derived fields follow
    their sources (the learner's temperature and critic kind, the rollouts' sampler and group size)."""
    config = config_lib.default_config()
    config.ppo.gamma, config.critic.hidden_sizes, config.sampling.temperature = 1, [8, 4], 2
    config.critic.kind, config.method, config.group.size, config.behaviour_logprobs = "lora", "grpo", 2, "recompute"
    tree = config_lib.typed(config)
    assert (tree.ppo.gamma, type(tree.ppo.gamma)) == (1.0, float)
    assert tree.critic.hidden_sizes == (8, 4)
    assert (tree.ppo.temperature, tree.ppo.critic_kind) == (2.0, "lora")
    assert tree.rollout.sampling == tree.sampling and tree.rollout.group_size == 2
    assert tree.sampling.logprobs_of == "sampled"
    for cls in [cls for _, cls in declaring_classes(settings.Run)]:
        for field in dataclasses.fields(cls):
            required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
            if declare.DERIVED in field.metadata and required:
                assert (cls, field.name) in boundary.DERIVED, f"{cls.__name__}.{field.name} has no rule"


def test_a_declaring_class_built_directly_runs_the_declared_checks():
    """The sampler's settings built outside a run are held to the same declared checks (one message)."""
    config = config_lib.default_config()
    config.sampling.top_p = 0.0
    with pytest.raises(config_lib.ConfigError) as from_config:
        config_lib.validate(config)
    with pytest.raises(declare.SettingError) as direct:
        SamplingConfig(top_p=0.0)
    assert str(direct.value) == str(from_config.value).replace("sampling.", "")
    assert SamplingConfig(temperature=0.0).temperature == 0.0  # greedy: the sampler's, refused to training
    config = config_lib.default_config()
    config.sampling.temperature = 0.0
    with pytest.raises(config_lib.ConfigError, match="training samples its actions"):
        config_lib.validate(config)


def test_a_stored_config_is_completed_from_the_declarations_in_one_place():
    """`completed` fills every field a stored config lacks with its declared default, keeps what it has,
    and leaves the stored config as it was."""
    stored = config_lib.default_config()
    del stored.ppo["lambda_scope"], stored["behaviour_logprobs"], stored["distributed"]
    stored.ppo.gamma = 0.9
    filled = config_lib.completed(stored)
    config_lib.validate(filled)
    assert (filled.ppo.lambda_scope, filled.behaviour_logprobs, filled.distributed.num_processes) == (
        "token", "recompute", 1)
    assert filled.ppo.gamma == 0.9 and "lambda_scope" not in stored.ppo
