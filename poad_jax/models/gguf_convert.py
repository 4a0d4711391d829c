"""GGUF -> Hugging Face layout: dequantised NumPy tensors, config.json, tokenizer.

Reads a GGUF file with the `gguf` package (NumPy only, no torch) and returns
what a Hugging Face checkpoint directory would hold, so the rest of the
loader has one format to deal with.

Layout traps, written down once:

1. **q/k permutation (LLaMA only).**  llama.cpp's converter reorders the rows
   of `attn_q` and `attn_k` of the `llama` architecture so that its RoPE can
   rotate adjacent pairs (x0, x1), (x2, x3), ... instead of Hugging Face's
   halves (x_i, x_{i + D/2}).  Within each head the HF row order
   `[0 .. D/2) ++ [D/2 .. D)` becomes the interleaving `0, D/2, 1, D/2+1, ...`:
   `w.reshape(heads, 2, D/2, in).swapaxes(1, 2)`.  We undo it
   (`undo_rope_permutation`) and keep HF's rotate-half RoPE in the model.  k
   uses the KV head count.  Qwen2 files are NOT permuted (llama.cpp runs
   NeoX-style RoPE for them), so their tensors are used as they are.
2. **Shapes.**  GGUF lists dimensions fastest-first (`[in, out]`); the byte
   data read as NumPy is row-major `[out, in]`, i.e. already the HF
   `nn.Linear` layout.  `gguf.quants.dequantize` turns the packed block
   bytes into that float32 array.
3. **Vocabulary spelling.**  Byte-level BPE tokens are stored in GPT-2's
   byte-to-unicode alphabet; a token written with other characters (a
   mislabelled added token) is re-spelled byte by byte, as transformers does.
4. **Pre-tokenizer.**  GGUF names it (`tokenizer.ggml.pre`); we rebuild the
   split rule for the names we know (`PRE_TOKENIZER_SPLITS`) and use GPT-2's
   rule for the rest.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors

from poad_jax.models.errors import ModelLoadError
from poad_jax.models.tokenizer import Tokenizer, turn_end_token_ids

# Tensor types we dequantise (all through `gguf.quants.dequantize`).
SUPPORTED_TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
SUPPORTED_ARCHITECTURES = ("llama", "qwen2")

# GGUF tensor name (after `blk.N.`) -> Hugging Face name (after `model.layers.N.`).
LAYER_TENSOR_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
GLOBAL_TENSOR_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

# GGUF token types (llama.cpp's llama_token_type).
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

_GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_LLAMA3_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# `tokenizer.ggml.pre` -> the regex splits applied before byte-level BPE, in order.
# "smollm" splits every digit apart, then applies GPT-2's rule (its tokenizer.json).
PRE_TOKENIZER_SPLITS = {
    "default": (_GPT2_SPLIT,),
    "gpt-2": (_GPT2_SPLIT,),
    "smollm": (r"\p{N}", _GPT2_SPLIT),
    "qwen2": (_QWEN2_SPLIT,),
    "llama-bpe": (_LLAMA3_SPLIT,),
    "llama3": (_LLAMA3_SPLIT,),
}


def open_gguf(path: str | os.PathLike):
    """A `gguf.GGUFReader` over `path` (memory-mapped); ModelLoadError if unreadable."""
    import gguf

    if not os.path.isfile(path):
        raise ModelLoadError(f"no such GGUF file: {path}")
    try:
        return gguf.GGUFReader(os.fspath(path))
    except Exception as error:
        raise ModelLoadError(f"corrupt or unreadable GGUF file {path}: {error}") from error


def metadata(reader) -> dict[str, Any]:
    """All key/value metadata of a GGUF file as plain Python values."""
    values = {}
    for key, field in reader.fields.items():
        try:
            values[key] = field.contents()
        except Exception as error:
            raise ModelLoadError(f"corrupt GGUF metadata field {key!r}: {error}") from error
    return values


def hf_config_from_metadata(meta: dict[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    """The Hugging Face `config.json` dictionary a GGUF's metadata describes.

    Raises ModelLoadError for an architecture other than llama / qwen2.
    """
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"unsupported GGUF architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )

    def get(key, default=None):
        return meta.get(f"{arch}.{key}", default)

    hidden = int(get("embedding_length"))
    heads = int(get("attention.head_count"))
    vocab = get("vocab_size")
    if vocab is None:
        vocab = len(meta["tokenizer.ggml.tokens"])
    head_dim = get("attention.key_length") or get("rope.dimension_count") or hidden // heads
    config = {
        "architectures": ["Qwen2ForCausalLM" if arch == "qwen2" else "LlamaForCausalLM"],
        "model_type": arch,
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": int(head_dim),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(get("context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "hidden_act": "silu",
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
    }
    scaling_type = get("rope.scaling.type")
    if scaling_type not in (None, "none"):
        if scaling_type != "linear":
            raise ModelLoadError(f"unsupported GGUF RoPE scaling {scaling_type!r}")
        config["rope_scaling"] = {"rope_type": "linear", "factor": float(get("rope.scaling.factor"))}
    return config


def undo_rope_permutation(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Hugging Face row order of a llama.cpp-permuted q/k weight `[heads * D, ...]`.

    llama.cpp wrote `w.reshape(heads, 2, D/2, ...).swapaxes(1, 2)`; this is its
    inverse `w.reshape(heads, D/2, 2, ...).swapaxes(1, 2)`.  Works for biases
    (1-D) too.
    """
    rows = weight.shape[0]
    half = rows // num_heads // 2
    restored = weight.reshape(num_heads, half, 2, *weight.shape[1:]).swapaxes(1, 2)
    return restored.reshape(weight.shape)


