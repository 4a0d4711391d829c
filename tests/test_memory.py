"""A run's expected peak memory (`poad_jax.run.memory`), said before it loads anything.

- The toy run's expected peak is within 25 % of the peak RSS its trainer measures (`peak_rss_mb`), and
  the trainer prints it in one line at its start.
- Below the machine's available memory, one warning line names the settings that lower the peak.
- A run that does not learn expects no behaviour pass and no learner (the toy's within 25 % of its peak too);
  on a mesh the estimate is one device's share.
- The study runner starts no more cells at once than the available memory holds at their expected peaks,
  and says so in one line.
- The loader reads a safetensors file tensor by tensor, the same arrays as the `safetensors` package.
"""

from __future__ import annotations

import functools
import json
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from poad_jax.run import config as config_lib
from poad_jax.run import hardware
from poad_jax.run import memory
from poad_jax.run.config import typed
from poad_jax.tools.study import scheduler, spec

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from test_study import write_study  # noqa: E402

pytestmark = pytest.mark.xdist_group("study")


QWEN = {"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
        "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "head_dim": 64,
        "tie_word_embeddings": False}  # Qwen2.5-Coder-0.5B's sizes (its converted config.json)


def toy_config(**overrides):
    """configs/toy.py with `overrides`, its "auto" settings resolved as the trainer resolves them."""
    config = config_lib.load_config_file(REPO / "configs" / "toy.py")
    for key, value in overrides.items():
        config[key] = value
    hardware.resolve_config(config)
    return config


def test_the_toy_runs_expected_peak_is_within_25_percent_of_its_measured_peak(tmp_path):
    workdir = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "poad_jax.train", "--config=configs/toy.py",
                             f"--workdir={workdir}", "--config.total_env_steps=32", "--config.tensorboard=false",
                             "--config.plot=false"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    expected = memory.expected_peak(typed(toy_config(total_env_steps=32)))
    assert memory.expected_line(expected) in result.stdout.splitlines()
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    measured = max(r["peak_rss_mb"] for r in records) * 2**20
    assert abs(expected.total - measured) <= 0.25 * measured, (expected.as_dict(), measured / 2**20)


def test_the_estimate_adds_each_copy_of_the_weights_and_the_largest_phase():
    """Qwen2.5-Coder-0.5B's sizes (its converted config.json): weights in bfloat16 where the matmuls are,
    the sampler's per-layer copies, and the phases' terms growing with the settings that the warning names."""
    qwen = memory.geometry_from_hf(QWEN)
    config = toy_config()
    config.matmul_dtype, config.dtype = "bfloat16", "float32"
    base = memory.expected_peak(typed(config), qwen)
    assert base.params == 630_167_424  # the converted file's 2 520 669 696 float32 bytes / 4
    matrices = 24 * (2 * 896 * 896 + 2 * 896 * 128 + 3 * 896 * 4864)
    assert base.weights == (matrices + 2 * 151936 * 896) * 2 + (896 + 24 * (2 * 896 + 1152)) * 4
    assert base.sampler_copy == matrices * 2
    config.matmul_dtype = "float32"
    assert memory.expected_peak(typed(config), qwen).weights == base.params * 4
    for setting, smaller in (("num_threads", 2), ("sampling.max_new_tokens", 16)):
        lowered = toy_config()
        lowered.matmul_dtype = "bfloat16"
        target, _, field = setting.rpartition(".")
        (lowered[target] if target else lowered)[field] = smaller
        assert memory.expected_peak(typed(lowered), qwen).total < base.total, setting
    line = memory.memory_warning(base, base.total - 1)
    assert line.startswith(f"warning: this run expects to need {memory.gib(base.total)} at its peak ")
    assert "--config." in line and memory.memory_warning(base, base.total) is None


def test_a_run_that_does_not_learn_expects_no_behaviour_pass_and_no_learner(tmp_path):
    """`learn=False`: the peak is the sampling's; the toy run's estimate within 25 % of its measured peak."""
    qwen = memory.geometry_from_hf(QWEN)
    learning, sampling_only = toy_config(), toy_config(learn=False)
    for config in (learning, sampling_only):
        config.matmul_dtype = "bfloat16"
    assert memory.expected_peak(typed(learning), qwen).phase[0] == "learner"
    expected = memory.expected_peak(typed(sampling_only), qwen)
    assert (expected.behaviour, expected.learner, expected.phase[0]) == (0, 0, "sampling")
    assert expected.total == expected.runtime + expected.weights + expected.trainable + expected.sampler_copy \
        + expected.sampling < memory.expected_peak(typed(learning), qwen).total
    workdir = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "poad_jax.train", "--config=configs/toy.py",
                             f"--workdir={workdir}", "--config.total_env_steps=32", "--config.learn=false",
                             "--config.tensorboard=false", "--config.plot=false"],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    toy = memory.expected_peak(typed(toy_config(total_env_steps=32, learn=False)))
    assert toy.learner == 0 and memory.expected_line(toy) in result.stdout.splitlines()
    measured = max(json.loads(line)["peak_rss_mb"] for line in (workdir / "metrics.jsonl").read_text().splitlines())
    assert abs(toy.total - measured * 2**20) <= 0.25 * measured * 2**20, (toy.as_dict(), measured)


