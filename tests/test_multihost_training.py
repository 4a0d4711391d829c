"""`python -m poad_jax.train` over two processes on this machine, as the
README's "Several hosts" tells a user to start it on two hosts.

Two processes (`--config.distributed.coordinator=127.0.0.1:<port>`, gloo CPU
collectives, one host CPU device each) form one data-parallel mesh of two
devices; each steps half of the rollout threads.  What must hold, since each
process samples with its own noise (so the run is not the one-process run):
both exit 0; process 0 alone writes the run's files; the log counts the whole
run's env steps and episodes (gathered over processes); the two processes'
episodes differ; and the checkpoint they save together resumes in one
process.  The pure pieces (agreed batch shapes, merged episode histories,
per-process checkpoint records, the config's checks) are tested in-process.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from poad_jax.run import config as config_lib
from poad_jax.run import resume
from poad_jax.agent.methods import make_method
from poad_jax.agent.episodes import merge_episode_states
from poad_jax.agent.rollout import StepRecord
from poad_jax.agent.experience import pack_batch, pack_batch_agreed
from test_sharded_training import REPO, records
from test_sharding_multiprocess import _free_port

# One xdist worker runs every test of this module (`--dist loadgroup`, scripts/test.sh): its module
# fixture, minutes of training or of subprocesses, is then set up once per suite, not once per worker.
pytestmark = [pytest.mark.xdist_group("multihost_training"), pytest.mark.long]

THREADS, STEPS, UPDATES = 4, 8, 2
ONE_DEVICE = "--xla_force_host_platform_device_count=1"


def _command(workdir: pathlib.Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "poad_jax.train", f"--config={REPO / 'configs' / 'toy.py'}", f"--workdir={workdir}",
            "--config.plot=False", f"--config.num_threads={THREADS}", f"--config.rollout_length={STEPS}",
            "--config.sampling.temperature=10.0",  # near-uniform doors: the tiny model nearly always picks one at 1
            "--config.mesh.data=-1", *overrides]


def _environment(devices_flag: str) -> dict[str, str]:
    return {**os.environ, "XLA_FLAGS": devices_flag, "JAX_PLATFORMS": "cpu",
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _meta(workdir: pathlib.Path, step: int) -> dict:
    return json.loads((workdir / "checkpoints" / str(step) / "meta" / "metadata").read_text())


def _two_processes(workdir: pathlib.Path, *overrides: str, mesh: str = "--config.mesh.data=-1",
                   devices: str = ONE_DEVICE):
    """Both processes' (return code, stdout, stderr) of the same command (one CPU device each by default)."""
    port = _free_port()
    procs = [subprocess.Popen([arg for arg in _command(workdir, *overrides) if arg != "--config.mesh.data=-1"]
                              + [mesh, f"--config.distributed.coordinator=127.0.0.1:{port}",
                                 "--config.distributed.num_processes=2", f"--config.distributed.process_id={rank}"],
                              cwd=workdir.parent, env=_environment(devices), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    outputs = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=400)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        outputs.append((proc.returncode, out, err))
    return outputs


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    """Both processes' (return code, stdout + stderr) and the run directory they share."""
    workdir = tmp_path_factory.mktemp("multihost") / "run"
    outputs = _two_processes(workdir, f"--config.total_env_steps={THREADS * STEPS * UPDATES}")
    return workdir, [(rc, out + err) for rc, out, err in outputs]


def test_two_processes_train_and_only_process_zero_writes(two_process_run):
    workdir, ((rc0, out0), (rc1, out1)) = two_process_run
    assert rc0 == 0 and rc1 == 0, (out0[-3000:], out1[-3000:])
    assert "mesh: data 2 x fsdp 1 x tensor 1 over 2 cpu devices in 2 processes" in out0
    assert "run directory:" in out0
    assert "mesh:" not in out1 and "run directory:" not in out1 and "step/s" not in out1  # no prints, no tqdm
    logged = records(workdir)
    assert [r["update"] for r in logged] == [1, 2]  # one writer: two processes appending would log four
    assert len(list((workdir / "tensorboard").iterdir())) == 1  # one event file, process 0's
    assert json.loads((workdir / "config.json").read_text())["distributed"]["process_id"] == 0
    assert (workdir / "finished.json").exists()


def test_the_log_counts_the_whole_run_and_the_processes_sample_differently(two_process_run):
    workdir, _ = two_process_run
    logged = records(workdir)
    per_update = THREADS * STEPS
    assert [r["env_steps"] for r in logged] == [per_update, 2 * per_update]
    horizon = 2  # configs/toy.py: every thread ends an episode every 2 steps
    assert [r["episodes"] for r in logged] == [THREADS * STEPS // horizon, 2 * THREADS * STEPS // horizon]
    for record in logged:
        assert all(np.isfinite(record[k]) for k in ("loss", "entropy", "approx_kl", "actor_grad_norm"))
        assert record["compiles_learner"] == 1
    meta = _meta(workdir, UPDATES)
    first, second = (host["episodes"] for host in meta["hosts"])
    assert len(meta["hosts"]) == 2 and len(meta["episode_counters"]) == THREADS
    assert first["steps"] == second["steps"] == STEPS * UPDATES * THREADS // 2
    assert meta["episodes"]["steps"] == THREADS * STEPS * UPDATES
    # Each process's own sampling noise: with the same key both would take the
    # same actions (the toy env ignores its seed) and finish identical episodes.
    # 16 episodes of return 0, 1 or 2 agreeing by chance: well under 1e-4.
    assert len(first["finished_returns"]) == len(second["finished_returns"]) == STEPS * UPDATES
    assert first["finished_returns"] != second["finished_returns"]
    assert meta["hosts"][0]["numpy_rng"] != meta["hosts"][1]["numpy_rng"]
    # Episodes merged in env-step order: the order of one process stepping all threads.
    ends = meta["episodes"]["finished_env_steps"]
    assert ends == sorted(ends) and len(set(ends)) == len(ends)


def test_processes_of_two_devices_sample_their_threads_on_their_own_devices(two_process_run, tmp_path):
    """Two devices per process: the run's mesh spans all four, and each process
    samples its threads on a mesh of its own two (rows over them). Sampled tokens
    do not depend on the mesh (tests/test_sharded_sampling.py), so every
    process's first update finishes the same episodes as in the one-device-each
    run: 8 returns of 0, 1 or 2 per process agreeing by chance is unlikely."""
    workdir = tmp_path / "run"
    outputs = _two_processes(workdir, f"--config.total_env_steps={THREADS * STEPS}",
                             devices="--xla_force_host_platform_device_count=2")
    (rc0, out0, err0), (rc1, _, err1) = outputs
    assert rc0 == 0 and rc1 == 0, (err0[-3000:], err1[-3000:])
    assert "over 4 cpu devices in 2 processes (each samples on its 2 devices)" in out0
    per_update = STEPS * (THREADS // 2) // 2  # episodes one process finishes in one update (horizon 2)
    ours = [host["episodes"]["finished_returns"] for host in _meta(workdir, 1)["hosts"]]
    theirs = [host["episodes"]["finished_returns"][:per_update] for host in _meta(two_process_run[0], UPDATES)["hosts"]]
    assert [len(r) for r in ours] == [per_update, per_update]
    assert ours == theirs

def test_the_checkpoint_of_two_processes_resumes_in_one(two_process_run, tmp_path):
    """The same command in one process (two devices, the same mesh) continues
    the two-process run: it restores the state both saved, keeps its log and
    episode history, and logs update 3."""
    workdir, _ = two_process_run
    before = records(workdir)
    result = subprocess.run(_command(workdir, f"--config.total_env_steps={THREADS * STEPS * (UPDATES + 1)}"),
                            cwd=workdir.parent, env=_environment("--xla_force_host_platform_device_count=2"),
                            capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resuming {workdir} from update {UPDATES} ({THREADS * STEPS * UPDATES} env steps)" in result.stdout
    after = records(workdir)
    assert after[:UPDATES] == before and [r["update"] for r in after] == [1, 2, 3]
    assert after[-1]["env_steps"] == THREADS * STEPS * (UPDATES + 1)
    assert after[-1]["episodes"] == before[-1]["episodes"] + THREADS * STEPS // 2  # the history carried over
    assert "hosts" not in _meta(workdir, UPDATES + 1)


def test_two_processes_without_a_mesh_are_one_line_and_write_nothing(tmp_path):
    workdir = tmp_path / "run"
    for rc, out, err in _two_processes(workdir, mesh="--config.mesh.data=1"):
        assert rc == 2 and "Traceback" not in err, err[-3000:]
        assert err.strip().splitlines()[-1] == (
            "error: 2 processes need a mesh over their devices: set mesh.data=-1 (data parallel over all 2 devices) "
            "or another mesh")
    assert not workdir.exists()


# ---------------------------------------------------------------------------
# The pieces, in this process.


def _records(rng: np.random.Generator, threads: int, steps: int, prompt_len: int, candidates: int,
             action_len: int) -> list[list[StepRecord]]:
    """records[t][b] of a restricted env: random prompts and candidate actions, one chosen."""
    out = []
    for _ in range(steps):
        row = []
        for _ in range(threads):
            cands = [list(rng.integers(3, 50, size=rng.integers(1, action_len + 1))) for _ in range(candidates)]
            choice = int(rng.integers(candidates))
            row.append(StepRecord(list(rng.integers(3, 50, size=rng.integers(1, prompt_len + 1))), cands[choice],
                                  float(rng.random()), bool(rng.random() < 0.3), cands,
                                  [f"action {k}" for k in range(candidates)], choice))
        out.append(row)
    return out


@pytest.mark.parametrize("method_name", ["poad", "twosome"])
def test_agreed_shapes_give_the_rows_one_process_would_pack(method_name):
    """Two processes' rows differ in prompt length, action length and number of
    candidates; after agreeing, each process's arrays are exactly its rows of
    packing every thread in one process (trie width and TWOSOME candidates
    padded as the schemes pad them)."""
    rng = np.random.default_rng(0)
    method = make_method(method_name, 0.95)
    config = config_lib.rollout_config(config_lib.default_config(), (1,))
    short = _records(rng, 2, 3, prompt_len=10, candidates=2, action_len=3)
    long = _records(rng, 2, 3, prompt_len=70, candidates=5, action_len=12)
    nexts = ([list(rng.integers(3, 50, size=5)) for _ in range(2)], [list(rng.integers(3, 50, size=40))
                                                                    for _ in range(2)])
    together, together_next = pack_batch([a + b for a, b in zip(short, long)], nexts[0] + nexts[1], method, config, 0)
    sent = {}
    pack_batch_agreed(long, nexts[1], method, config, 0, lambda v: sent.setdefault("long", v))
    pack_batch_agreed(short, nexts[0], method, config, 0, lambda v: sent.setdefault("short", v))
    halves = {"short": (short, nexts[0], slice(0, 6), slice(0, 2)), "long": (long, nexts[1], slice(6, 12), slice(2, 4))}
    for name, (steps, next_prompts, rows, threads) in halves.items():
        other = sent["long" if name == "short" else "short"]
        arrays, next_arrays = pack_batch_agreed(steps, next_prompts, method, config, 0,
                                                lambda v, other=other: np.maximum(v, other))
        assert sorted(arrays) == sorted(together)
        for key in together:
            np.testing.assert_array_equal(arrays[key], together[key][rows], err_msg=f"{name} {key}")
        for key in together_next:
            np.testing.assert_array_equal(next_arrays[key], together_next[key][threads], err_msg=f"{name} {key}")
    alone, _ = pack_batch(short, nexts[0], method, config, 0)
    assert alone["tokens"].shape[-1] < together["tokens"].shape[-1]  # the short half did have to grow


def test_merged_episode_history_is_in_env_step_order():
    first = {"finished_returns": [1.0, 2.0], "finished_success": [True, False], "finished_env_steps": [3, 9],
             "steps": 8, "succeeded_steps": 1, "reward_sum": 3.0, "success_reward_sum": 1.0,
             "best_success_reward": 1.0, "failure_kinds": {"NameError": 2}}
    second = {"finished_returns": [5.0], "finished_success": [True], "finished_env_steps": [5], "steps": 8,
              "succeeded_steps": 2, "reward_sum": 5.0, "success_reward_sum": 5.0, "best_success_reward": 5.0,
              "failure_kinds": {"NameError": 1, "other": 1}}
    merged = merge_episode_states([first, second])
    assert merged["finished_returns"] == [1.0, 5.0, 2.0] and merged["finished_env_steps"] == [3, 5, 9]
    assert merged["finished_success"] == [True, True, False]
    assert (merged["steps"], merged["succeeded_steps"], merged["reward_sum"]) == (16, 3, 8.0)
    assert merged["best_success_reward"] == 5.0 and merged["failure_kinds"] == {"NameError": 3, "other": 1}
    assert merge_episode_states([first]) is first


def test_each_process_takes_its_part_of_a_checkpoint_record():
    meta = {"episode_counters": [1, 2, 3, 4], "episodes": {"steps": 16}, "numpy_rng": {"n": 0},
            "hosts": [{"episodes": {"steps": 8}, "numpy_rng": {"n": 0}}, {"episodes": {"steps": 8},
                                                                          "numpy_rng": {"n": 1}}]}
    assert resume.host_meta(meta, 1, 2, 2, 2) == ([3, 4], {"steps": 8}, {"n": 1})  # the layout that wrote it
    assert resume.host_meta(meta, 0, 1, 0, 4) == ([1, 2, 3, 4], {"steps": 16}, None)  # 2 -> 1: merged history
    single = {key: meta[key] for key in ("episode_counters", "episodes", "numpy_rng")}
    assert resume.host_meta(single, 0, 1, 0, 4) == ([1, 2, 3, 4], {"steps": 16}, {"n": 0})
    assert resume.host_meta(single, 1, 2, 2, 2) == ([3, 4], {}, None)  # 1 -> 2: process 0 keeps the history


@pytest.mark.parametrize("fields, message", [
    ({"distributed.coordinator": "node0"},
     "distributed.coordinator must be '', 'auto' or host:port, got 'node0' (process 0's address; '' runs one process)"),
    ({"distributed.coordinator": "node0:1234", "distributed.num_processes": 2, "distributed.process_id": 2},
     "distributed.process_id (2) must be below distributed.num_processes (2): processes are numbered from 0"),
    ({"distributed.num_processes": 2},
     "distributed.num_processes is 2 but distributed.coordinator is empty: set it to process 0's host:port "
     "(or 'auto' on SLURM / Open MPI)"),
    ({"distributed.coordinator": "node0:1234", "distributed.num_processes": 3},
     "num_threads (4) must be divisible by distributed.num_processes (3): each process steps an equal share of "
     "the rollout threads"),
])
def test_distributed_mistakes_are_one_line(fields, message):
    config = config_lib.default_config()
    for dotted, value in fields.items():
        block, name = dotted.split(".")
        config[block][name] = value
    with pytest.raises(config_lib.ConfigError) as error:
        config_lib.validate(config)
    assert str(error.value) == message
