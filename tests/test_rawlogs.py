"""Raw logs stored gzipped (`python -m poad_jax.tools.rawlogs pack DIR`, docs/results/raw/README.md).

- Every reader reads a packed log as the plain one: `read_metrics` (a line cut by a kill skipped alike),
  `read_actions`, a study's cell records, and a whole study report (tables and figures byte for byte).
- Packing is deterministic and reversible (`gzip -d` gives the text back), leaves the small files and
  follows no symlink; a run resumed over a packed log goes on with it plain; a fresh run clears it.
- docs/results/raw holds no plain JSON-lines log and no plain file over the limit.
"""

from __future__ import annotations

import gzip
import json
import pathlib
import subprocess
import sys

from poad_jax.run import action_log, logfiles, metrics, rundir
from poad_jax.tools import rawlogs
from poad_jax.tools.study import report, scheduler, spec
from test_study import _fake_cell, write_study

REPO = pathlib.Path(__file__).resolve().parents[1]
RAW = REPO / "docs" / "results" / "raw"
RECORDS = [{"update": u, "env_steps": 16 * u, "episodes": u, "episode_return": 0.25 * u, "success_rate": 0.5}
           for u in (1, 2, 3)]


def metrics_text(records: list[dict], cut: str = "") -> str:
    return "".join(json.dumps(r) + "\n" for r in records) + cut


def test_a_packed_metrics_log_reads_as_the_plain_one(tmp_path):
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    for directory in (plain, packed):
        directory.mkdir()
        (directory / "metrics.jsonl").write_text(metrics_text(RECORDS, cut='{"update": 4, "env_st'))
    rawlogs.pack(packed)
    assert not (packed / "metrics.jsonl").exists() and (packed / "metrics.jsonl.gz").is_file()
    read = metrics.read_metrics(packed / "metrics.jsonl")
    assert read == metrics.read_metrics(plain / "metrics.jsonl") == RECORDS
    assert scheduler.read_records(packed) == RECORDS
    assert metrics.read_metrics(tmp_path / "none" / "metrics.jsonl") == []


def test_the_plain_log_is_the_log_where_both_lie_beside_each_other(tmp_path):
    (tmp_path / "metrics.jsonl.gz").write_bytes(rawlogs.gzipped(metrics_text(RECORDS).encode()))
    (tmp_path / "metrics.jsonl").write_text(metrics_text(RECORDS[:1]))
    assert metrics.read_metrics(tmp_path / "metrics.jsonl") == RECORDS[:1]
    assert logfiles.stored_log(tmp_path / "metrics.jsonl") == tmp_path / "metrics.jsonl"