def test_on_a_mesh_the_estimate_is_one_devices_share():
    """fsdp x tensor split the frozen base and the sampler's copy, data x fsdp the rows (the KV cache, each pass's
    activations), tensor the widths; a -1 axis takes the devices the others leave (1 where they are unknown);
    runtime and trainable state stay whole, and the line says per device."""
    qwen = memory.geometry_from_hf(QWEN)

    def estimate(devices=None, **mesh):
        config = toy_config()
        config.matmul_dtype, config.num_threads, config.rollout_length = "bfloat16", 8, 1
        config.ppo.num_minibatches, config.ppo.accumulation_steps = 2, 1
        for axis, size in mesh.items():
            config.mesh[axis] = size
        return memory.expected_peak(typed(config), qwen, devices)

    one, fsdp, data, tensor = estimate(), estimate(fsdp=2), estimate(data=2), estimate(tensor=2)
    assert one.devices == 1 and (fsdp.devices, data.devices, tensor.devices) == (2, 2, 2)
    assert abs(fsdp.weights - one.weights / 2) <= 1 and fsdp.sampler_copy == one.sampler_copy // 2
    assert data.weights == one.weights and data.sampling == one.sampling // 2 == fsdp.sampling
    assert tensor.sampling == one.sampling // 2 and abs(tensor.weights - one.weights / 2) <= 1
    for split in (fsdp, data, tensor):
        assert (split.runtime, split.trainable) == (one.runtime, one.trainable)
    # one device runs the output layer a piece of a row at a time; a mesh holds every row's logits at once
    from poad_jax.core.policy import output_pieces

    new = toy_config().sampling.max_new_tokens
    logits = new * 151936 * 4 * memory.GRADIENT_LOGIT_BUFFERS
    matrices = qwen.layer_matrix_params() * 2
    activations = one.learner - logits // output_pieces(new) - matrices - one.behaviour
    assert data.learner == activations // 2 + 2 * logits + matrices + data.behaviour
    assert estimate(devices=8, data=-1, fsdp=2).devices == 8 and estimate(data=-1, fsdp=2) == fsdp
    assert memory.expected_line(fsdp).startswith("expected peak memory per device of 2: ")
    assert memory.expected_line(one).startswith("expected peak memory: ")


