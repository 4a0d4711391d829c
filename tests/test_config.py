"""One source for the training configuration (`poad_jax.run.config`): its defaults,
its validation, its conversion to the library's dataclasses, and config files
that load by path from any working directory."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import subprocess
import sys

import ml_collections
import pytest

from poad_jax.run import config as config_lib
from poad_jax.core import layout
from poad_jax.run import build, rundir, train
from poad_jax.agent.learner import LearnerConfig
from poad_jax.agent.rollout import RolloutConfig
from poad_jax.sampling import SamplingConfig

REPO = pathlib.Path(__file__).resolve().parents[1]
PRESETS = ("overcooked_paper.py", "virtualhome_paper.py")  # one preset per method: the method is their argument
# Every config file as `--config=` takes it: a preset with a method (each method's is checked in
# test_adrl_semantics.py), the others as they are.
CONFIG_FILES = [f"{p}:poad" if p.name in PRESETS else p for p in sorted((REPO / "configs").glob("*.py"))]
ROLLOUT_SETTINGS = ("num_threads", "rollout_length", "prompt_format", "system_prompt", "max_prompt_tokens",
                    "restricted_sampling", "twosome_normalization", "discounted_return_gamma", "behaviour_logprobs",
                    "trie_explore_temperature")


def leaves(tree, prefix=""):
    """{"ppo.gamma": 0.95, ...}: the dotted names of a ConfigDict's leaves."""
    out = {}
    for key, value in tree.items():
        if hasattr(value, "items") and key != "kwargs":
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def expected_learner_fields(config) -> dict:
    """What the learner must run with: every `ppo` field by name, the temperature and the critic kind."""
    return {**dict(config.ppo.items()), "temperature": config.sampling.temperature, "critic_kind": config.critic.kind}


def expected_rollout_fields(config, eos_ids=()) -> dict:
    sampling = SamplingConfig(**dict(config.sampling.items()), stop_token_ids=eos_ids)
    completed = config_lib.completed(config)
    pack_behaviour = completed.ppo.behaviour_correction != "none"
    # Group rollouts for the group-relative methods: group.size threads a group (0: all of them); none otherwise.
    group_size = (completed.group.size or completed.num_threads) if completed.method in ("grpo", "gigpo") else 0
    return {**{name: config[name] for name in ROLLOUT_SETTINGS}, "sampling": sampling, "pack_behaviour": pack_behaviour,
            "group_size": group_size}


# ---------------------------------------------------------------------------
# One source of defaults.


@pytest.mark.parametrize("path", [None, *CONFIG_FILES], ids=lambda p: "default" if p is None else pathlib.Path(p).name)
def test_dataclasses_carry_exactly_the_configs_values(path):
    """Every LearnerConfig field is the config's value (and every `ppo` setting
    reaches the learner); every rollout setting reaches RolloutConfig."""
    config = config_lib.default_config() if path is None else config_lib.load_config_file(path)
    learner = config_lib.learner_config(config)
    assert dataclasses.asdict(learner) == expected_learner_fields(config)
    rollout = config_lib.rollout_config(config, (7, 9))
    got = {f.name: getattr(rollout, f.name) for f in dataclasses.fields(rollout) if not f.name.endswith("buckets")}
    assert got == expected_rollout_fields(config, (7, 9))


@pytest.mark.parametrize("method, size, expected", [("grpo", 0, 4), ("gigpo", 2, 2), ("poad", 2, 0)])
def test_the_rollouts_group_size_follows_the_method_and_group_size(method, size, expected):
    config = config_lib.default_config()
    config.method, config.group.size = method, size
    assert config_lib.rollout_config(config).group_size == expected


@pytest.mark.parametrize("size, expected", [(0, 4), (2, 2)])
def test_the_group_method_holds_the_declared_group_settings_and_one_group_size(size, expected):
    """The group method runs on `config.group` as it is (no field copied, no default of its own), and its
    group size is the rollouts' (one rule, `GroupConfig.group_size`: 0 groups every thread)."""
    config = config_lib.default_config()
    config.method, config.group.size, config.group.omega, config.ppo.gamma = "gigpo", size, 0.5, 0.9
    run = config_lib.typed(config)
    group = build.build_method(run).group
    assert group.config == run.group and (group.kind, group.gamma) == ("gigpo", 0.9)
    assert group.size == run.rollout.group_size == expected


