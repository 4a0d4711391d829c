"""`matmul_dtype="auto"` (issue 41): bfloat16 only where the machine multiplies it natively,
resolved once per run, printed, recorded in the run directory, and kept on resume."""

from __future__ import annotations

import json
import pathlib

import pytest

from poad_jax.run import config as config_lib
from poad_jax.run import hardware, train

REPO = pathlib.Path(__file__).resolve().parents[1]

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse2 avx2 fma {extra}
bogomips\t: 4000

processor\t: 1
flags\t\t: fpu sse2 avx2 fma {extra}
"""


def write_cpuinfo(tmp_path: pathlib.Path, extra: str) -> pathlib.Path:
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO.format(extra=extra))
    return path


def test_cpu_flags_reads_the_flags_lines(tmp_path):
    flags = hardware.cpu_flags(write_cpuinfo(tmp_path, "avx512f avx512_bf16"))
    assert {"avx2", "fma", "avx512f", "avx512_bf16"} <= flags
    assert "AuthenticAMD" not in flags and "4000" not in flags


def test_cpu_flags_of_an_unreadable_file_is_empty(tmp_path):
    assert hardware.cpu_flags(tmp_path / "missing") == frozenset()


def test_scoring_machine_names_the_cpu_its_kernel_flags_and_the_scoring_packages(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text("model name\t: AMD EPYC 9R14\n" + CPUINFO.format(extra="avx512f avx512_bf16 sse4_2"))
    machine = hardware.scoring_machine(path)
    assert machine["cpu"] == "AMD EPYC 9R14"
    assert machine["isa"] == ["avx2", "avx512_bf16", "avx512f", "fma"]  # sorted, kernel-choosing flags only
    assert set(machine["packages"]) == {"numpy", "scipy", "scikit-learn"}
    assert machine["packages"]["numpy"] == __import__("numpy").__version__
    unreadable = hardware.scoring_machine(tmp_path / "missing")
    assert unreadable["cpu"] == "unknown" and unreadable["isa"] == []


@pytest.mark.parametrize("backend, extra, expected", [
    ("cpu", "", "float32"),                      # AVX2 only: bfloat16 is emulated
    ("cpu", "avx512f avx512bw", "float32"),      # AVX-512 without its bfloat16 extension
    ("cpu", "avx512f avx512_bf16", "bfloat16"),
    ("cpu", "amx_tile amx_bf16", "bfloat16"),
    ("gpu", "", "bfloat16"),
    ("tpu", "", "bfloat16"),
])
def test_native_matmul_dtype(tmp_path, backend, extra, expected):
    dtype, why = hardware.native_matmul_dtype(backend, hardware.cpu_flags(write_cpuinfo(tmp_path, extra)))
    assert dtype == expected
    assert why  # the run prints it


def test_a_concrete_dtype_is_never_changed(monkeypatch):
    monkeypatch.setattr(hardware, "machine_matmul_dtype", lambda: ("bfloat16", "test machine"))
    assert hardware.resolve_matmul_dtype("float32")[0] == "float32"
    assert hardware.resolve_matmul_dtype("float32", recorded="bfloat16")[0] == "float32"
    assert hardware.resolve_matmul_dtype("auto")[0] == "bfloat16"
    assert hardware.resolve_matmul_dtype("auto", recorded="float32")[0] == "float32"


def toy_config(matmul_dtype: str):
    config = config_lib.load_config_file(REPO / "configs" / "toy.py")
    config.total_env_steps = 32  # 2 updates of 4 threads x 4 steps
    config.tensorboard = False
    config.plot = False
    config.matmul_dtype = matmul_dtype
    return config


def test_auto_is_checked_by_the_config():
    config_lib.validate(toy_config("auto"))
    with pytest.raises(config_lib.ConfigError, match="matmul_dtype"):
        config_lib.validate(toy_config("float8"))


@pytest.mark.long
def test_a_run_records_the_resolved_dtype_and_keeps_it_on_resume(tmp_path, monkeypatch, capsys):
    workdir = tmp_path / "run"
    monkeypatch.setattr(hardware, "machine_matmul_dtype", lambda: ("bfloat16", "test machine A"))
    config = toy_config("auto")
    train.run(config, workdir, show_progress=True, max_updates=1)
    assert config.matmul_dtype == "auto"  # the caller's config is not changed
    assert json.loads((workdir / "config.json").read_text())["matmul_dtype"] == "bfloat16"
    assert "matmuls in bfloat16 (auto: test machine A)" in capsys.readouterr().out

    # The same command on a machine that would choose float32 resumes in the recorded bfloat16.
    monkeypatch.setattr(hardware, "machine_matmul_dtype", lambda: ("float32", "test machine B"))
    result = train.run(toy_config("auto"), workdir, show_progress=True)
    assert result.finished
    assert json.loads((workdir / "config.json").read_text())["matmul_dtype"] == "bfloat16"
    assert "matmuls in bfloat16 (auto: the run directory's recorded dtype)" in capsys.readouterr().out


@pytest.mark.parametrize("settings, expected", [
    ({"matmul_dtype": "float32"}, "sampler"),
    ({"matmul_dtype": "bfloat16"}, "recompute"),  # bfloat16 decoding rounds them differently
    ({"matmul_dtype": "float32", "method": "twosome"}, "recompute"),
    ({"matmul_dtype": "float32", "restricted_sampling": "action_scores"}, "recompute"),
    ({"matmul_dtype": "float32", "ppo.behaviour_correction": "importance"}, "recompute"),
])
def test_auto_behaviour_logprobs_are_the_samplers_where_float32_decodes_the_policy(settings, expected):
    config = toy_config("float32")
    config.behaviour_logprobs = "auto"
    for dotted, value in settings.items():
        *parents, leaf = dotted.split(".")
        node = config
        for parent in parents:
            node = node[parent]
        node[leaf] = value
    config_lib.validate(config)
    hardware.resolve_config(config)
    assert config.behaviour_logprobs == expected
    config_lib.validate(config)  # the resolved choice is a valid config
    assert hardware.resolve_behaviour_logprobs(config, recorded="recompute")[0] == expected  # concrete now
    config.behaviour_logprobs = "auto"
    assert hardware.resolve_behaviour_logprobs(config, recorded="recompute")[0] == "recompute"
