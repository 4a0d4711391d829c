"""docs/guide.md as a newcomer runs it: every file it shows is written and every command it shows is
run, as written, in a directory of one's own (not the checkout), in the guide's order; then what each
step promises is checked: the run trained on one's own environment, the evaluation table was saved,
TensorBoard has the scalars, the study ran its cells from that directory, a Hugging Face directory
trained, and the exported adapter loads in PEFT with logits equal to the trained actor's."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import shlex
import struct
import subprocess
import sys

import numpy as np
import pytest

# One xdist worker runs every test of this module (`--dist loadgroup`, scripts/test.sh): its module
# fixture, minutes of training or of subprocesses, is then set up once per suite, not once per worker.
pytestmark = [pytest.mark.xdist_group("guide"), pytest.mark.long]

REPO = pathlib.Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "guide.md"
BLOCK = re.compile(r"<!-- guide: (file (?P<name>\S+)|run) -->\n```\w*\n(?P<body>.*?)```", re.S)


def guide_steps() -> list[tuple[str, str]]:
    """[("file", name, text) or ("run", command)] in the guide's order."""
    steps = []
    for match in BLOCK.finditer(GUIDE.read_text()):
        if match["name"]:
            steps.append(("file", match["name"], match["body"]))
        else:
            steps += [("run", line, "") for line in match["body"].splitlines() if line.strip()]
    return steps


def run_command(line: str, cwd: pathlib.Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """One command of the guide, `python` being this interpreter; the environment holds no PYTHONPATH
    (poad_jax is installed) and no way to download anything."""
    words = shlex.split(line)
    assert words[0] == "python", f"the guide's commands start with python: {line}"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.run([sys.executable, *words[1:]], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def tiny_hf_directory(directory: pathlib.Path) -> None:
    """A small random LLaMA in Hugging Face form with SmolLM2's tokenizer: what `my-model` stands for."""
    from flax import nnx

    from poad_jax.models import LlamaConfig, Llama, Tokenizer, hf_io
    from poad_jax.models.loading import embedded_model_directory

    tokenizer = Tokenizer.from_directory(embedded_model_directory("smollm2-135m-instruct"))
    config = LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_ids[0],
                         pad_token_id=tokenizer.pad_token_id)
    hf_io.save_hf_model(directory, Llama(config, lora=None, rngs=nnx.Rngs(0)), tokenizer)


@pytest.fixture(scope="module")
def walked(tmp_path_factory):
    """The guide walked through once: {command: its completed process}, and the project directory."""
    project = tmp_path_factory.mktemp("my_project")
    tiny_hf_directory(project / "my-model")
    done = {}
    for kind, what, text in guide_steps():
        if kind == "file":
            (project / what).write_text(text)
            continue
        if what == "python use_adapter.py" and importlib.util.find_spec("peft") is None:
            continue  # the bench extra is absent: test_the_exported_adapter_loads_in_peft skips
        done[what] = run_command(what, project)
        assert done[what].returncode == 0, f"{what}\n{done[what].stdout[-2000:]}\n{done[what].stderr[-3000:]}"
    return project, done


def test_the_guide_shows_every_section_a_newcomer_needs():
    steps = guide_steps()
    files = {what for kind, what, _ in steps if kind == "file"}
    assert {"myenv.py", "myconfig.py", "mystudy.py", "use_adapter.py"} <= files
    commands = " ".join(what for kind, what, _ in steps if kind == "run")
    for command in ("poad_jax.train", "poad_jax.evaluate", "poad_jax.study", "poad_jax.export"):
        assert command in commands
    # Not run (TensorBoard is no dependency): its event files are read by the TensorBoard test below.
    assert "tensorboard --logdir=runs" in GUIDE.read_text()


def test_ones_own_environment_trains_from_ones_own_directory(walked):
    project, done = walked
    run = project / "runs" / "microwave"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["env_steps"] for r in records] == [16, 32, 48, 64]
    assert json.loads((run / "config.json").read_text())["env"]["name"] == "my/microwave"
    output = done["python -m poad_jax.train --config=myconfig.py --workdir=runs/microwave"]
    assert "4 PPO updates over 64 env steps (the run is complete)." in output.stdout
    assert "warning" not in output.stderr  # every action word is in tiny-random's vocabulary
    assert json.loads((run / "environment.json").read_text())["entry_point"] == "myenv:Microwave"


