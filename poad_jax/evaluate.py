"""`python -m poad_jax.evaluate --workdir W --env NAME [--env NAME2 ...] --episodes N`

Evaluates a run's trained actor: for each environment, N episodes with the
policy sampled as in training and N greedy (temperature 0; trie decoding
picks the most likely valid action token by token), and prints return and
success rate per env in one table.  `--env all-virtualhome` expands to the
VirtualHome food-preparation task and all its generalisation variants.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys

import jax
import numpy as np

import envs_py
from poad_jax.export import ExportError, load_trained_actor
from poad_jax.methods import make_method
from poad_jax.rollout import RolloutCollector
from poad_jax.sampling import Sampler

def expand_env_names(names: list[str]) -> list[str]:
    """Expands `all-virtualhome` to food preparation and all its registered variants."""
    expanded = []
    for name in names:
        if name == "all-virtualhome":
            expanded.extend(n for n in envs_py.registry() if n.startswith("virtualhome/food_preparation"))
        else:
            expanded.append(name)
    return expanded


@dataclasses.dataclass
class EvalResult:
    env: str
    mode: str
    episodes: int
    mean_return: float
    success_rate: float


def evaluate_env(model, tokenizer, config, env_name: str, episodes: int, greedy: bool, seed: int, max_steps: int) -> EvalResult:
    """Plays `episodes` full episodes (threads in parallel) and averages return and success."""
    from poad_jax.train import rollout_config

    method = make_method(config.method, float(config.ppo.gamma))
    rconfig = rollout_config(config, tuple(tokenizer.eos_token_ids))
    sampling = dataclasses.replace(rconfig.sampling, temperature=0.0 if greedy else rconfig.sampling.temperature)
    threads = min(episodes, int(config.num_threads))
    rconfig = dataclasses.replace(rconfig, sampling=sampling, num_threads=threads, rollout_length=1)
    kwargs = dict(config.env.kwargs) if env_name == config.env.name else {}
    envs = envs_py.VectorEnv(env_name, threads, seed=seed, mode=str(config.env.vector_mode), **kwargs)
    collector = RolloutCollector(envs, tokenizer, Sampler(), method, rconfig, seed=seed)
    rng = jax.random.key(seed)
    steps = 0
    try:
        while len(collector.stats.finished_returns) < episodes and steps < max_steps:
            rng, step_rng = jax.random.split(rng)
            collector.collect(model, step_rng)
            steps += 1
    finally:
        envs.close()
    returns = collector.stats.finished_returns[:episodes]
    success = collector.stats.finished_success[:episodes]
    return EvalResult(
        env_name, "greedy" if greedy else "sampled", len(returns),
        float(np.mean(returns)) if returns else float("nan"),
        float(np.mean(success)) if success else float("nan"),
    )


def format_table(results: list[EvalResult]) -> str:
    lines = [f"{'environment':<44}{'mode':<9}{'episodes':>9}{'return':>10}{'success':>9}"]
    for r in results:
        lines.append(f"{r.env:<44}{r.mode:<9}{r.episodes:>9}{r.mean_return:>10.3f}{r.success_rate:>9.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m poad_jax.evaluate", description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--env", action="append", help="environment name (repeatable); default: the run's env")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--max-steps", type=int, default=1000, help="env steps per thread before giving up")
    parser.add_argument("--mode", choices=["both", "sampled", "greedy"], default="both")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        print("error: --episodes must be >= 1", file=sys.stderr)
        return 2
    try:
        config, model, tokenizer, _ = load_trained_actor(pathlib.Path(args.workdir))
    except ExportError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    names = expand_env_names(args.env or [config.env.name])
    known = envs_py.registry()
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"error: unknown environment(s) {', '.join(unknown)}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    modes = {"both": (False, True), "sampled": (False,), "greedy": (True,)}[args.mode]
    results = []
    for name in names:
        for greedy in modes:
            results.append(evaluate_env(model, tokenizer, config, name, args.episodes, greedy, args.seed, args.max_steps))
            print(format_table(results[-1:]).splitlines()[-1], flush=True)
    print()
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