def test_packed_actions_read_as_the_plain_ones(tmp_path):
    lines = [{"update": 1, "env_step": s, "action": f"walk {s}"} for s in (1, 2)]
    (tmp_path / "actions.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    plain = action_log.read_actions(tmp_path)
    rawlogs.pack(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["actions.jsonl.gz"]
    assert action_log.read_actions(tmp_path) == plain == lines


def test_packing_is_deterministic_reversible_and_leaves_the_small_files(tmp_path):
    cell = tmp_path / "study" / "POAD__seed=0"
    cell.mkdir(parents=True)
    text = metrics_text(RECORDS * 50)
    (cell / "metrics.jsonl").write_text(text)
    for name in ("cell.json", "config.json", "train.log"):
        (cell / name).write_text("{}")
    (tmp_path / "study" / "NTPO__seed=0").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "metrics.jsonl").write_text(text)
    rawlogs.pack(tmp_path / "study")
    packed = (cell / "metrics.jsonl.gz").read_bytes()
    assert gzip.decompress(packed).decode() == text and len(packed) < len(text) / 4
    assert sorted(p.name for p in cell.iterdir()) == ["cell.json", "config.json", "metrics.jsonl.gz", "train.log"]
    assert (tmp_path / "elsewhere" / "metrics.jsonl").is_file()  # a reused cell's files are its own study's
    (cell / "metrics.jsonl").write_text(text)  # a re-snapshot of the unchanged cell
    rawlogs.pack(tmp_path / "study")
    assert (cell / "metrics.jsonl.gz").read_bytes() == packed
    assert packed[4:8] == b"\0\0\0\0" and not packed[3] & 0x08  # mtime 0, no file name in the header
    unpacked = subprocess.run(["gzip", "-dc", str(cell / "metrics.jsonl.gz")], capture_output=True, text=True)
    assert unpacked.returncode == 0 and unpacked.stdout == text


def test_the_pack_command_packs_each_directory_and_refuses_a_missing_one(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "metrics.jsonl").write_text(metrics_text(RECORDS))
    command = [sys.executable, "-m", "poad_jax.tools.rawlogs", "pack"]
    done = subprocess.run([*command, str(tmp_path / "a")], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "1 logs packed" in done.stdout and (tmp_path / "a" / "metrics.jsonl.gz").is_file()
    missing = subprocess.run([*command, str(tmp_path / "b")], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert missing.returncode == 2 and missing.stderr.strip() == f"error: not a directory: {tmp_path / 'b'}"


def test_a_run_resumed_over_a_packed_log_goes_on_with_it_plain(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(metrics_text(RECORDS))
    rawlogs.pack(tmp_path)
    logger = metrics.MetricsLogger(tmp_path, tensorboard=False)
    assert logger.truncate_after(2) == RECORDS[:2]
    logger.log(RECORDS[2])
    assert not (tmp_path / "metrics.jsonl.gz").exists()
    assert metrics.read_metrics(tmp_path / "metrics.jsonl") == RECORDS
    (tmp_path / "metrics.jsonl").write_text(metrics_text(RECORDS))
    rawlogs.pack(tmp_path)
    assert metrics.MetricsLogger(tmp_path, tensorboard=False).truncate_after(3) == RECORDS
    assert (tmp_path / "metrics.jsonl").read_text() == metrics_text(RECORDS)  # plain now, where `log` appends


def test_a_fresh_run_clears_a_packed_log_of_another_configuration(tmp_path):
    for name in ("metrics.jsonl", "actions.jsonl"):
        (tmp_path / name).write_text("{}\n")
    rawlogs.pack(tmp_path)
    rundir.clear_stale_outputs(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_study_report_of_packed_cells_is_the_report_of_plain_ones(tmp_path):
    """Tables and figures byte for byte: what `--report --publish` writes from a raw snapshot."""
    study = spec.load_study(write_study(tmp_path, updates=3, seeds=(0, 1)))
    outputs = {}
    for form in ("plain", "packed"):
        workdir = tmp_path / form
        for seed in (0, 1):
            for group in ("POAD", "NTPO"):
                _fake_cell(workdir, f"{group}__seed={seed}",
                           [{**r, "episode_return": r["episode_return"] * (seed + 1)} for r in RECORDS], "done")
        if form == "packed":
            assert len(rawlogs.pack(workdir / "cells")) == 4
        report.write_report(study, workdir)
        outputs[form] = {p.name: p.read_bytes() for p in sorted(workdir.iterdir()) if p.is_file()}
    assert outputs["packed"] == outputs["plain"] and "report.md" in outputs["plain"]
    assert any(name.endswith(".png") for name in outputs["plain"])


def test_the_raw_snapshots_hold_no_plain_log_and_no_large_plain_file():
    plain_logs = sorted(str(p.relative_to(RAW)) for p in RAW.rglob("*.jsonl"))
    assert plain_logs == [], f"pack them: python -m poad_jax.tools.rawlogs pack docs/results/raw ({plain_logs[:3]})"
    large = sorted(str(p.relative_to(RAW)) for p in RAW.rglob("*") if p.is_file() and not p.name.endswith(".gz")
                   and p.stat().st_size > rawlogs.PLAIN_LIMIT_BYTES)
    assert large == [], f"plain files over {rawlogs.PLAIN_LIMIT_BYTES} bytes: {large}"
    assert len(list(RAW.rglob("metrics.jsonl.gz"))) >= 300

