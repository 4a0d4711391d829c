"""`bench logprob_gap`: the sampler's recorded log-probs line up with the behaviour pass's, row by row."""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
import pytest

from poad_jax.agent.rollout import StepRecord
from poad_jax.bench import logprob_gap

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_ratio_gaps_are_the_first_ratios_distance_from_one():
    behaviour = np.array([[-1.0, -2.0], [-0.5, 0.0]], np.float32)
    sampled = np.array([[-1.0, -2.5], [-0.4, 7.0]], np.float32)
    valid = np.array([[True, True], [True, False]])
    expected = np.abs(np.exp(np.array([0.0, 0.5, -0.1])) - 1.0)
    np.testing.assert_allclose(logprob_gap.ratio_gaps(behaviour, sampled, valid), expected, rtol=1e-6)


def test_sampler_logprobs_are_packed_thread_major_like_the_batch():
    # steps[t][b]: two steps of two threads; pack_batch's rows are thread-major (b, then t).
    steps = [[StepRecord([1], [5, 6], 0.0, False, sampler_logprobs=[-0.1, -0.2]),
              StepRecord([1], [7], 0.0, False, sampler_logprobs=[-0.3])],
             [StepRecord([1], [8], 0.0, False, sampler_logprobs=None),
              StepRecord([1], [9, 9, 9], 0.0, False, sampler_logprobs=[-0.4, -0.5, -0.6])]]
    values, known = logprob_gap.packed_sampler_logprobs(steps, action_len=4)
    np.testing.assert_array_equal(known, [[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]])
    np.testing.assert_allclose(values[known], [-0.1, -0.2, -0.3, -0.4, -0.5, -0.6])


@pytest.mark.parametrize("perturb", [0.0, 0.05])
def test_float32_rollouts_give_first_ratios_of_one_up_to_rounding(perturb, capsys, monkeypatch):
    """A whole rollout of the toy config in float32: every sampled token's cached-decode log-prob is the
    behaviour pass's to rounding (a row or token out of line would be off by O(1))."""
    monkeypatch.chdir(REPO)
    argv = ["--config=configs/toy.py", "--config.matmul_dtype=float32", "--rollouts=1", f"--perturb_lora={perturb}"]
    monkeypatch.setattr(sys, "argv", ["poad_jax.bench", "logprob_gap", *argv])  # config_flags reads overrides there
    status = logprob_gap.main(argv)
    assert status == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["bench"] == "logprob_gap" and result["matmul_dtype"] == "float32"
    assert result["tokens"] >= 16  # 4 threads x 4 steps, at least one token each
    assert result["max"] < 1e-4, result


def test_twosome_is_refused_with_one_line(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    argv = ["--config=configs/toy.py", "--config.method=twosome"]
    monkeypatch.setattr(sys, "argv", ["poad_jax.bench", "logprob_gap", *argv])
    assert logprob_gap.main(argv) == 2
    assert "token-level" in capsys.readouterr().err