def test_evaluating_prints_the_table_once_and_saves_it(walked):
    project, done = walked
    output = done["python -m poad_jax.evaluate --workdir=runs/microwave --episodes=4"]
    rows = [line for line in output.stdout.splitlines() if line.startswith("my/microwave")]
    assert [row.split()[1] for row in rows] == ["sampled", "greedy"]  # once each, not again as a second table
    assert output.stdout.count("environment") == 1 and "read only" not in output.stderr
    saved = (project / "runs" / "microwave" / "evaluation.txt").read_text().splitlines()
    assert saved[0].startswith("# python -m poad_jax.evaluate --workdir=runs/microwave --episodes=4")
    assert saved[2:] == rows


def tensorboard_scalars(directory: pathlib.Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(env steps, value)]} of the event files under `directory` (TFRecord framing, read by hand:
    tensorboard itself is not installed)."""
    from tensorboardX.proto import event_pb2

    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(directory.glob("events.out.tfevents.*")):
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_tensorboard_and_the_curves_hold_what_the_guide_names(walked):
    project, done = walked
    run = project / "runs" / "microwave"
    scalars = tensorboard_scalars(run / "tensorboard")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for tag in ("episode_return", "success_rate", "approx_kl"):
        assert scalars[tag] == [(r["env_steps"], pytest.approx(r[tag])) for r in records], tag
    assert (run / "curves.png").stat().st_size > 0
    printed = done["python read_metrics.py"].stdout.split()
    assert printed[:2] == ["1", "16"] and len(printed) == 4 * 4


def test_a_study_of_ones_own_environment_runs_its_cells_where_it_is_run(walked):
    project, done = walked
    study = project / "runs" / "studies" / "microwave_methods"
    output = done["python -m poad_jax.study --study=mystudy.py"]
    assert "failed" not in output.stdout + output.stderr
    for method in ("poad", "twosome"):
        cell = study / "cells" / f"method={method}__seed=0"
        assert json.loads((cell / "cell.json").read_text())["status"] == "done"
        assert json.loads((cell / "config.json").read_text())["env"]["name"] == "my/microwave"
    report = (study / "report.md").read_text()
    assert "| method=poad | 1 |" in report and "| method=twosome | 1 |" in report and (study / "return.png").exists()
    assert not (REPO / "runs" / "studies" / "microwave_methods").exists()  # nothing written in the checkout


def test_a_hugging_face_directory_trains(walked):
    project, _ = walked
    run = project / "runs" / "my-model"
    assert json.loads((run / "config.json").read_text())["model"] == "my-model"
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 4


def test_the_exported_adapter_loads_in_peft_with_the_trained_actors_logits(walked, monkeypatch):
    pytest.importorskip("peft", reason="the bench extra (peft, torch, transformers) is not installed")
    import jax.numpy as jnp
    import torch
    from peft import PeftConfig, PeftModel
    from transformers import AutoModelForCausalLM

    from poad_jax.tools.export import load_trained_actor

    project, done = walked
    adapter = project / "runs" / "my-model" / "adapter"
    assert PeftConfig.from_pretrained(str(adapter)).base_model_name_or_path == str((project / "my-model").resolve())
    assert done["python use_adapter.py"].stdout.strip()  # the guide's snippet printed a token
    base = AutoModelForCausalLM.from_pretrained(str(project / "my-model"), dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, str(adapter)).eval()
    tokens = np.array([[1, 504, 30, 253, 4010, 30, 2821, 339, 7]])
    with torch.no_grad():
        theirs = peft_model(torch.tensor(tokens)).logits[0].numpy()
    monkeypatch.chdir(project)  # as a user would: the run names its model relative to where it ran,
    monkeypatch.syspath_prepend(str(project))  # and its environment module is importable from there
    _, ours_model, _, _ = load_trained_actor(pathlib.Path("runs/my-model"))
    ours = np.asarray(ours_model(jnp.asarray(tokens)).logits[0], np.float32)
    np.testing.assert_allclose(theirs, ours, atol=2e-4, rtol=0)
    with torch.no_grad(), peft_model.disable_adapter():
        without = peft_model(torch.tensor(tokens)).logits[0].numpy()
    assert np.abs(without - ours).max() > 1e-3  # the adapter moved the logits: the test can tell
