"""What a run expects to hold at its peak, from the model's size and the settings, before it loads anything.

A run's peak resident memory is the sum of what lives through the whole run and the largest of what one
phase of an update adds on top (docs/performance.md, "Where a DataSciCoding run's memory goes"):

    peak = runtime + weights + trainable state
           + max(the sampler's copy + its KV cache, the behaviour pass's activations, the learner's activations)

- runtime: the interpreter with JAX, XLA's compiled programs, the tokenizer and the environments
  (`RUNTIME_BYTES`, measured), and a run that learns its learner's programs (`LEARNER_RUNTIME_BYTES`);
- weights: the frozen base as stored (the layer matrices in the matmul dtype where it is lower than `dtype`,
  everything else in `dtype`);
- sampler copy: the sampler's per-layer copies of the layer matrices (`Sampler(unstack_layers=True)`), one
  more copy of them, made for each rollout and freed before learning (`Sampler.release_copies`);
- trainable state: LoRA and the value head (a critic LoRA too), each as parameters, gradients and Adam's two
  moments;
- sampling: the KV cache, 2 x layers x KV heads x head size x rows x (prompt + new tokens) in the cache dtype;
- behaviour pass and learner: each pass's rows times its length times the per-layer activations it keeps
  (`remat`; the learner also about one more copy of the layer matrices and what the behaviour pass leaves
  resident, measured), plus one row's float32
  logits over the vocabulary at a piece of its action tokens, `LOGIT_BUFFERS` of them
  (`core.policy.rowwise_policy_terms`: one device; on a mesh every row's at once).

A run that does not learn (`learn=False`) has no behaviour pass and no learner: its peak is the sampling's.
On a mesh (`config.mesh`, `Shares`) the estimate is one device's share: the frozen base and the sampler's
copy split over fsdp x tensor, the rows over data x fsdp, the heads, MLP columns and vocabulary over tensor;
the runtime and the trainable state (replicated) are whole.

Pure: reads the config and, for a model on disk, its config.json; loads no weights.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import resource
from typing import Any

from poad_jax.core.policy import output_pieces
from poad_jax.run.config.settings import Mesh, Run

MIB = 2**20
RUNTIME_BYTES = 420 * MIB  # Python, JAX, XLA, tokenizer, environments, the sampler's programs: the toy run
# without learning (`learn=False`) peaks at 425 MiB
LEARNER_RUNTIME_BYTES = 180 * MIB  # compiling and holding the behaviour pass's and the update's programs: the
# toy run that learns peaks at 591 MiB (docs/performance.md)
LOGIT_BUFFERS = 3  # float32 [rows, action tokens, vocabulary] buffers a pass holds at once (logits, log-softmax, exp)
GRADIENT_LOGIT_BUFFERS = 8  # the learner's, recomputed in the backward pass with their cotangents (fits XLA's temporaries: docs/performance.md)
PROMPT_TOKENS = 384  # a prompt's tokens (the settings give no bound; DataSciCoding's first prompts, its learner's shape)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Per layer and row-token, the activations the learner's layer scan keeps for its backward pass, in units of
# (hidden, attention q/kv, MLP intermediate) widths: "full" keeps the layer's input; "dots" every matmul's output;
# "none" every intermediate (the matmul outputs, the norms, the attention's probabilities aside).
REMAT_WIDTHS = {"full": (1, 0, 0), "dots": (2, 1, 3), "none": (6, 2, 5)}


@dataclasses.dataclass(frozen=True)
class Geometry:
    """A LLaMA-family model's sizes (what the estimate reads of it)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tied_embeddings: bool
    qkv_bias: bool

    def layer_matrix_params(self) -> int:
        """Parameters of the layer matrices, all layers (q, k, v, o and the MLP's three)."""
        h, q, kv, i = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, \
            self.intermediate_size
        return self.num_layers * (2 * h * q + 2 * h * kv + 3 * h * i)

    def embedding_params(self) -> int:
        """The embedding and, untied, the output layer."""
        return self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)

    def vector_params(self) -> int:
        """Norms and biases (kept in `dtype` whatever the matmul dtype)."""
        h = self.hidden_size
        bias = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim if self.qkv_bias else 0
        return h + self.num_layers * (2 * h + bias)