def test_the_value_head_is_built_from_the_declared_critic_settings():
    """`config.critic` is `CriticConfig` (core/critic_config.py), which the value head takes as it is: its
    widths, biases and init; a bad init is refused by the declaration's check, as in a config."""
    from flax import nnx

    from poad_jax.core.critic_config import CriticConfig
    from poad_jax.core.policy import ValueHead
    from poad_jax.declare import SettingError
    from poad_jax.models.tiny import tiny_random_model

    config = config_lib.default_config()
    config.critic.hidden_sizes, config.critic.bias, config.critic.init = [8, 4], False, "torch"
    assert config_lib.typed(config).critic == CriticConfig(hidden_sizes=(8, 4), bias=False, init="torch")
    model, _ = tiny_random_model(seed=0)
    head = build.build_value_head(model, config_lib.typed(config), 0)
    shapes = [layer.kernel[...].shape for layer in [*head.hidden_layers, head.out]]
    assert shapes == [(model.config.hidden_size, 8), (8, 4), (4, 1)]
    assert all(layer.bias is None for layer in [*head.hidden_layers, head.out])
    assert len(ValueHead(16, CriticConfig(), rngs=nnx.Rngs(0)).hidden_layers) == len(CriticConfig().hidden_sizes)
    with pytest.raises(SettingError, match="init must be one of zero_output, torch"):
        CriticConfig(init="xavier")


def test_the_library_runs_on_the_declarations_so_no_default_competes():
    """The config's defaults are the library objects' own: the learner's, the sampler's and the
    rollouts' classes are the declarations the config is made from, and one built with no arguments
    but the derived fields equals the one the default config gives."""
    config = config_lib.default_config()
    learner = config_lib.learner_config(config)
    assert learner == LearnerConfig(temperature=config.sampling.temperature, critic_kind=config.critic.kind)
    assert config_lib.sampling_config(config) == SamplingConfig()
    rollout = config_lib.rollout_config(config)
    assert rollout == RolloutConfig(sampling=SamplingConfig(), pack_behaviour=False, group_size=0,
                                    prompt_buckets=rollout.prompt_buckets)
    for name, value in config.sampling.items():
        assert getattr(SamplingConfig(), name) == value, name


def test_defaults_are_the_papers_virtualhome_row():
    """The paper's VirtualHome row (its Appendix and the authors' scripts): γ 0.95, actor lr 1e-6, critic lr 5e-5, 4 threads x 32 steps (VirtualHome; DataSciCoding's γ
    and rates too), with the PPO constants shared by every task."""
    ppo = config_lib.default_config().ppo
    assert (ppo.gamma, ppo.actor_lr, ppo.critic_lr, ppo.lam, ppo.clip_eps, ppo.value_clip_eps) == (
        0.95, 1e-6, 5e-5, 0.95, 0.2, 0.2)
    assert (ppo.vf_coef, ppo.max_grad_norm, ppo.target_kl, ppo.adam_eps) == (0.5, 0.5, 0.02, 1e-5)
    config = config_lib.default_config()
    assert (config.num_threads, config.rollout_length, config.lora.rank, config.lora.alpha) == (4, 32, 8, 16.0)
    overcooked = config_lib.load_config_file(REPO / "configs" / "overcooked.py").ppo
    assert (overcooked.gamma, overcooked.actor_lr, overcooked.critic_lr) == (0.99, 5e-7, 1e-5)


def test_overrides_replace_dataclass_fields():
    assert config_lib.learner_config(gamma=0.5, epochs=3) == dataclasses.replace(
        config_lib.learner_config(), gamma=0.5, epochs=3)
    assert config_lib.rollout_config(num_threads=2).num_threads == 2