def dequantized(tensor) -> np.ndarray:
    """A GGUF tensor as float32 `[out, in]` (row-major, HF layout); ModelLoadError if unsupported."""
    from gguf import quants

    kind = tensor.tensor_type.name
    if kind not in SUPPORTED_TENSOR_TYPES:
        raise ModelLoadError(
            f"unsupported GGUF tensor type {kind} in {tensor.name}; supported: {', '.join(SUPPORTED_TENSOR_TYPES)}"
        )
    try:
        values = quants.dequantize(tensor.data, tensor.tensor_type)
    except Exception as error:
        raise ModelLoadError(f"corrupt GGUF tensor {tensor.name}: {error}") from error
    expected = tuple(int(d) for d in reversed(tensor.shape))
    if values.shape != expected:
        values = values.reshape(expected)
    return np.ascontiguousarray(values, dtype=np.float32)


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face tensor name of a GGUF tensor name, or None if it has none."""
    if gguf_name in GLOBAL_TENSOR_NAMES:
        return GLOBAL_TENSOR_NAMES[gguf_name]
    if gguf_name.startswith("blk."):
        _, index, leaf = gguf_name.split(".", 2)
        if leaf in LAYER_TENSOR_NAMES:
            return f"model.layers.{index}.{LAYER_TENSOR_NAMES[leaf]}"
    return None


def hf_tensors(reader, config: dict[str, Any]) -> dict[str, np.ndarray]:
    """Every model tensor, dequantised to float32, named and laid out as in HF.

    The llama q/k permutation is undone here (see the module docstring).
    Tensors with no HF counterpart (e.g. precomputed `rope_freqs`) are dropped.
    """
    tensors = {}
    permuted = config["model_type"] == "llama"
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None:
            continue
        values = dequantized(tensor)
        if permuted and ".self_attn.q_proj." in name:
            values = undo_rope_permutation(values, config["num_attention_heads"])
        elif permuted and ".self_attn.k_proj." in name:
            values = undo_rope_permutation(values, config["num_key_value_heads"])
        tensors[name] = values
    return tensors


def _byte_level_spelling(token: str, alphabet: dict[int, str], letters: set[str]) -> str:
    """`token` in GPT-2's byte alphabet (unchanged when it already is)."""
    if set(token) <= letters:
        return token
    return "".join(alphabet[b] for b in token.encode("utf-8"))