@dataclasses.dataclass(frozen=True)
class Expected:
    """A run's expected peak, by part (bytes); `total` is the peak."""

    runtime: int
    weights: int
    sampler_copy: int
    trainable: int
    sampling: int
    behaviour: int
    learner: int
    params: int  # the model's parameter count (for the line)
    devices: int = 1  # the mesh's devices: every part but the runtime and trainable state is one device's share

    @property
    def phase(self) -> tuple[str, int]:
        """The phase that adds the most, and what it adds."""
        return max((("sampling", self.sampler_copy + self.sampling), ("behaviour pass", self.behaviour),
                    ("learner", self.learner)), key=lambda item: item[1])

    @property
    def total(self) -> int:
        return self.runtime + self.weights + self.trainable + self.phase[1]

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "total": self.total, "peak_phase": self.phase[0]}


def geometry_from_hf(hf: dict[str, Any]) -> Geometry:
    """The sizes of a Hugging Face config.json (LLaMA or Qwen2)."""
    heads = int(hf["num_attention_heads"])
    return Geometry(
        vocab_size=int(hf["vocab_size"]), hidden_size=int(hf["hidden_size"]),
        intermediate_size=int(hf["intermediate_size"]), num_layers=int(hf["num_hidden_layers"]),
        num_heads=heads, num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or int(hf["hidden_size"]) // heads),
        tied_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=hf.get("model_type") == "qwen2" or bool(hf.get("attention_bias", False)))


def model_geometry(model: str) -> Geometry | None:
    """The sizes of `config.model` without loading it: the tiny random model's, an HF directory's or an
    embedded model's converted config.json (None before its first conversion, or for a .gguf file)."""
    if model == "tiny-random":
        import inspect

        from poad_jax.models.tiny import WordTokenizer, tiny_random_model

        defaults = inspect.signature(tiny_random_model).parameters
        hidden, layers = defaults["hidden_size"].default, defaults["num_layers"].default
        return Geometry(vocab_size=WordTokenizer().vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                        num_layers=layers, num_heads=4, num_kv_heads=2, head_dim=hidden // 4, tied_embeddings=True,
                        qkv_bias=False)
    from poad_jax.models.loading import EMBEDDED_MODELS, cache_root

    directory = cache_root() / "models" / model if model in EMBEDDED_MODELS else pathlib.Path(model).expanduser()
    try:
        return geometry_from_hf(json.loads((directory / "config.json").read_text()))
    except (OSError, ValueError, KeyError):
        return None


@dataclasses.dataclass(frozen=True)
class Shares:
    """How a mesh (`config.mesh`: data x fsdp x tensor devices) splits a run; all 1 on one device.

    rows = data x fsdp (the batch rows), weights = fsdp x tensor (the frozen base), width = tensor (heads,
    MLP columns, vocabulary); devices = data x fsdp x tensor.
    """

    data: int = 1
    fsdp: int = 1
    tensor: int = 1

    @property
    def rows(self) -> int:
        return self.data * self.fsdp

    @property
    def weights(self) -> int:
        return self.fsdp * self.tensor

    @property
    def devices(self) -> int:
        return self.data * self.fsdp * self.tensor


def mesh_shares(mesh: Mesh, devices: int | None = None) -> Shares:
    """`Shares` of a run's mesh section; a -1 axis takes the `devices` the others leave, or 1 where
    `devices` is None (the larger share: an estimate made before the devices are known errs high)."""
    from poad_jax.parallel.sharding import mesh_shape

    known = 1
    for size in (mesh.data, mesh.fsdp, mesh.tensor):
        known *= max(size, 1)
    return Shares(*mesh_shape(mesh, devices if devices is not None else known))