def test_the_prompt_bucket_step_sets_the_rollouts_prompt_buckets():
    """The packer's (and the trainer's sampler's) prompt buckets are the layout's of the config's step."""
    config = config_lib.default_config()
    assert config_lib.rollout_config(config).prompt_buckets == layout.prompt_buckets(config.prompt_bucket_step)
    config.prompt_bucket_step = 0
    assert config_lib.rollout_config(config).prompt_buckets == layout.prompt_buckets(0)
    config.prompt_bucket_step = 24  # does not divide 256
    with pytest.raises(config_lib.ConfigError, match="prompt_bucket_step must be 0 or a divisor of 256, got 24"):
        config_lib.validate(config)


def test_a_stored_config_without_a_newer_field_converts_with_its_default():
    """Run directories keep `config.json` as written then: a field added since takes its default."""
    stored = rundir.config_as_json(config_lib.default_config())
    del stored["ppo"]["accumulation_steps"], stored["twosome_normalization"], stored["prompt_bucket_step"]
    stored["ppo"]["gamma"] = 0.9
    config = ml_collections.ConfigDict(stored)
    learner = config_lib.learner_config(config)
    assert learner.accumulation_steps == 1 and learner.gamma == 0.9
    assert config_lib.rollout_config(config).twosome_normalization == "token"
    assert config_lib.rollout_config(config).prompt_buckets == layout.PROMPT_BUCKETS


class _Stop(Exception):
    pass


def test_the_trainer_runs_on_the_converted_config(tmp_path, monkeypatch):
    """train.run hands the rollout collector the RolloutConfig built from its config, and TWOSOME's
    method the config's `share_prompt`."""
    config = config_lib.load_config_file(REPO / "configs" / "toy.py")
    config.method = "twosome"
    config.share_prompt = False
    config.ppo.gamma = 0.9
    seen = {}

    def capture_collector(envs, tokenizer, sampler, method, rconfig, seed):
        seen.update(method=method, rconfig=rconfig, eos=tuple(tokenizer.eos_token_ids), sampler=sampler)
        raise _Stop

    monkeypatch.setattr(train, "RolloutCollector", capture_collector)
    with pytest.raises(_Stop):
        train.run(config, tmp_path / "w", show_progress=False)
    assert seen["method"].name == "twosome" and seen["method"].share_prompt is False
    got = {f.name: getattr(seen["rconfig"], f.name) for f in dataclasses.fields(RolloutConfig)
           if not f.name.endswith("buckets")}
    assert got == expected_rollout_fields(config, seen["eos"])
    assert seen["rconfig"].prompt_buckets == seen["sampler"].prompt_buckets == layout.prompt_buckets()
    config.share_prompt = True
    with pytest.raises(_Stop):
        train.run(config, tmp_path / "w2", show_progress=False)
    assert seen["method"].share_prompt is True


def test_the_model_is_loaded_with_the_configs_lora_as_it_is(monkeypatch):
    """`load_model` hands the model `typed(config).lora` (every field of `LoraConfig`, none rebuilt)."""
    config = config_lib.default_config()
    config.model, config.lora.rank, config.lora.alpha, config.lora.targets = "tiny-random", 4, 2, ["q_proj"]
    seen = {}
    monkeypatch.setattr(build, "tiny_random_model", lambda **options: seen.update(options))
    build.load_model(config_lib.typed(config))
    assert seen["lora"] == config_lib.typed(config).lora
    assert (seen["lora"].rank, seen["lora"].alpha, seen["lora"].targets) == (4, 2.0, ("q_proj",))


def test_one_method_builder_honours_gamma_w_and_share_prompt():
    """`build.build_method` is the one way from a config to its method: NTPO's and TWOSOME's
    `gamma_w` (negative: the method's default) and TWOSOME's `share_prompt`; a run directory's
    config.json written before `share_prompt` existed gets True (`config.completed`)."""
    config = config_lib.default_config()
    config.method, config.ppo.gamma = "ntpo", 0.9
    assert build.build_method(config_lib.typed(config)).gamma_w == pytest.approx(0.9)  # NTPO's default: gamma
    config.gamma_w = 0.5
    assert build.build_method(config_lib.typed(config)).gamma_w == 0.5
    config.method, config.share_prompt = "twosome", False
    method = build.build_method(config_lib.typed(config))
    assert (method.name, method.gamma_w, method.share_prompt) == ("twosome", 0.5, False)
    stored = json.loads(config.to_json_best_effort())
    del stored["share_prompt"]  # read as a stored config is read: completed from the declared defaults
    assert build.build_method(config_lib.typed(ml_collections.ConfigDict(stored))).share_prompt is True


