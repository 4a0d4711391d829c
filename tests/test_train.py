"""The trainer as a user runs it: resume, kill -9, bad configs, export, evaluate,
and a short real run on the embedded default model and task."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from poad_jax.tools import evaluate, export
from poad_jax.run import train
from poad_jax.run import cli as train_cli
from poad_jax.run import config as config_lib
from poad_jax.run.metrics import read_metrics

REPO = pathlib.Path(__file__).resolve().parents[1]




def short_toy_config(updates: int):
    config = config_lib.load_config_file(REPO / "configs" / "toy.py")
    config.total_env_steps = config.num_threads * config.rollout_length * updates
    config.tensorboard = False
    config.plot = False
    return config


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "poad_jax.train", *args],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
    )


def test_resume_equals_uninterrupted_training(tmp_path):
    whole = train.run(short_toy_config(4), tmp_path / "whole", show_progress=False)
    first = train.run(short_toy_config(4), tmp_path / "split", show_progress=False, max_updates=2)
    assert len(first.records) == 2
    resumed = train.run(short_toy_config(4), tmp_path / "split", show_progress=False)
    assert [r["update"] for r in resumed.records] == [1, 2, 3, 4]
    for a, b in zip(jax.tree.leaves(whole.state.params), jax.tree.leaves(resumed.state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for key in ("episode_return", "policy_loss", "value_loss", "approx_kl"):
        assert [r[key] for r in whole.records] == [r[key] for r in resumed.records], key


def test_resume_mid_episode_equals_uninterrupted_training(tmp_path, capsys):
    """Episodes of 3 steps against rollouts of 4: the checkpoint after update 2 has episodes in progress.
    The resumed run replays them (their actions, checked by the observation's digest, and their returns
    so far), so every update and every finished episode equals the uninterrupted run's."""
    def config():
        c = short_toy_config(5)
        c.env.kwargs.horizon = 3
        c.env.kwargs.rewarded = "red"  # so that the episodes in progress at the checkpoint have returns
        return c

    whole = train.run(config(), tmp_path / "whole", show_progress=False)
    train.run(config(), tmp_path / "split", show_progress=False, max_updates=2)
    meta = json.loads((tmp_path / "split" / "checkpoints" / "2" / "meta" / "metadata").read_text())
    assert any(meta["in_progress"]["actions"]) and any(meta["in_progress"]["returns"])
    resumed = train.run(config(), tmp_path / "split", show_progress=False)
    assert "did not replay" not in capsys.readouterr().err
    for a, b in zip(jax.tree.leaves(whole.state.params), jax.tree.leaves(resumed.state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for key in ("episodes", "episode_return", "policy_loss", "value_loss", "approx_kl"):
        assert [r.get(key) for r in whole.records] == [r.get(key) for r in resumed.records], key


def test_kill_minus_nine_then_resume(tmp_path):
    workdir = tmp_path / "killed"
    updates = 12
    args = ["--config=configs/toy.py", f"--workdir={workdir}", f"--config.total_env_steps={16 * updates}",
            "--config.tensorboard=False"]
    process = subprocess.Popen(
        [sys.executable, "-m", "poad_jax.train", *args], cwd=REPO,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    checkpoints = workdir / "checkpoints"
    deadline = time.time() + 240
    while time.time() < deadline:
        steps = [p for p in checkpoints.glob("*") if p.name.isdigit()] if checkpoints.exists() else []
        if steps and max(int(p.name) for p in steps) >= 2:
            break
        if process.poll() is not None:
            pytest.fail("training ended before it could be killed")
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    killed_at = len(read_metrics(workdir / "metrics.jsonl"))
    assert 2 <= killed_at < updates
    finished = cli(*args)
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert "resuming" in finished.stdout
    records = read_metrics(workdir / "metrics.jsonl")
    assert [r["update"] for r in records] == list(range(1, updates + 1))
    assert records[-1]["env_steps"] == 16 * updates


@pytest.mark.parametrize(
    "override, message",
    [
        ("--config.method=ppo", "unknown method"),
        ("--config.ppo.gamma=2.0", "ppo.gamma"),
        ("--config.env.name=nowhere/none", "unknown environment"),
        ("--config.model=/no/such/model", "/no/such/model"),
        ("--config.ppo.num_minibatches=3", "divisible"),
        ("--config.matmul_dtype=int8", "matmul_dtype must be one of"),
        ("--config.remat=sometimes", "remat must be one of"),
    ],
)
def test_bad_configs_fail_with_one_clear_line(tmp_path, override, message):
    config = config_lib.load_config_file(REPO / "configs" / "toy.py")
    key, value = override.removeprefix("--config.").split("=")
    node = config
    *parents, leaf = key.split(".")
    for parent in parents:
        node = node[parent]
    node[leaf] = type(node[leaf])(value) if not isinstance(node[leaf], str) else value
    with pytest.raises(train.TrainError, match=message.replace(".", r"\.")):
        train.run(config, tmp_path / "bad", show_progress=False)


def test_cli_prints_one_error_line(tmp_path):
    result = cli("--config=configs/toy.py", f"--workdir={tmp_path / 'w'}", "--config.method=ppo")
    assert result.returncode == 2
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert lines[-1].startswith("error: unknown method 'ppo'")
    assert "Traceback" not in result.stderr


def test_export_peft_and_evaluate(tmp_path, capsys):
    workdir = tmp_path / "run"
    result = train.run(short_toy_config(3), workdir, show_progress=False)
    out = tmp_path / "adapter"
    assert export.main(["--workdir", str(workdir), "--format", "peft", "--out", str(out)]) == 0
    tensors = load_file(str(out / "adapter_model.safetensors"))
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["lora_alpha"] == 16.0
    assert sorted(config["target_modules"]) == ["q_proj", "v_proj"]
    actor = result.state.params["actor"]
    a = np.asarray(actor["layers"]["lora_a"]["q_proj"][...])
    b = np.asarray(actor["layers"]["lora_b"]["q_proj"][...])
    for layer in range(a.shape[0]):
        prefix = f"base_model.model.model.layers.{layer}.self_attn.q_proj"
        np.testing.assert_array_equal(tensors[f"{prefix}.lora_A.weight"], a[layer].T)
        np.testing.assert_array_equal(tensors[f"{prefix}.lora_B.weight"], b[layer].T)
    assert len(tensors) == 2 * 2 * a.shape[0]  # (A, B) x (q, v) x layers

    assert evaluate.main(["--workdir", str(workdir), "--episodes", "2"]) == 0
    table = capsys.readouterr().out
    assert "toy/decisive_token" in table and "greedy" in table and "sampled" in table
    assert (workdir / "metrics.jsonl").exists()


def test_run_writes_logs_and_curves(tmp_path):
    config = short_toy_config(2)
    config.tensorboard = True
    config.plot = True
    train.run(config, tmp_path / "logged", show_progress=False)
    assert (tmp_path / "logged" / "curves.png").stat().st_size > 0
    assert any((tmp_path / "logged" / "tensorboard").iterdir())
    records = read_metrics(tmp_path / "logged" / "metrics.jsonl")
    assert len(records) == 2 and {"episode_return", "policy_loss", "compiles_learner"} <= set(records[0])


def test_a_run_that_does_not_learn_samples_what_a_run_at_actor_lr_zero_samples(tmp_path):
    """`learn=False` skips the behaviour pass and the learner, and nothing else: its env steps are those of
    the same run at actor lr 0 (same actions, rewards and episodes), its actor and critic stay as they were
    built (the lr-0 run's critic learns), its records carry no learner fields, its summary says so, and it
    resumes as a run that learns does."""
    from poad_jax.run import action_log

    def config(learn: bool):
        c = short_toy_config(3)
        c.ppo.actor_lr, c.learn, c.log_actions = 0.0, learn, True
        return c

    learning = train.run(config(True), tmp_path / "lr0", show_progress=False)
    train.run(config(False), tmp_path / "off", show_progress=False, max_updates=2)
    frozen = train.run(config(False), tmp_path / "off", show_progress=False)  # resumes for its third update
    assert [r["update"] for r in frozen.records] == [1, 2, 3] and (tmp_path / "off" / "finished.json").exists()

    def steps(workdir):
        return [(line["env_step"], line["action"], line["reward"], line["done"])
                for line in action_log.read_actions(workdir)]

    assert steps(tmp_path / "off") == steps(tmp_path / "lr0") and len(steps(tmp_path / "off")) == 3 * 16
    for a, b in zip(jax.tree.leaves(learning.state.params["actor"]), jax.tree.leaves(frozen.state.params["actor"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    built_head = train.run(config(False), tmp_path / "built", show_progress=False, max_updates=0).state.params["head"]
    for built, kept in zip(jax.tree.leaves(built_head), jax.tree.leaves(frozen.state.params["head"])):
        np.testing.assert_array_equal(np.asarray(built), np.asarray(kept))
    assert any(not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
               zip(jax.tree.leaves(built_head), jax.tree.leaves(learning.state.params["head"])))
    for record, learnt in zip(frozen.records, learning.records):
        assert not {"approx_kl", "policy_loss", "value_loss", "compiles_learner", "seconds_learner"} & set(record)
        for key in ("episode_return", "step_reward_mean", "actions_cut_off", "compiles_sampler", "flops_sampler"):
            assert record[key] == learnt[key], key
    summary = train_cli.summary_text(config(False), frozen)
    assert "3 updates without learning" in summary and "PPO updates" not in summary


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.xdist_group("embedded_models")  # on the worker that loads the models, one at a time (memory)
def test_short_real_run_on_embedded_smollm2(tmp_path):
    """A few env steps of the quick DataSciCoding preset: SmolLM2-135M-Instruct on datasci/balance_scale."""
    config = config_lib.load_config_file(REPO / "configs" / "datasci_smollm2.py")
    config.num_threads = 2
    config.rollout_length = 2
    config.total_env_steps = 4
    config.sampling.max_new_tokens = 24
    config.ppo.num_minibatches = 2
    config.env.kwargs = dict(config.env.kwargs, timeout_s=20.0)
    config.tensorboard = False
    result = train.run(config, tmp_path / "real", show_progress=False)
    record = result.records[-1]
    assert record["env_steps"] == 4
    assert record["compiles_learner"] == 1
    for key in ("policy_loss", "value_loss", "entropy", "approx_kl"):
        assert np.isfinite(record[key]), key
    assert (tmp_path / "real" / "curves.png").exists()
    summary = train_cli.summary_text(config, result)  # what the default job prints at its end
    assert "nan" not in summary.lower() and "of 4 programs ran" in summary and "best program:" in summary


def test_critic_lora_and_target_critic_run(tmp_path):
    """The critic-LoRA variant (a second adapter state on the same frozen base)
    and the target critic (hard copy every K updates) train end to end."""
    config = short_toy_config(3)
    config.critic.kind = "lora"
    config.critic.target_update_every = 2
    result = train.run(config, tmp_path / "critic_lora", show_progress=False)
    params = result.state.params
    assert set(params) == {"actor", "head", "critic_lora"}
    critic_b = np.asarray(params["critic_lora"]["layers"]["lora_b"]["q_proj"][...])
    actor_b = np.asarray(params["actor"]["layers"]["lora_b"]["q_proj"][...])
    assert np.any(critic_b != 0) and not np.array_equal(critic_b, actor_b)
    for record in result.records:
        assert np.isfinite(record["value_loss"]) and record["compiles_learner"] == 1


def test_all_virtualhome_expands_to_the_task_and_its_six_variants():
    names = evaluate.expand_env_names(["all-virtualhome"])
    variants = ("cheese", "hamburger", "apple_pie", "pizza", "washing_plate", "laundry")
    assert sorted(names) == sorted(["virtualhome/food_preparation"] + [f"virtualhome/food_preparation_{v}" for v in variants])


TASK_CONFIGS = sorted(p for p in (REPO / "configs").glob("*.py") if p.name not in ("__init__.py", "base.py"))


@pytest.mark.parametrize("path", TASK_CONFIGS, ids=lambda p: p.name)
def test_every_config_file_loads_and_validates(path):
    presets = ("virtualhome_paper.py", "overcooked_paper.py")  # one preset per method: name it
    for config in ([config_lib.load_config_file(f"{path}:{m}") for m in ("poad", "ntpo", "twosome")]
                   if path.name in presets else [config_lib.load_config_file(path)]):
        config_lib.validate(config)
    if path.name in ("datasci.py", "datasci_qwen.py"):  # the default job and the study's preset: the code model
        assert config.model == "qwen2.5-coder-0.5b-instruct" and config.sampling.max_new_tokens == 256
        # the default job chooses its numerics from the machine; the study's preset keeps those it ran with
        assert config.matmul_dtype == ("auto" if path.name == "datasci.py" else "bfloat16")
    if path.name.startswith("datasci"):
        assert config.env.name == config_lib.load_config_file(REPO / "configs" / "datasci.py").env.name
    if path.name == "datasci_smollm2.py":
        assert config.model == "smollm2-135m-instruct"


@pytest.mark.long
@pytest.mark.parametrize("method", ["poad", "ntpo", "twosome"])
def test_bfloat16_matmuls_run_every_method(tmp_path, method):
    """Sampler (free, trie-constrained, TWOSOME scoring) and learner compile and run with
    bfloat16 matmuls; XLA:CPU fails at run time on a bfloat16 matmul it cannot place."""
    config = short_toy_config(1)
    config.method = method
    config.matmul_dtype = "bfloat16"
    result = train.run(config, tmp_path / method, show_progress=False)
    record = result.records[-1]
    assert record["compiles_learner"] == 1
    for key in ("policy_loss", "value_loss", "entropy", "approx_kl"):
        assert np.isfinite(record[key]), key


def test_virtualhome_runs_on_a_tokenizer_whose_actions_prefix_each_other(tmp_path):
    """tiny-random's small vocabulary splits VirtualHome's actions so that some prefix others
    ("... pan" / "... pancake"); the token-level methods then end every action on the EOS token
    (`rollout.ended_where_prefixes`; NTPO shares the token-level path) instead of failing in the trie
    builder."""
    config = config_lib.load_config_file(REPO / "configs" / "virtualhome.py")
    config.method = "poad"
    config.model = "tiny-random"
    config.num_threads, config.rollout_length = 2, 4
    config.total_env_steps = 8
    config.tensorboard = config.plot = False
    record = train.run(config, tmp_path / "run", show_progress=False).records[-1]
    assert record["env_steps"] == 8 and np.isfinite(record["policy_loss"])


def test_twosome_with_one_row_per_loss_chunk_warns_and_gets_no_policy_gradient(tmp_path, capsys):
    """The authors' per-chunk advantage normalisation with one row per chunk zeroes TWOSOME's
    advantages: the trainer warns, and with no entropy bonus the actor's gradient is exactly 0; two
    rows per chunk: no warning, and the actor moves."""
    norms = {}
    for rows_per_chunk in (1, 2):
        config = short_toy_config(2)
        config.method = "twosome"
        config.ppo.advantage_normalization = "adrl"
        config.ppo.ent_coef = 0.0
        rows = config.num_threads * config.rollout_length // config.ppo.num_minibatches
        config.ppo.loss_chunks = rows // rows_per_chunk
        capsys.readouterr()
        result = train.run(config, tmp_path / str(rows_per_chunk), show_progress=False)
        warned = "every TWOSOME advantage will be 0" in capsys.readouterr().err
        assert warned == (rows_per_chunk == 1)
        norms[rows_per_chunk] = [record["actor_grad_norm"] for record in result.records]
    assert all(norm == 0 for norm in norms[1]) and all(norm > 0 for norm in norms[2]), norms