def trainable_bytes(run: Run, g: Geometry) -> int:
    """LoRA (the actor's; a critic's too), the value head and its target, in float32: parameters, gradient
    and Adam's two moments, 4 x 4 bytes a trainable parameter, and 4 a target-head parameter."""
    lora = run.lora.rank * g.num_layers * sum(
        g.hidden_size + (g.num_kv_heads * g.head_dim if t in ("k_proj", "v_proj") else
                         g.intermediate_size if t in ("gate_proj", "up_proj") else
                         g.num_heads * g.head_dim if t == "q_proj" else g.hidden_size)
        for t in run.lora.targets)
    sizes = (g.hidden_size, *run.critic.hidden_sizes, 1)
    head = sum(a * b for a, b in zip(sizes, sizes[1:]))
    critic_lora = lora if run.critic.kind == "lora" else 0
    return 4 * 4 * (lora + head + critic_lora) + 4 * head


def pass_bytes(run: Run, g: Geometry, stored: int, shares: Shares) -> tuple[int, int]:
    """(behaviour pass, learner): what each adds at its peak on one device.

        behaviour = rows x length x one layer's working set + logits x LOGIT_BUFFERS (old log-probs recomputed)
        learner   = micro-batch rows x length x (kept activations + 2 x one layer) + logits x
                    GRADIENT_LOGIT_BUFFERS + one more copy of the layer matrices + behaviour (measured)

    rows are the device's (/ shares.rows); the widths of heads, MLP and vocabulary its share (/ tensor);
    logits are one piece of a row's on one device (`rowwise_policy_terms`), every row's on a mesh.
    Both 0 for a run that does not learn (`learn=False`)."""
    if not run.learn:
        return 0, 0
    width = shares.tensor
    rows = max(run.rollout.num_threads * run.rollout.rollout_length // shares.rows, 1)
    learner_rows = max(rows // (run.ppo.num_minibatches * run.ppo.accumulation_steps), 1)
    length = PROMPT_TOKENS + run.sampling.max_new_tokens
    q, kv, i = g.num_heads * g.head_dim // width, g.num_kv_heads * g.head_dim // width, g.intermediate_size // width
    hw, qw, iw = REMAT_WIDTHS[run.remat]
    kept = g.num_layers * (hw * g.hidden_size + qw * (q + 2 * kv) + iw * i) * 4
    one_layer = (4 * g.hidden_size + q + 2 * kv + 3 * i) * 4  # a layer's working set, float32
    new = run.sampling.max_new_tokens
    row_logits = new * g.vocab_size // width * 4  # one row's float32 logits
    piece_logits = row_logits // output_pieces(new)  # one device: a piece of a row at a time
    behaviour_logits, learner_logits = (piece_logits, piece_logits) if shares.devices == 1 else \
        (rows * row_logits, learner_rows * row_logits)
    behaviour = rows * length * one_layer + (behaviour_logits * LOGIT_BUFFERS
                                             if run.rollout.behaviour_logprobs != "sampler" else 0)
    # the learner's phase also holds about one more copy of the layer matrices (XLA's temporaries at full:
    # 1 338 MiB of which 654 activations and logits), and what the behaviour pass leaves resident in the heap
    # (1 258 MiB measured after it, against its 823 MiB here: docs/performance.md)
    learner = learner_rows * length * (kept + 2 * one_layer) + learner_logits * GRADIENT_LOGIT_BUFFERS \
        + g.layer_matrix_params() * stored // shares.weights + behaviour
    return behaviour, learner


def expected_peak(run: Run, geometry: Geometry | None = None, devices: int | None = None) -> Expected | None:
    """`Expected` for a run's typed settings (`matmul_dtype` resolved, or "auto" read as
    bfloat16, the larger copy never being the case); None where the model's sizes are unknown.  On a mesh
    one device's share (`Shares`; a -1 axis resolved against `devices`, `mesh_shares`)."""
    geometry = geometry or model_geometry(run.model)
    if geometry is None:
        return None
    g, dtype, shares = geometry, DTYPE_BYTES[run.dtype], mesh_shares(run.mesh, devices)
    matmul = run.matmul_dtype if run.matmul_dtype in DTYPE_BYTES else "bfloat16"
    stored = min(dtype, DTYPE_BYTES[matmul])
    matrices = g.layer_matrix_params()
    weights = ((matrices + g.embedding_params()) * stored + g.vector_params() * dtype) // shares.weights
    # the decoder's per-layer copies (and a tied embedding's transpose: the output layer)
    sampler_copy = (matrices + (g.vocab_size * g.hidden_size if g.tied_embeddings else 0)) * stored // shares.weights
    threads = max(run.rollout.num_threads // shares.rows, 1)
    cache = DTYPE_BYTES[matmul] if stored < dtype else dtype
    sampling = 2 * g.num_layers * g.num_kv_heads * g.head_dim // shares.tensor * threads * (
        PROMPT_TOKENS + run.sampling.max_new_tokens) * cache
    behaviour, learner = pass_bytes(run, g, stored, shares)
    params = matrices + g.embedding_params() + g.vector_params()
    runtime = RUNTIME_BYTES + (LEARNER_RUNTIME_BYTES if run.learn else 0)
    return Expected(runtime, weights, sampler_copy, trainable_bytes(run, g), sampling, behaviour, learner,
                    params, shares.devices)


def gib(value: int) -> str:
    return f"{value / 2**30:.1f} GiB"


def expected_line(expected: Expected | None) -> str:
    """The run's one line about its expected peak."""
    if expected is None:
        return "expected peak memory: unknown (the model's sizes are read after its first conversion)"
    phase, added = expected.phase
    device = f" per device of {expected.devices}" if expected.devices > 1 else ""
    return (f"expected peak memory{device}: {gib(expected.total)} (runtime {gib(expected.runtime)}, weights "
            f"{gib(expected.weights)} for {expected.params / 1e6:.0f}M parameters, trainable state "
            f"{expected.trainable / MIB:.0f} MiB, and at its peak the {phase} {gib(added)})")


def available_bytes(meminfo: str | pathlib.Path = "/proc/meminfo") -> int | None:
    """MemAvailable of Linux's /proc/meminfo, in bytes; None where it cannot be read."""
    try:
        for line in pathlib.Path(meminfo).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


LOWERING_SETTINGS = {  # the settings that lower each phase's part, the most effective first
    "sampling": ("--config.num_threads", "--config.sampling.max_new_tokens"),
    "behaviour pass": ("--config.num_threads", "--config.sampling.max_new_tokens"),
    "learner": ("--config.ppo.accumulation_steps (smaller micro-batches)", "--config.remat=full",
                "--config.num_threads", "--config.sampling.max_new_tokens"),
}


def peak_rss_mb(status: str | pathlib.Path = "/proc/self/status") -> float:
    """This process's peak resident memory in MiB: Linux's VmHWM, the high-water mark of its own address
    space.  Not `ru_maxrss` where VmHWM can be read: the kernel carries `ru_maxrss` across `execve`, so a
    trainer started by a large process (a test worker, a notebook) would report its parent's size."""
    try:
        for line in pathlib.Path(status).read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0  # kB
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def memory_warning(expected: Expected | None, available: int | None) -> str | None:
    """One line when the machine's available memory is below the expected peak (None otherwise)."""
    if expected is None or available is None or available >= expected.total:
        return None
    phase = expected.phase[0]
    return (f"warning: this run expects to need {gib(expected.total)} at its peak ({phase}), but the machine has "
            f"{gib(available)} available: the kernel may kill it; lower the peak with "
            f"{', '.join(LOWERING_SETTINGS[phase])}, or run fewer processes beside it")