def test_the_methods_read_their_settings_as_declared_beside_them():
    """`gamma_w` and `share_prompt` are `agent/method_config.py:MethodConfig`'s, at the config's top level:
    `make_method` reads a negative `gamma_w` as the method's default and defaults `share_prompt` to the
    declared one; the typed run answers to the config's names."""
    from poad_jax.agent.method_config import MethodConfig
    from poad_jax.agent.methods import make_method

    declared = MethodConfig()
    assert make_method("ntpo", 0.9, declared.gamma_w).gamma_w == 0.9
    assert make_method("twosome", 0.9, declared.gamma_w).gamma_w == 1.0
    assert make_method("twosome", 0.9).share_prompt is declared.share_prompt is True
    config = config_lib.default_config()
    config.gamma_w, config.share_prompt = 0.5, False
    run = config_lib.typed(config)
    assert run.scheme == MethodConfig(gamma_w=0.5, share_prompt=False)
    assert (run.scheme.gamma_w, run.scheme.share_prompt) == (0.5, False)


def test_evaluation_acts_with_the_method_the_run_trained(tmp_path, monkeypatch):
    """evaluate builds the method as the trainer does (it used to drop `gamma_w` and `share_prompt`)."""
    from poad_jax.models.tiny import tiny_random_model
    from poad_jax.tools import evaluate

    config = config_lib.load_config_file(REPO / "configs" / "toy.py")
    config.method, config.gamma_w, config.share_prompt = "twosome", 0.5, False
    seen = {}

    def capture_collector(envs, tokenizer, sampler, method, rconfig, seed):
        seen.update(method=method)
        raise _Stop

    monkeypatch.setattr(evaluate, "RolloutCollector", capture_collector)
    model, tokenizer = tiny_random_model(seed=0)
    with pytest.raises(_Stop):
        evaluate.evaluate_env(model, tokenizer, config_lib.typed(config), config.env.name, 2, False, 0, 1)
    assert seen["method"] == build.build_method(config_lib.typed(config))
    assert (seen["method"].gamma_w, seen["method"].share_prompt) == (0.5, False)


def test_one_table_of_resumable_fields():
    """`config.RESUMABLE_FIELDS` is the trainer's and the study runner's list: a dotted name is covered by
    its block; what a study may reuse across studies is the part that changes no number."""
    assert config_lib.resumable_kind("total_env_steps") == "length"
    assert config_lib.resumable_kind("mesh.data") == "layout"
    assert config_lib.resumable_kind("ppo.gamma") is None and config_lib.resumable_kind("meshy") is None
    refused, safe = rundir.config_differences({"mesh": {"data": 1}, "seed": 0}, {"mesh": {"data": 2}, "seed": 1})
    assert refused == ["seed"] and safe == {"mesh.data": [1, 2]}
    same_numbers = {name for name, kind in config_lib.RESUMABLE_FIELDS.items() if kind in config_lib.SAME_NUMBERS}
    assert same_numbers == {"total_env_steps", "max_nonfinite_updates", "tensorboard", "plot", "log_actions"}


# The table as it was written by hand in run/config/resumable.py before each declaration said it (issue 80).
RESUMABLE_BEFORE_ISSUE_80 = {
    "total_env_steps": "length", "max_nonfinite_updates": "length", "tensorboard": "outputs", "plot": "outputs",
    "log_actions": "outputs", "checkpoint_every": "checkpoints", "keep_checkpoints": "checkpoints", "name": "label",
    "env.vector_mode": "speed", "remat": "speed", "share_prompt": "speed", "prefix_packing": "speed",
    "sampling.share_prompts": "speed", "prompt_bucket_step": "speed", "mesh": "layout", "distributed": "layout",
}


def test_the_resumable_fields_are_derived_from_the_declarations_as_the_table_was():
    """Each resumable setting says so in its declaration (`resumable=`); the derived table has the hand-written
    table's entries, no more, no fewer."""
    assert config_lib.RESUMABLE_FIELDS == RESUMABLE_BEFORE_ISSUE_80


