"""The settings are typed once per command and passed down: each command's entry point turns its
ConfigDict into the typed `Run` (`run.config.typed`) once, and the build, the placement, the training
loop and the tools take the `Run` (or the section they need), never a ConfigDict; the training loop's
two watchdogs are one object (`train.Watchdogs`)."""

from __future__ import annotations

import ast
import inspect
import pathlib
import typing

import ml_collections
import pytest

from poad_jax.run import build, train
from poad_jax.run import config as config_lib
from poad_jax.run.config import Run
from poad_jax.tools import evaluate, export

REPO = pathlib.Path(__file__).resolve().parents[1]
# The modules that type a config, and how many times each calls `typed(`: one per command entry point.
# `export.load_trained_actor` types a run directory's config for both `export` and `evaluate`; the
# study's `theory` functions take a cell's config; `run/config/` defines `typed` and its converters.
TYPING_MODULES = {
    "poad_jax/run/train.py": 1,  # run(): the train command (cli.main reads RunResult.settings)
    "poad_jax/tools/export.py": 1,  # export and evaluate
    "poad_jax/tools/theory.py": 1,
    "poad_jax/tools/study/scheduler.py": 1,
    "poad_jax/bench/e2e.py": 1,
    "poad_jax/bench/logprob_gap.py": 1,
    "poad_jax/bench/codegen.py": 1,
    "scripts/memory_phases.py": 1,
}
# The one function that still takes a ConfigDict, the train command's entry point: `run` itself (it
# validates, resolves, stores and compares the config as given).
CONFIG_DICT_PARAMETERS = {"poad_jax.run.train.run"}


def typed_calls(source: str) -> int:
    """The calls of `typed(...)` or `<module>.typed(...)` in `source`."""
    return sum(1 for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
               and ((isinstance(node.func, ast.Name) and node.func.id == "typed")
                    or (isinstance(node.func, ast.Attribute) and node.func.attr == "typed")))


def test_each_command_types_its_config_once():
    found = {}
    for root in ("poad_jax", "scripts"):
        for path in sorted((REPO / root).rglob("*.py")):
            name = str(path.relative_to(REPO))
            if name.startswith("poad_jax/run/config/"):
                continue
            count = typed_calls(path.read_text())
            if count:
                found[name] = count
    assert found == TYPING_MODULES


def test_the_typed_call_counter_counts_both_spellings():
    assert typed_calls("run = typed(config)\nx = config_lib.typed(c).ppo\ntyped_tree(Run, c)\n") == 2


def _functions(module):
    """(qualified name, function) of every function and method defined in `module`."""
    for name, value in vars(module).items():
        if inspect.isfunction(value) and value.__module__ == module.__name__:
            yield f"{module.__name__}.{name}", value
        elif inspect.isclass(value) and value.__module__ == module.__name__:
            for method_name, method in vars(value).items():
                function = method.__func__ if isinstance(method, (classmethod, staticmethod)) else method
                if inspect.isfunction(function):
                    yield f"{module.__name__}.{name}.{method_name}", function


@pytest.mark.parametrize("module", [build, train, evaluate, export], ids=lambda m: m.__name__)
def test_below_the_entry_point_no_function_takes_a_config_dict(module):
    taking = set()
    for name, function in _functions(module):
        hints = typing.get_type_hints(function, vars(module))
        if any(hint is ml_collections.ConfigDict for hint in hints.values()):
            taking.add(name)
    assert taking == {name for name in CONFIG_DICT_PARAMETERS if name.startswith(module.__name__ + ".")}


TAKING_THE_RUN = [
    (build.build, "run"), (build.build_method, "run"), (build.load_model, "run"), (build.build_value_head, "run"),
    (build.placement_of, "run"), (build.Placement.prefix_plans, "run"),
    (train.training_loop, "settings"), (train.learn_or_count, "settings"), (train.learn_from_rollout, "settings"),
    (train.build_envs, "settings"), (train.describe_placement, "settings"),
    (evaluate.policy_config, "run"), (evaluate.evaluate_env, "run"), (evaluate.playing_collector, "run"),
]


@pytest.mark.parametrize("function, parameter", TAKING_THE_RUN, ids=[f.__qualname__ for f, _ in TAKING_THE_RUN])
def test_the_build_the_placement_the_loop_and_the_tools_take_the_typed_run(function, parameter):
    hints = typing.get_type_hints(function, vars(inspect.getmodule(function)))
    assert hints[parameter] is Run


def test_the_built_parts_hold_no_config_dict():
    hints = typing.get_type_hints(build.Built, vars(build))
    assert ml_collections.ConfigDict not in hints.values()


def _settings(**fields) -> Run:
    config = config_lib.default_config()
    for name, value in fields.items():
        config[name] = value
    return config_lib.typed(config)


def test_the_watchdogs_warn_once_at_the_silent_streak_and_stop_at_the_nonfinite_one(monkeypatch):
    monkeypatch.setattr(train, "SILENT_GROUP_UPDATES", 2)
    settings = _settings(method="grpo", max_nonfinite_updates=3)
    said = []
    silent = {"update": 1, "groups_with_signal": 0, "groups": 1}
    watchdogs = train.Watchdogs.resumed(settings, [])
    for update in (1, 2, 3):
        watchdogs = watchdogs.after(dict(silent, update=update), [], said.append)
    assert (watchdogs.silent, watchdogs.nonfinite) == (3, 0)
    assert len(said) == 1 and "in the last 2 updates no episode group" in said[0]  # once, as the streak reaches 2
    watchdogs = watchdogs.after({"update": 4, "groups_with_signal": 1, "nonfinite_steps": 1.0}, [], said.append)
    assert (watchdogs.silent, watchdogs.nonfinite) == (0, 1)
    watchdogs = watchdogs.after({"update": 5, "nonfinite_steps": 2.0}, [], said.append)
    with pytest.raises(train.NonFiniteUpdatesError, match="3 updates in a row had minibatch steps"):
        watchdogs.after({"update": 6, "nonfinite_steps": 4.0}, [], said.append)
    assert len(said) == 1


def test_resumed_watchdogs_count_on_from_the_records():
    records = [{"nonfinite_steps": 1.0, "groups_with_signal": 0}, {"nonfinite_steps": 0.0, "groups_with_signal": 0}]
    watchdogs = train.Watchdogs.resumed(_settings(), records)
    assert (watchdogs.nonfinite, watchdogs.silent) == (0, 2)
