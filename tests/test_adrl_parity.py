"""One PPO update of poad_jax equals one of the authors' trainer (ADRL), case by case.

The cases (tests/fixtures/adrl_update_cases.npz) were written by
scripts/reference/adrl_update_cases.py from ADRL's own agent, buffer and
trainers (commit 5ec1aa5, CPU, float32); docs/adrl_parity.md has the format
and the command that regenerates them.  Every comparison is against what
their code computed, never against numbers written here.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from poad_jax.bench import adrl_parity

CASES = pathlib.Path(__file__).parent / "fixtures" / "adrl_update_cases.npz"


@pytest.fixture(scope="module")
def arrays():
    loaded, names = adrl_parity.load_cases(CASES)
    assert names == ["ntpo", "poad", "twosome"]
    return loaded


@pytest.mark.parametrize("name", ["poad", "ntpo", "twosome"])
def test_one_update_equals_the_authors_update(arrays, name):
    """Backup, per-minibatch losses / entropy / KL / skip decision, gradients before clipping
    (<= 1e-4 relative per tensor) and weight changes (<= 1e-3) all match ADRL's."""
    rows = adrl_parity.check_case(arrays, name)
    failed = [row for row in rows if not row["ok"]]
    assert not failed, failed
    fields = {row["field"] for row in rows}
    assert {"advantages", "policy_objective", "value_loss", "entropy", "approx_kl", "skipped"} <= fields
    assert sum(f.startswith("grad ") for f in fields) == 7 and sum(f.startswith("delta ") for f in fields) == 7


def test_the_cases_cover_every_condition_the_harness_must_check(arrays):
    """From the cases' own data: a minibatch that trips the KL skip (and one that does not),
    exact-zero advantages, value clipping, gradient clipping, several epochs, multi-token
    actions, an episode ending inside the batch, more than one loss chunk."""
    covered = {}
    for name in ("poad", "ntpo", "twosome"):
        for condition, present in adrl_parity.coverage(arrays, name).items():
            covered[condition] = covered.get(condition, False) or present
    assert all(covered.values()), covered
    assert adrl_parity.coverage(arrays, "poad")["zero_advantages"]  # where the non-zero normalisation matters


def test_our_default_semantics_do_not_reproduce_the_authors_update(arrays):
    """The harness tells the semantics apart: with poad_jax's defaults (whole-update KL skip,
    advantages over valid tokens, one loss chunk) the POAD case's gradients differ."""
    rows = adrl_parity.check_case(arrays, "poad", semantics="ours")
    assert any(not row["ok"] for row in rows if row["field"].startswith("grad "))


def test_the_command_exits_1_above_tolerance_and_2_for_a_non_case_file(arrays, tmp_path, capsys):
    tampered = dict(arrays)
    key = "ntpo/grads/lora_b/v_proj"
    tampered[key] = arrays[key] * 1.001  # 1e-3 relative: ten times the tolerance
    tampered = {k: v for k, v in tampered.items() if not k.startswith(("poad/", "twosome/"))}
    path = tmp_path / "tampered.npz"
    np.savez(path, **tampered)
    assert adrl_parity.main([f"--cases={path}"]) == 1
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["ok"] is False and last["cases"] == ["ntpo"]
    (tmp_path / "not.npz").write_text("not a case file")
    assert adrl_parity.main([f"--cases={tmp_path / 'not.npz'}"]) == 2
    assert "not a .npz case file" in capsys.readouterr().err


def test_the_update_is_timed_on_the_cases_rows_beside_the_authors_recorded_time(arrays):
    timed = adrl_parity.time_update(arrays, "poad", repeats=2)
    assert timed["ours"] > 0 and timed["rows"] == len(arrays["poad/prompts"])
    assert timed["theirs"] is None  # the committed cases predate the recorded time
    assert "not in this case file" in adrl_parity.timing_line("poad", timed)
    with_theirs = {**dict(arrays), "poad/seconds_update": np.array(3.0), "poad/torch_threads": np.array(2)}
    timed = adrl_parity.time_update(with_theirs, "poad", repeats=1)
    line = adrl_parity.timing_line("poad", timed)
    assert timed["theirs"] == 3.0 and f"{3.0 / timed['ours']:.2f}x" in line and "2 torch threads" in line
