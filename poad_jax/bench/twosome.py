"""`python -m poad_jax.bench twosome`: the learner's memory and time, POAD vs TWOSOME.

Compiles the PPO update (`learner.jit_update`) on synthetic batches of
given shapes (default: VirtualHome food preparation on SmolLM2-135M shapes,
4 threads x 32 steps = 128 rows in 4 minibatches, prompts bucketed to 128
tokens, actions to 8, 7 candidates per state) for three variants:

- `poad`: one row per step, prompt + chosen action (token level);
- `twosome`: every candidate of a state, each state's prompt encoded once
  (`policy.shared_prompt_token_logprobs`);
- `twosome-per-candidate`: every candidate as its own prompt + action row
  (`Method.share_prompt=False`, the computation before prompt sharing).

For each it prints XLA's memory analysis of the compiled update (temporary
buffers = activations and workspace; peak = arguments + outputs - aliased +
temporaries, the figure XLA plans with, whatever the machine's load) and,
unless `--steps=0`, the median wall time of `--steps` updates after the
first.  Random weights of the model's shapes (`_shapes.SHAPES`): weight
values change neither memory nor speed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from poad_jax.run.config.errors import ArgumentParser

VARIANTS = ("poad", "twosome", "twosome-per-candidate")


def parse(argv: list[str]) -> argparse.Namespace:
    from poad_jax.bench._shapes import SHAPES

    parser = ArgumentParser(prog="python -m poad_jax.bench twosome", description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--steps-per-thread", type=int, default=32, help="rollout length")
    parser.add_argument("--minibatches", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=128, help="prompt bucket P")
    parser.add_argument("--action", type=int, default=8, help="action bucket A")
    parser.add_argument("--candidates", type=int, default=7, help="candidates per state K")
    parser.add_argument("--matmul-dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--steps", type=int, default=1, help="timed updates per variant (0: memory only)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant {unknown[0]!r}; choose from {', '.join(VARIANTS)}")
    rows = args.threads * args.steps_per_thread
    if rows % args.minibatches:
        parser.error(f"threads x steps-per-thread ({rows}) must be divisible by --minibatches")
    return args


def synthetic_batch(variant: str, args, vocab: int, hidden: int):
    """A TokenBatch of the variant's layout: every token real, random ids."""
    import jax.numpy as jnp
    import numpy as np

    from poad_jax.core.token_batch import ActionLevelBatch, TokenLevelBatch

    rng = np.random.default_rng(0)
    rows, prompt_len, action_len, k = args.threads * args.steps_per_thread, args.prompt, args.action, args.candidates
    prompts = rng.integers(5, vocab, size=(rows, prompt_len))
    positions = np.arange(prompt_len + action_len, dtype=np.int32)
    common = dict(
        rewards=jnp.asarray(rng.normal(size=rows), jnp.float32),
        dones=jnp.zeros((rows,), bool),
        bootstrap_value=jnp.zeros((args.threads,), jnp.float32),
    )
    if variant == "poad":
        tokens = np.concatenate([prompts, rng.integers(5, vocab, size=(rows, action_len))], axis=1)
        return TokenLevelBatch(
            tokens=jnp.asarray(tokens, jnp.int32),
            positions=jnp.asarray(np.broadcast_to(positions, tokens.shape)),
            key_mask=jnp.ones(tokens.shape, bool),
            action_mask=jnp.ones((rows, action_len), bool),
            old_logprobs=jnp.full((rows, action_len), -1.0, jnp.float32),
            old_values=jnp.zeros((rows, action_len), jnp.float32),
            features=jnp.asarray(rng.normal(size=(rows, action_len, hidden)), jnp.float32),
            allowed_tokens=jnp.zeros((rows, action_len, 1), jnp.int32),
            allowed_mask=jnp.zeros((rows, action_len, 1), bool),
            **common,
        )
    actions = rng.integers(5, vocab, size=(rows, k, action_len))
    tokens = np.concatenate([np.broadcast_to(prompts[:, None], (rows, k, prompt_len)), actions], axis=2)
    return ActionLevelBatch(
        tokens=jnp.asarray(tokens, jnp.int32),
        positions=jnp.asarray(np.broadcast_to(positions, tokens.shape)),
        key_mask=jnp.ones(tokens.shape, bool),
        action_mask=jnp.ones((rows, k, action_len), bool),
        old_logprobs=jnp.full((rows,), -np.log(k), jnp.float32),
        old_values=jnp.zeros((rows,), jnp.float32),
        features=jnp.asarray(rng.normal(size=(rows, hidden)), jnp.float32),
        chosen=jnp.asarray(rng.integers(0, k, size=rows), jnp.int32),
        candidate_mask=jnp.ones((rows, k), bool),
        normalizer=jnp.full((rows, k), float(action_len), jnp.float32),
        **common,
    )


