"""`python -m poad_jax.bench logprob_gap --config=configs/virtualhome.py`: could the
behaviour pass take the actor's old log-probs from the sampler?

The behaviour pass (`agent/experience.py`) runs the actor over every packed row
again to get log pi_old(w_j) for PPO's ratio, although the sampler produced a
log-prob for every token it decoded.  Reusing those would skip one of the
pass's three forwards, but the sampler decodes with a KV cache (other matmul
shapes, other rounding) and the first ratio would no longer be exactly 1.
This measures, on real rollouts of the config's model and env, the gap
between the two:

    ratio_j - 1 = exp(log pi_behaviour(w_j) - log pi_sampler(w_j)) - 1

over every real action token, at the run's matmul dtype.  Issue 31 allows the
reuse only if max |ratio - 1| <= 1e-5 at the first minibatch.  Runs `--rollouts`
rollouts with the initial weights (random LoRA A, zero B: the base's numerics)
and, with `--perturb_lora`, with LoRA B drawn at that scale too (adapters on).
Token-level methods only (TWOSOME scores candidates; nothing is decoded).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import numpy as np

from poad_jax.bench._flags import parse_or_report

THRESHOLD = 1e-5  # issue 31's bound on |ratio - 1| at the first minibatch


def parse(argv: list[str]):
    from absl import flags
    from ml_collections import config_flags

    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", "configs/virtualhome.py", "Training config file.",
                                    flag_values=values)
    flags.DEFINE_integer("rollouts", 2, "Rollouts to collect (num_threads x rollout_length steps each).",
                         flag_values=values)
    flags.DEFINE_float("perturb_lora", 0.0, "Standard deviation of random LoRA B weights (0: as initialised).",
                       flag_values=values)
    values(["logprob_gap", *argv])
    return values


def ratio_gaps(behaviour: np.ndarray, sampled: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """|exp(behaviour - sampled) - 1| at the valid entries (float64), the first PPO ratio's distance from 1."""
    return np.abs(np.expm1(behaviour[valid].astype(np.float64) - sampled[valid].astype(np.float64)))


def packed_sampler_logprobs(steps, action_len: int) -> tuple[np.ndarray, np.ndarray]:
    """The records' sampler log-probs `[N, A]` (thread-major, as `pack_batch` orders rows) and where they exist."""
    from poad_jax.agent.experience import thread_major_rows

    rows = thread_major_rows(steps)
    values = np.zeros((len(rows), action_len), np.float32)
    known = np.zeros((len(rows), action_len), bool)
    for n, row in enumerate(rows):
        if row.sampler_logprobs is not None:
            values[n, :len(row.sampler_logprobs)] = row.sampler_logprobs
            known[n, :len(row.sampler_logprobs)] = True
    return values, known


def summary(gaps: np.ndarray) -> dict:
    """Max, mean and 99th percentile of |ratio - 1|, and the fraction above the issue's bound."""
    return {"tokens": int(gaps.size), "max": float(gaps.max()), "mean": float(gaps.mean()),
            "p99": float(np.quantile(gaps, 0.99)), "above_1e-5": float(np.mean(gaps > THRESHOLD))}


def main(argv: list[str]) -> int:
    values = parse_or_report(parse, argv, __doc__)
    if values is None:
        return 2
    import jax

    from poad_jax.agent.experience import behaviour_statistics, pack_batch
    from poad_jax.agent.rollout import RolloutCollector
    from poad_jax.run import build as build_lib
    from poad_jax.run import config as config_lib
    from poad_jax.run import hardware
    from poad_jax.run.train import build_envs

    config = values.config
    hardware.resolve_config(config)  # "auto": this machine's dtype, named in the summary line
    config.behaviour_logprobs = "recompute"  # the behaviour pass's own log-probs, set against the sampler's
    run = config_lib.typed(config)  # as resolved above: the command's one typing of its config
    built = build_lib.build(run)
    if not built.method.scheme.token_level:
        print("error: logprob_gap needs a token-level method (poad or ntpo): TWOSOME decodes nothing",
              file=sys.stderr)
        return 2
    params = built.params
    if values.perturb_lora > 0:
        rng = np.random.default_rng(0)
        params = dict(params, actor=jax.tree_util.tree_map_with_path(
            lambda path, x: (x + rng.normal(0, values.perturb_lora, x.shape).astype(x.dtype)
                             if "lora_b" in jax.tree_util.keystr(path) else x), params["actor"]))
    envs = build_envs(run, run.rollout.num_threads, built.seeds.envs)
    where = built.placement
    sampler = where.sampler(built.graph, built.frozen, params, built.rollout.prompt_buckets)
    # The sampler records the untruncated policy's log-probs, as it does where they become the old ones.
    rollout = dataclasses.replace(built.rollout, sampling=dataclasses.replace(built.rollout.sampling,
                                                                              logprobs_of="policy"))
    collector = RolloutCollector(envs, built.tokenizer, sampler, built.method, rollout, seed=built.seeds.numpy)
    where.own_threads(collector, run.rollout.num_threads, run.seed)
    rng = jax.random.key(run.seed)
    all_gaps, start = [], time.perf_counter()
    try:
        for index in range(int(values.rollouts)):
            rng, key = jax.random.split(rng)
            steps, next_prompts = collector.collect(key)
            arrays, next_arrays = pack_batch(steps, next_prompts, built.method, rollout,
                                             built.tokenizer.pad_token_id)
            stats = behaviour_statistics(built.graph, built.frozen, params, params["head"], arrays, next_arrays,
                                         method=built.method, temperature=built.learner.temperature,
                                         critic_kind=built.learner.critic_kind)
            behaviour = np.asarray(stats["old_logprobs"])
            sampled, known = packed_sampler_logprobs(steps, behaviour.shape[1])
            valid = known & np.asarray(arrays["action_mask"])
            gaps = ratio_gaps(behaviour, sampled, valid)
            all_gaps.append(gaps)
            print(f"rollout {index + 1}: {gaps.size} tokens, max |ratio - 1| {gaps.max():.3g}, "
                  f"mean {gaps.mean():.3g}", flush=True)
    finally:
        envs.close()
    result = summary(np.concatenate(all_gaps))
    dtype = run.matmul_dtype
    verdict = "within" if result["max"] <= THRESHOLD else "ABOVE"
    print(f"\n{run.method} {run.env.name}, {run.model}, matmul {dtype}, LoRA B "
          f"{'perturbed at ' + str(values.perturb_lora) if values.perturb_lora > 0 else 'as initialised'}: "
          f"max |ratio - 1| {result['max']:.3g} ({verdict} the 1e-5 bound), mean {result['mean']:.3g}, "
          f"p99 {result['p99']:.3g}, {100 * result['above_1e-5']:.1f} % of {result['tokens']} tokens above 1e-5 "
          f"({time.perf_counter() - start:.0f} s)")
    print(json.dumps({"bench": "logprob_gap", "method": run.method, "env": run.env.name,
                      "model": run.model, "matmul_dtype": dtype, "perturb_lora": values.perturb_lora,
                      **result}))
    return 0
