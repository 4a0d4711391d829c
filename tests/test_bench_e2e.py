"""`python -m poad_jax.bench e2e`: the second side's arguments of `--versus=...`, and the roofline figures."""

from __future__ import annotations

import pytest

from poad_jax.bench.e2e import roofline, versus_argv


def test_versus_appends_overrides_and_drops_side_by_side_flags():
    argv = ["--config=configs/virtualhome.py", "--versus=config.method=twosome", "--updates=2", "--rounds=3"]
    assert versus_argv(argv, "config.method=twosome, share_prompt=false") == [
        "--config=configs/virtualhome.py", "--updates=2", "--config.method=twosome", "--share_prompt=false"]


def test_versus_items_must_be_key_value():
    with pytest.raises(ValueError, match="key=value"):
        versus_argv(["--updates=2"], "config.method")


def roofline_records(with_flops=True):
    """Two updates of 10 env steps: sampling 1 s, behaviour 1 s, learner 2 s, 4 s in all."""
    record = {"steps_this_update": 10, "seconds_wall": 4.0, "seconds_sampling": 1.0, "seconds_behaviour": 1.0,
              "seconds_learner": 2.0}
    if with_flops:
        record.update(flops_sampler=1e9, flops_behaviour=2e9, flops_learner=5e9)
    return [dict(record), dict(record)]


def test_roofline_is_flops_per_env_step_against_the_matmul_throughput():
    roof = roofline(roofline_records(), matmul_gflops=2.0)
    assert roof["gflop_per_env_step"] == pytest.approx(16 / 20)  # 2 x 8 GFLOP over 20 env steps
    assert roof["percent"] == pytest.approx(100 * (16 / 8) / 2.0)  # 16 GFLOP in 8 s, at 2 GFLOP/s
    by_phase = {phase: v["percent"] for phase, v in roof["by_phase"].items()}
    assert by_phase == pytest.approx({"sampling": 50.0, "behaviour": 100.0, "learner": 125.0})
    assert roof["by_phase"]["learner"]["gflop_per_env_step"] == pytest.approx(10 / 20)


def test_roofline_needs_flop_counts():
    assert roofline(roofline_records(with_flops=False), matmul_gflops=2.0) is None
