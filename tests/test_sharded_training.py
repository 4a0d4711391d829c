"""`python -m poad_jax.train --config.mesh.data=2` end to end, on two host CPU devices.

The sharded pieces are checked one by one against one device in
tests/test_sharding.py; this runs the trainer itself on a mesh, as the README
tells a user to: it must train, log the same first updates as the one-device
path (to float reordering: the rows' sums run per device), resume from its
own checkpoint, and refuse a mesh the devices cannot hold in one line.
Each run is its own process (the device count is fixed when JAX starts).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.long  # the suite's second tier (scripts/test.sh --long)

REPO = pathlib.Path(__file__).resolve().parents[1]
TWO_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}


def train(workdir: pathlib.Path, *overrides: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "poad_jax.train", f"--config={REPO / 'configs' / 'toy.py'}", f"--workdir={workdir}",
               "--config.tensorboard=False", "--config.plot=False", *overrides]
    return subprocess.run(command, cwd=workdir.parent, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


def records(workdir: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_training_on_a_data_parallel_mesh_matches_one_device_and_resumes(tmp_path):
    on_mesh, alone = tmp_path / "mesh", tmp_path / "one"
    result = train(on_mesh, "--config.mesh.data=2", "--config.total_env_steps=32", env=TWO_DEVICES)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "mesh: data 2 x fsdp 1 x tensor 1 over 2 cpu devices" in result.stdout
    result = train(alone, "--config.total_env_steps=32", env=TWO_DEVICES)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "mesh:" not in result.stdout  # mesh 1 x 1 x 1: today's one-device path
    sharded, single = records(on_mesh), records(alone)
    assert [r["update"] for r in sharded] == [r["update"] for r in single] == [1, 2]
    for a, b in zip(sharded, single):
        assert a["env_steps"] == b["env_steps"] and a["episode_return"] == b["episode_return"]  # same actions
        for key in ("loss", "entropy", "policy_loss", "actor_grad_norm"):
            # float32 sums in another order per device: agreement to ~1e-4 relative, not bits
            np.testing.assert_allclose(a[key], b[key], rtol=2e-3, atol=1e-7, err_msg=key)
    result = train(on_mesh, "--config.mesh.data=2", "--config.total_env_steps=48", env=TWO_DEVICES)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming" in result.stdout and [r["update"] for r in records(on_mesh)] == [1, 2, 3]


def test_training_on_an_fsdp_mesh_matches_one_device(tmp_path):
    """`--config.mesh.fsdp=2`: the base split over two devices, rows pinned per layer (FSDP as
    ZeRO-3) in both the behaviour statistics and the update: the same actions and first updates
    as one device, to float reordering."""
    on_mesh, alone = tmp_path / "fsdp", tmp_path / "one"
    for workdir, overrides in ((on_mesh, ("--config.mesh.fsdp=2",)), (alone, ())):
        result = train(workdir, *overrides, "--config.total_env_steps=32", env=TWO_DEVICES)
        assert result.returncode == 0, result.stderr[-3000:]
    sharded, single = records(on_mesh), records(alone)
    assert [r["update"] for r in sharded] == [r["update"] for r in single] == [1, 2]
    for a, b in zip(sharded, single):
        assert a["env_steps"] == b["env_steps"] and a["episode_return"] == b["episode_return"]
        for key in ("loss", "entropy", "policy_loss", "actor_grad_norm"):
            np.testing.assert_allclose(a[key], b[key], rtol=2e-3, atol=1e-7, err_msg=key)
        # approx KL (~4e-5 here) is a mean of squared log-ratio differences: log-prob rounding of
        # ~1e-7 per token moves it by ~2e-7, so an absolute bound
        np.testing.assert_allclose(a["approx_kl"], b["approx_kl"], rtol=0, atol=1e-6, err_msg="approx_kl")

def test_a_mesh_the_devices_cannot_hold_is_one_line_and_writes_nothing(tmp_path):
    workdir = tmp_path / "run"
    result = train(workdir, "--config.mesh.data=2")  # one device visible
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: mesh {'data': 2, 'fsdp': 1, 'tensor': 1} needs 2 devices; 1 are visible "
        "(on CPU set XLA_FLAGS=--xla_force_host_platform_device_count=N before JAX starts)"]
    assert not workdir.exists()
    result = train(workdir, "--config.mesh.data=3", env={"XLA_FLAGS": "--xla_force_host_platform_device_count=3"})
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "error: num_threads (4) must be divisible by mesh.data x mesh.fsdp (3 x 1): each device holds whole "
        "rollout threads"]