def measure(variant: str, args) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from poad_jax.agent import learner as learner_lib
    from poad_jax.bench._shapes import build_random_model
    from poad_jax.run.config import learner_config
    from poad_jax.agent.methods import make_method
    from poad_jax.models.llama import LoraConfig
    from poad_jax.core.critic_config import CriticConfig
    from poad_jax.core.policy import ValueHead, split_policy

    matmul_dtype = None if args.matmul_dtype == "float32" else jnp.bfloat16
    model = build_random_model(args.shape, lora=LoraConfig(), dtype=jnp.float32, matmul_dtype=matmul_dtype)
    head = ValueHead(model.config.hidden_size, CriticConfig(), rngs=nnx.Rngs(1))
    graph, frozen, params = split_policy(model, head)
    vocab, hidden = model.config.vocab_size, model.config.hidden_size
    del model, head
    method = make_method("twosome" if variant.startswith("twosome") else "poad", 0.95,
                         share_prompt=variant != "twosome-per-candidate")
    lconfig = learner_config(gamma=0.95, num_minibatches=args.minibatches, target_kl=1e9)
    batch = synthetic_batch(variant, args, vocab, hidden)
    update, _ = learner_lib.jit_update(graph, method, lconfig)
    state = learner_lib.init_train_state(params, lconfig, jax.random.key(0))
    start = time.perf_counter()
    compiled = update.lower(state, frozen, batch).compile()
    compile_s = time.perf_counter() - start
    memory = compiled.memory_analysis()
    mib = lambda n: n / 2**20
    result = {
        "variant": variant,
        "compile_s": round(compile_s, 1),
        "temp_mib": round(mib(memory.temp_size_in_bytes), 1),
        "argument_mib": round(mib(memory.argument_size_in_bytes), 1),
        "peak_mib": round(mib(memory.argument_size_in_bytes + memory.output_size_in_bytes
                              - memory.alias_size_in_bytes + memory.temp_size_in_bytes), 1),
    }
    times = []
    for step in range(args.steps + 1 if args.steps else 0):
        begin = time.perf_counter()
        state, metrics = compiled(state, frozen, batch)
        jax.block_until_ready(metrics)
        if step:  # the first call warms up
            times.append(time.perf_counter() - begin)
    if times:
        result["update_s"] = round(statistics.median(times), 2)
    return result


def main(argv: list[str]) -> int:
    args = parse(argv)
    results = []
    rows = args.threads * args.steps_per_thread
    print(f"twosome: {args.shape}, {rows} rows in {args.minibatches} minibatches, prompt {args.prompt}, "
          f"action {args.action}, {args.candidates} candidates, matmuls {args.matmul_dtype}")
    print(f"{'variant':24s} {'temp MiB':>10s} {'peak MiB':>10s} {'update s':>10s} {'compile s':>10s}")
    for variant in args.variants:
        result = measure(variant, args)
        results.append(result)
        print(f"{variant:24s} {result['temp_mib']:10.1f} {result['peak_mib']:10.1f} "
              f"{result.get('update_s', float('nan')):10.2f} {result['compile_s']:10.1f}", flush=True)
    print(json.dumps({"bench": "twosome", "shape": args.shape, "rows": rows, "prompt": args.prompt,
                      "action": args.action, "candidates": args.candidates, "matmul_dtype": args.matmul_dtype,
                      "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