def _gpt2_byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


def tokenizer_from_gguf(meta: dict[str, Any]) -> Tokenizer:
    """The byte-level BPE tokenizer a GGUF's `tokenizer.*` metadata describes.

    Control tokens (type 3) become special added tokens, user-defined tokens
    (type 4) plain added tokens, so both are matched whole in text.  BOS is
    prepended by `encode(..., add_special_tokens=True)` only when the file sets
    `tokenizer.ggml.add_bos_token`.
    """
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ModelLoadError(f"unsupported GGUF tokenizer model {kind!r}; supported: 'gpt2' (byte-level BPE)")
    alphabet = _gpt2_byte_alphabet()
    letters = set(alphabet.values())
    tokens = list(meta["tokenizer.ggml.tokens"])
    vocab = {_byte_level_spelling(token, alphabet, letters): i for i, token in enumerate(tokens)}
    merges = [tuple(merge.split(" ", 1)) for merge in meta.get("tokenizer.ggml.merges", [])]
    backend = tokenizers.Tokenizer(
        models.BPE(vocab=vocab, merges=merges, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
    )
    splits = PRE_TOKENIZER_SPLITS.get(meta.get("tokenizer.ggml.pre", "default"), (_GPT2_SPLIT,))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(split), behavior="isolated") for split in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    backend.decoder = decoders.ByteLevel()
    token_types = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    backend.add_special_tokens(
        [
            AddedToken(token, normalized=False, special=True)
            for token, token_type in zip(tokens, token_types)
            if token_type == TOKEN_TYPE_CONTROL and set(token) <= letters
        ]
    )
    backend.add_tokens(
        [
            AddedToken(token, normalized=False, special=False)
            for token, token_type in zip(tokens, token_types)
            if token_type == TOKEN_TYPE_USER_DEFINED and token in vocab
        ]
    )

    def declared(key):
        value = meta.get(f"tokenizer.ggml.{key}")
        return None if value is None else int(value)

    bos_id, eos_id = declared("bos_token_id"), declared("eos_token_id")
    eot_id, pad_id = declared("eot_token_id"), declared("padding_token_id")
    if meta.get("tokenizer.ggml.add_bos_token") and bos_id is not None:
        bos = tokens[bos_id]
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    eos_ids = turn_end_token_ids(backend) + [i for i in (eot_id, eos_id) if i is not None]
    if not eos_ids:
        raise ModelLoadError("the GGUF declares no end-of-sequence token")
    special = {
        "bos_token": tokens[bos_id] if bos_id is not None else None,
        "eos_token": tokens[eos_ids[0]],
        "pad_token": tokens[pad_id] if pad_id is not None else None,
        "unk_token": tokens[declared("unknown_token_id")] if declared("unknown_token_id") is not None else None,
    }
    return Tokenizer(
        backend,
        chat_template=meta.get("tokenizer.chat_template"),
        eos_token_ids=eos_ids,
        pad_token_id=eos_ids[0] if pad_id is None else pad_id,
        bos_token_id=bos_id,
        special_tokens=special,
    )


def convert_gguf(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray], Tokenizer]:
    """`(hf_config, hf_tensors, tokenizer)` of a GGUF file, all in Hugging Face terms.

    Tensors are float32 NumPy arrays named as in a transformers checkpoint
    (`model.layers.0.self_attn.q_proj.weight`, `[out, in]`).
    """
    reader = open_gguf(path)
    meta = metadata(reader)
    config = hf_config_from_metadata(meta, {t.name for t in reader.tensors})
    tokenizer = tokenizer_from_gguf(meta)
    tensors = hf_tensors(reader, config)
    return config, tensors, tokenizer