def test_declaring_a_setting_resumable_is_all_it_takes():
    """`resumable=` on a setting (or a section) puts it in the derived table under its dotted name, wherever the
    declaring class sits in the tree (a section, an inline class); without it a field is not resumable; an
    unknown kind is refused where it is declared."""
    from poad_jax import declare

    @dataclasses.dataclass(frozen=True)
    class Inner:
        fast: bool = declare.setting(True, "a faster way to the same numbers", resumable="speed")
        exact: float = declare.setting(1.0, "a number the checkpoints depend on")

    @dataclasses.dataclass(frozen=True)
    class Spliced:
        steps: int = declare.setting(1, "how long", resumable="length")

    @dataclasses.dataclass(frozen=True)
    class Outer:
        inner: Inner = declare.section(Inner, "a section")
        devices: Inner = declare.section(Inner, "a whole section", resumable="layout")
        spliced: Spliced = declare.inline(Spliced, "settings at the top level")

    assert declare.resumable_settings(Outer) == {"inner.fast": "speed", "devices": "layout", "steps": "length"}
    with pytest.raises(ValueError, match="resumable must be one of length, outputs"):
        declare.setting(0, "a setting", resumable="fast")



def test_the_resume_paragraph_names_every_resumable_field():
    """docs/configuration.md's paragraph on what a re-run may change names each of `RESUMABLE_FIELDS`
    (the list grew in the code while the paragraph stood still once)."""
    text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    paragraph = next(p for p in text.split("\n\n") if "may change" in p and "config_changes.jsonl" in p)
    named = set(re.findall(r"`([a-z_.]+)`", paragraph))
    assert set(config_lib.RESUMABLE_FIELDS) - named == set()


def test_one_dotted_name_walker_names_the_closest_field():
    config = config_lib.default_config()
    node, last = config_lib.field_parent(config, "ppo.actor_lr")
    assert node is config.ppo and last == "actor_lr"
    with pytest.raises(config_lib.UnknownFieldError, match="did you mean ppo.actor_lr") as raised:
        config_lib.field_parent(config, "ppo.actor_lrr")
    assert (raised.value.parent, raised.value.missing) == ("ppo", "actor_lrr")
    with pytest.raises(config_lib.UnknownFieldError):
        config_lib.field_parent(config, "seed.x")  # a leaf has no fields


def test_the_trainers_learner_config_is_the_configs(tmp_path, monkeypatch):
    """train.run compiles its update with the LearnerConfig built from its config."""
    config = config_lib.load_config_file(REPO / "configs" / "toy.py")
    config.ppo.gamma, config.ppo.clip_eps, config.critic.kind = 0.9, 0.3, "lora"
    seen = {}

    def capture_update(graph, method, lconfig):
        seen["lconfig"] = lconfig
        raise _Stop

    monkeypatch.setattr(build, "jit_update", capture_update)
    with pytest.raises(_Stop):
        train.run(config, tmp_path / "w", show_progress=False)
    assert dataclasses.asdict(seen["lconfig"]) == expected_learner_fields(config)


# ---------------------------------------------------------------------------
# Config files.


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: pathlib.Path(p).name)
def test_every_config_file_starts_from_the_defaults_and_validates(path):
    config = config_lib.load_config_file(path)
    config_lib.validate(config)
    assert set(leaves(config)) == set(leaves(config_lib.default_config()))  # no field lost, none invented


def test_no_config_file_edits_sys_path():
    for path in (REPO / "configs").glob("*.py"):
        assert "sys.path" not in path.read_text(), path.name


