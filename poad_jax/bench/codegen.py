"""`python -m poad_jax.bench codegen [--models a,b] [--samples 32] [--max-new-tokens N] [--iteration]`

How good is each embedded model at DataSciCoding before any training?
Samples `--samples` programs per model for the balance_scale task with the
chat template and the sampling of configs/datasci.py (temperature 0.5,
top-k 50, its max_new_tokens unless `--max-new-tokens` is given), runs
each in the sandbox, and reports the success rate (runnable code returning
a classifier), the mean ROC AUC of the successes, and how many programs
were cut off (no stop token within max_new_tokens) with the longest
generation.  `--iteration` also times one PPO iteration of that config
with each model.  Last line: one JSON object.
"""

from __future__ import annotations

import json
import pathlib
import tempfile
import time

import jax
import numpy as np

import envs_py
from poad_jax.run.config.errors import ArgumentParser
from poad_jax.run import train
from poad_jax.run import build
from poad_jax.run import config as config_lib
from poad_jax.sampling import Sampler, SamplingConfig

REPO = pathlib.Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "datasci.py"


def sample_programs(model_name: str, samples: int, batch: int, seed: int,
                    max_new_tokens: int | None = None) -> tuple[list[str], list[int], list[bool], float]:
    """(programs, their lengths in tokens, whether each was cut off by max_new_tokens, seconds)."""
    config = config_lib.load_config_file(CONFIG)
    config.model = model_name
    run = config_lib.typed(config)
    model, tokenizer = build.load_model(run)
    env = envs_py.make(run.env.name, **dict(run.env.kwargs))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": env.reset(seed=0).text}])
    sampling = SamplingConfig(
        temperature=run.sampling.temperature, top_k=run.sampling.top_k,
        max_new_tokens=max_new_tokens or run.sampling.max_new_tokens, stop_token_ids=tuple(tokenizer.eos_token_ids),
    )
    sampler = Sampler(model)
    texts, lengths, cut = [], [], []
    rng = jax.random.key(seed)
    start = time.perf_counter()
    while len(texts) < samples:
        rng, key = jax.random.split(rng)
        n = min(batch, samples - len(texts))
        generation = sampler.generate([prompt] * n, key, sampling, tokenizer)
        texts.extend(tokenizer.decode(t.tolist(), skip_special_tokens=True) for t in generation.tokens)
        lengths.extend(int(length) for length in generation.lengths)
        cut.extend(reason == "length" for reason in generation.finish_reasons)
    return texts, lengths, cut, time.perf_counter() - start


def score_programs(texts: list[str]) -> list[dict]:
    config = config_lib.load_config_file(CONFIG)
    results = []
    for text in texts:
        env = envs_py.make(config.env.name, **dict(config.env.kwargs, max_attempts=1))
        env.reset(seed=0)
        step = env.step(text)
        results.append({"success": bool(step.info.get("success")), "reward": float(step.reward),
                        "error": str(step.info.get("error", ""))[:120]})
    return results


def iteration_seconds(model_name: str) -> dict[str, float]:
    config = config_lib.load_config_file(CONFIG)
    config.model = model_name
    config.tensorboard = False
    config.plot = False
    with tempfile.TemporaryDirectory() as workdir:
        record = train.run(config, workdir, show_progress=False, max_updates=1).records[-1]
    keys = ("seconds_sampling", "seconds_env", "seconds_behaviour", "seconds_learner", "peak_rss_mb")
    return {key: record[key] for key in keys}


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="python -m poad_jax.bench codegen")
    parser.add_argument("--models", default="smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: configs/datasci.py's")
    parser.add_argument("--iteration", action="store_true", help="also time one PPO iteration per model")
    parser.add_argument("--show", type=int, default=0, help="print the first N programs and their outcomes")
    args = parser.parse_args(argv)
    max_new_tokens = args.max_new_tokens or int(config_lib.load_config_file(CONFIG).sampling.max_new_tokens)
    summary = {"bench": "codegen", "samples": args.samples, "max_new_tokens": max_new_tokens, "models": {}}
    print(f"{'model':<30}{'success':>9}{'mean AUC':>10}{'cut off':>9}{'longest':>9}{'gen s':>8}")
    for name in args.models.split(","):
        texts, lengths, cut, seconds = sample_programs(name, args.samples, args.batch, args.seed, max_new_tokens)
        results = score_programs(texts)
        for text, result in list(zip(texts, results))[: args.show]:
            outcome = f"AUC {result['reward']:.3f}" if result["success"] else f"failed: {result['error']}"
            print(f"--- {name}: {outcome}\n{text}\n")
        aucs = [r["reward"] for r in results if r["success"]]
        entry = {
            "success_rate": float(np.mean([r["success"] for r in results])),
            "mean_auc": float(np.mean(aucs)) if aucs else None,
            "generation_seconds": seconds,
            "cut_off": int(sum(cut)),
            "lengths": lengths,
            "errors": sorted({r["error"].splitlines()[-1] if r["error"] else ""
                              for r in results if not r["success"]})[:5],
        }
        if args.iteration:
            entry["iteration"] = iteration_seconds(name)
        summary["models"][name] = entry
        auc = f"{entry['mean_auc']:.3f}" if entry["mean_auc"] is not None else "-"
        print(f"{name:<30}{entry['success_rate']:>9.2f}{auc:>10}{entry['cut_off']:>9}{max(lengths):>9}{seconds:>8.0f}")
        if args.iteration:
            print("   one PPO iteration:", {k: round(v, 1) for k, v in entry["iteration"].items()})
    print(json.dumps(summary))
    return 0