def test_the_trainer_warns_in_one_line_when_available_memory_is_below_the_expected_peak(monkeypatch, capsys):
    from poad_jax.run import train

    config = toy_config()
    expected = memory.expected_peak(typed(config))
    monkeypatch.setattr(memory, "available_bytes", lambda meminfo="/proc/meminfo": expected.total // 2)
    train.say_expected_memory(typed(config))
    out, err = capsys.readouterr()
    assert out.splitlines() == [memory.expected_line(expected)]
    (warning,) = err.splitlines()
    assert warning.startswith("warning: this run expects to need ") and "--config.num_threads" in warning


def test_available_memory_is_read_from_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24684536 kB\nMemFree:        1000 kB\nMemAvailable:   2048 kB\n")
    assert memory.available_bytes(meminfo) == 2048 * 1024
    assert memory.available_bytes(tmp_path / "missing") is None


def test_the_study_runner_starts_no_more_cells_than_available_memory_holds(tmp_path, monkeypatch):
    """Two workers, memory for one cell at its expected peak: the cells run one at a time, said in one line."""
    study = spec.load_study(write_study(tmp_path, updates=1, methods=("poad", "ntpo"), seeds=(0,)))
    one = memory.expected_peak(typed(toy_config())).total
    monkeypatch.setattr(memory, "available_bytes", lambda meminfo="/proc/meminfo": int(1.5 * one))
    monkeypatch.setattr(scheduler, "resident_bytes", lambda pid: 0)  # a running cell's whole peak is still to come
    lines: list[str] = []
    status = scheduler.run_study(study, tmp_path / "runs" / "toy_grid", workers=2, log=lines.append)
    assert status == {"POAD__seed=0": "done", "NTPO__seed=0": "done"}
    waits = [line for line in lines if "waits for memory" in line]
    assert len(waits) == 1 and waits[0].startswith("[toy_grid] cell NTPO__seed=0 waits for memory: it expects "
                                                   f"to need {memory.gib(one)} at its peak"), lines
    assert waits[0].endswith("1 at once, not --workers=2")
    running = [int(m.group(1)) for line in lines for m in [re.search(r"(\d+) running", line)] if m]
    assert max(running) == 1, lines


def test_a_safetensors_file_reads_tensor_by_tensor_as_the_safetensors_package_does(tmp_path):
    from safetensors.numpy import load_file, save_file

    from poad_jax.models.errors import ModelLoadError
    from poad_jax.models.hf_io import TensorSource

    rng = np.random.default_rng(0)
    tensors = {"a": rng.normal(size=(3, 5)).astype(np.float32), "b": np.arange(7, dtype=np.int64),
               "c": rng.normal(size=(2, 2, 2)).astype(np.float16)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    source = TensorSource([tmp_path / "model.safetensors"])
    reference = load_file(str(tmp_path / "model.safetensors"))
    for name in tensors:
        assert name in source
        np.testing.assert_array_equal(source.get(name), reference[name])
        assert source.get(name).dtype == reference[name].dtype
    (tmp_path / "broken.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ModelLoadError, match="corrupt safetensors file"):
        TensorSource([tmp_path / "broken.safetensors"])


def test_the_rowwise_policy_terms_equal_the_whole_batchs_and_so_do_their_gradients():
    """The output layer row by row, or in pieces of a row (`rowwise_policy_terms`, what every pass runs on one
    device) computes each token's log-probs and entropies as the whole batch's logits do, to float32 rounding
    of the log-softmax's sums, and its gradient likewise; the logits themselves are equal bit for bit."""
    import jax
    import jax.numpy as jnp

    from poad_jax.core import policy
    from poad_jax.models.tiny import tiny_random_model

    model, _ = tiny_random_model(seed=0)
    rng = np.random.default_rng(0)
    rows, actions = 6, 9
    hidden = jnp.asarray(rng.normal(size=(rows, actions, model.config.hidden_size)).astype(np.float32))
    tokens = jnp.asarray(rng.integers(0, model.config.vocab_size, size=(rows, actions)))
    allowed = jnp.asarray(rng.integers(0, model.config.vocab_size, size=(rows, actions, 3)))
    mask = jnp.asarray(rng.random((rows, actions, 3)) < 0.5)

    def whole(h):
        return policy.token_policy_terms(model.logits(h) / 0.7, tokens, allowed, mask)

    def by_row(h, chunk=policy.OUTPUT_CHUNK_TOKENS):
        return policy.rowwise_policy_terms(model, h, tokens, 0.7, allowed, mask, chunk)

    loss = lambda terms: jnp.sum(terms.logprobs_offered) + jnp.sum(terms.entropy_vocabulary)  # noqa: E731
    whole_gradient = jax.grad(lambda h: loss(whole(h)))(hidden)
    for chunk in (policy.OUTPUT_CHUNK_TOKENS, 4):  # a row at once (9 tokens), in pieces of 3 tokens
        for expected, got in zip(jax.jit(whole)(hidden), jax.jit(functools.partial(by_row, chunk=chunk))(hidden)):
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(jax.grad(lambda h: loss(by_row(h, chunk)))(hidden), whole_gradient,
                                   rtol=1e-5, atol=1e-5)
    assert [policy.output_pieces(a, c) for a, c in ((9, 64), (9, 4), (7, 4), (256, 64), (256, 100))] == [1, 3, 7, 4, 4]
    np.testing.assert_array_equal(jax.jit(lambda h: jax.lax.map(lambda r: model.logits(r[None])[0], h))(hidden),
                                  jax.jit(model.logits)(hidden))


HEAP_HOLES = """
import ctypes, ctypes.util, pathlib
from poad_jax.sampling.sampler import return_freed_memory
def resident_mib():
    return next(int(line.split()[1]) / 1024 for line in pathlib.Path("/proc/self/status").read_text().splitlines()
                if line.startswith("VmRSS:"))
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
blocks = [libc.malloc(64 * 1024) for _ in range(4000)]  # 250 MiB in the heap (below the mmap threshold)
for block in blocks:
    ctypes.memset(block, 1, 64 * 1024)
for i, block in enumerate(blocks):
    if i % 100 != 99:  # every 100th block stays: the freed memory is holes, the heap's top is held
        libc.free(block)
before = resident_mib()
print(return_freed_memory(), before - resident_mib())
"""


def test_freed_heap_memory_goes_back_to_the_kernel():
    """`return_freed_memory` (after the sampler frees its per-layer copies): 246 MiB freed in holes of the heap stay
    resident until it runs, and go back to the kernel when it does."""
    done = subprocess.run([sys.executable, "-c", HEAP_HOLES], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    trimmed, returned_mib = done.stdout.split()
    assert trimmed == "True" and float(returned_mib) > 200, done.stdout


def test_the_peak_is_the_processs_own_high_water_mark(tmp_path):
    """VmHWM from /proc/self/status, not ru_maxrss (which the kernel carries across exec from a large parent)."""
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmPeak:\t 9000000 kB\nVmHWM:\t  2048000 kB\nVmRSS:\t 1024000 kB\n")
    assert memory.peak_rss_mb(status) == 2000.0
    import resource
    assert memory.peak_rss_mb(tmp_path / "missing") == resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