@pytest.mark.parametrize("preset", PRESETS)
def test_a_preset_without_its_method_names_the_methods_instead_of_choosing_one(preset, tmp_path):
    with pytest.raises(config_lib.ConfigError, match=r":<method> with <method> one of poad, ntpo, twosome$"):
        config_lib.load_config_file(REPO / "configs" / preset)
    done = subprocess.run([sys.executable, "-m", "poad_jax.train", f"--config=configs/{preset}",
                           f"--workdir={tmp_path / 'w'}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and not (tmp_path / "w").exists()
    assert done.stderr.strip().splitlines() == [
        f"error: configs/{preset} holds one preset per method: name it, --config=configs/{preset}:<method> "
        "with <method> one of poad, ntpo, twosome"]


@pytest.mark.parametrize("method", ("poad", "twosome", "ntpo"))
def test_virtualhome_method_argument_gives_the_comparison_cell_of_that_method(method):
    """configs/virtualhome.py:<method> is the variant study C trains for that method (the README headline's
    settings): the same trainer config as the study's cell, up to the preset label and the run's name; and
    the file without an argument stays the base config every study B and C cell was trained from."""
    from poad_jax.tools.study import spec

    study = spec.load_study(REPO / "studies" / "virtualhome_compare.py")
    cells = [cell for cell in spec.grid(study) if cell.overrides["method"] == method and cell.seed == 0]
    assert len(cells) == 1
    cell = spec.cell_config(study, cells[0])
    argument = config_lib.load_config_file(REPO / "configs" / f"virtualhome.py:{method}")
    config_lib.validate(argument)
    assert argument.preset == f"configs/virtualhome.py:{method}" and argument.method == method
    differing = {field for field, value in leaves(argument).items() if leaves(cell)[field] != value}
    assert differing == {"preset"}, differing

    plain = config_lib.load_config_file(REPO / "configs" / "virtualhome.py")
    assert (plain.method, plain.preset, plain.restricted_sampling) == ("poad", "", "trie")
    with pytest.raises(config_lib.ConfigError, match=r"unknown method 'ppo' for configs/virtualhome.py; choose one"):
        config_lib.load_config_file(REPO / "configs" / "virtualhome.py:ppo")
    other = "ntpo" if method == "twosome" else "twosome"
    with pytest.raises(config_lib.ConfigError, match=f"configs/virtualhome.py:{other}"):
        argument.method = other
        config_lib.validate(argument)


def test_an_unknown_method_argument_is_one_line_naming_the_methods(tmp_path):
    done = subprocess.run([sys.executable, "-m", "poad_jax.train", "--config=configs/virtualhome.py:POAD",
                           f"--workdir={tmp_path / 'w'}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and not (tmp_path / "w").exists()
    assert done.stderr.strip().splitlines() == [
        "error: unknown method 'POAD' for configs/virtualhome.py; choose one of poad, twosome, ntpo"]


def test_config_files_load_from_another_working_directory(tmp_path):
    """By path, from elsewhere: the library's loader, and the CLI with an override (a bad one, so that the
    command stops at validation with one line instead of training)."""
    script = ("import sys\nfrom poad_jax.run import config\n"
              "for path in sys.argv[1:]:\n    config.validate(config.load_config_file(path))\nprint('ok')")
    done = subprocess.run([sys.executable, "-c", script, *map(str, CONFIG_FILES)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
    done = subprocess.run(
        [sys.executable, "-m", "poad_jax.train", f"--config={REPO / 'configs' / 'datasci_qwen.py'}",
         "--config.ppo.gamma=1.5", f"--workdir={tmp_path / 'w'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == "error: ppo.gamma must be in (0, 1], got 1.5"


# ---------------------------------------------------------------------------
# One validation.


def _a_breaking_value(check):
    """A value that breaks `check` (the first of a few candidates its rule refuses)."""
    if isinstance(check, config_lib.OneOf):
        return ("no_such_choice",) if check.many else "no_such_choice"
    for value in (-1, 0, -0.5, 1.5, 2, (), (0,)):
        try:
            if not check.ok(value):
                return value
        except TypeError:
            continue
    raise AssertionError(f"no candidate breaks {check.field}")


@pytest.mark.parametrize("check", config_lib.CHECKS, ids=lambda c: c.field)
def test_each_check_refuses_with_one_line_naming_its_field(check):
    config = config_lib.default_config()
    *parents, leaf = check.field.split(".")
    node = config
    for parent in parents:
        node = node[parent]
    with node.ignore_type():
        node[leaf] = _a_breaking_value(check)
    with pytest.raises(config_lib.ConfigError) as error:
        config_lib.validate(config)
    message = str(error.value)
    assert check.field in message and "\n" not in message, message


def test_validation_accepts_edge_values():
    config = config_lib.default_config()
    config.ppo.gamma, config.ppo.lam, config.gamma_w, config.sampling.top_p = 1.0, 0.0, 0.5, 1.0
    config.ppo.actor_lr = config.critic.target_update_every = config.sampling.top_k = config.prompt_bucket_step = 0
    config_lib.validate(config)
    config.prompt_bucket_step = 256  # one fine bucket
    config_lib.validate(config)


def test_the_samplers_logprobs_serve_truncated_sampling():
    """With top-k / top-p the sampler records the untruncated policy's log-probs (the learner's)."""
    config = config_lib.default_config()
    config.behaviour_logprobs = "sampler"
    config.sampling.top_k, config.sampling.top_p = 50, 0.9
    config_lib.validate(config)
    assert config_lib.sampling_config(config).logprobs_of == "policy"
    config.behaviour_logprobs = "recompute"
    assert config_lib.sampling_config(config).logprobs_of == "sampled"


@pytest.mark.parametrize("setting, phrase", [
    ({"method": "twosome"}, "token-level method"),
    ({"restricted_sampling": "action_scores"}, "restricted_sampling='trie'"),
    ({"ppo.behaviour_correction": "importance"}, "behaviour_logprobs='recompute'"),
])
def test_the_samplers_logprobs_are_refused_where_they_are_not_the_policys(setting, phrase):
    config = config_lib.default_config()
    config.behaviour_logprobs = "sampler"
    config_lib.validate(config)  # poad, no truncation, trie: accepted
    for dotted, value in setting.items():
        *parents, leaf = dotted.split(".")
        node = config
        for parent in parents:
            node = node[parent]
        node[leaf] = value
    with pytest.raises(config_lib.ConfigError) as error:
        config_lib.validate(config)
    assert "behaviour_logprobs='sampler'" in str(error.value) and phrase in str(error.value)
    assert "\n" not in str(error.value)


def test_a_config_missing_a_field_is_one_line():
    config = config_lib.default_config()
    del config["twosome_normalization"]
    with pytest.raises(config_lib.ConfigError, match="has no field twosome_normalization"):
        config_lib.validate(config)


@pytest.mark.long
@pytest.mark.parametrize(
    "override, line",
    [
        ("method=ppo", "unknown method 'ppo' (method); choose one of poad, ntpo, twosome, grpo, gigpo"),
        ("prompt_format=html", "prompt_format must be one of chat, raw, got 'html'"),
        ("ppo.epochs=0", "ppo.epochs must be >= 1, got 0 (0 epochs would train nothing)"),
        ("ppo.gamma=1.5", "ppo.gamma must be in (0, 1], got 1.5"),
        ("lora.targets=('x_proj',)",
         "lora.targets must be one or more of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, "
         "got ('x_proj',)"),
        ("ppo.num_minibatches=3", "num_threads x rollout_length (16) must be divisible by ppo.num_minibatches x "
                                  "ppo.accumulation_steps (3 x 1)"),
    ],
    ids=["named-choice", "choice", "lower-bound", "interval", "subset", "between-fields"],
)
def test_cli_refuses_a_bad_value_of_each_kind_in_one_line(tmp_path, override, line):
    done = subprocess.run(
        [sys.executable, "-m", "poad_jax.train", "--config=configs/toy.py", f"--config.{override}",
         f"--workdir={tmp_path / 'w'}"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert [text for text in done.stderr.splitlines() if text.strip()] == [f"error: {line}"]
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("seed", [0, 7])
def test_each_random_stream_of_a_run_has_its_own_key(seed):
    """The learner, the first rollout and a LoRA critic's fresh adapter draw from three different keys
    (the critic adapter once shared the rollout's), and the same seed gives the same keys."""
    import jax

    seeds = build.run_seeds(seed)
    keys = {name: tuple(jax.random.key_data(getattr(seeds, name)).tolist())
            for name in ("critic_lora", "learner", "rollout")}
    assert len(set(keys.values())) == 3, keys
    again = build.run_seeds(seed)
    assert all(tuple(jax.random.key_data(getattr(again, name)).tolist()) == key for name, key in keys.items())
