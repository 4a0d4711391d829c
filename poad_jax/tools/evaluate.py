"""`python -m poad_jax.evaluate --workdir W --env NAME [--env NAME2 ...] --episodes N`

Evaluates a run's trained actor: for each environment, N episodes with the
policy sampled as in training and N greedy (temperature 0; trie decoding
picks the most likely valid action token by token), and prints return and
success rate per env in one table.  `--env all-virtualhome` expands to the
VirtualHome food-preparation task and all its generalisation variants.

`--policy=token` plays the token policy the learner optimises instead of
the behaviour that drew training's actions; they differ for POAD and NTPO
runs that sampled from the action scores (`restricted_sampling=
"action_scores"`) or explored (`trie_explore_temperature`), where the
training curves show the behaviour's success, not the learned policy's.

`python -m poad_jax.evaluate --workdir W --best-program` instead re-scores
a DataSciCoding run's best program on its dataset's five splits
(`poad_jax.best_program`).  An environment in which no episode finishes
within `--max-steps` shows `-` in the table and makes the command end with
one error line and status 2 (never a NaN with status 0).
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import shlex
import sys
import time

import jax
import numpy as np

import envs_py
from poad_jax.run.config.errors import ArgumentParser
from poad_jax.agent.rollout import RolloutCollector
from poad_jax.run import best_program
from poad_jax.run import config as config_lib
from poad_jax.run.build import build_method
from poad_jax.sampling import Sampler
from poad_jax.tools.export import ExportError, load_trained_actor


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


POLICIES = ("behaviour", "token")


def policy_config(run: config_lib.Run, policy: str) -> config_lib.Run:
    """The run's settings `run` for playing `policy`. "behaviour": actions drawn as in training (the run's sampler and
    exploration temperature). "token": drawn from the token policy the learner optimises,
    pi(w_j | o, w_<j) renormalised over the offered continuations (trie sampling at the run's
    temperature, no exploration). The same for TWOSOME, free-form actions and plain trie sampling."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if policy == "behaviour":
        return run
    rollout = dataclasses.replace(run.rollout, restricted_sampling="trie", trie_explore_temperature=0.0)
    return dataclasses.replace(run, rollout=rollout)


def policies_differ(run: config_lib.Run) -> bool:
    """Whether a run's behaviour is not its token policy (a token-level method that sampled from the
    action scores or explored)."""
    return run.method != "twosome" and (
        run.rollout.restricted_sampling != "trie" or run.rollout.trie_explore_temperature > 0)


def playing_collector(model, tokenizer, run: config_lib.Run, env_name: str, threads: int, greedy: bool, seed: int,
                      policy: str = "behaviour") -> RolloutCollector:
    """A collector that plays `policy` (`policy_config`) of the trained `model` on `threads` threads of
    `env_name`, one env step per `collect`, sampled at the run's temperature or greedy; the caller
    closes `collector.envs`."""
    run = policy_config(run, policy)
    method = build_method(run)
    rconfig = config_lib.stopping_at(run.rollout, tuple(tokenizer.eos_token_ids))
    sampling = dataclasses.replace(rconfig.sampling, temperature=0.0 if greedy else rconfig.sampling.temperature)
    rconfig = dataclasses.replace(rconfig, sampling=sampling, num_threads=threads, rollout_length=1)
    env = run.env
    kwargs = env.kwargs if env_name == env.name else {}
    try:
        envs = envs_py.VectorEnv(env_name, threads, seed=seed, mode=env.vector_mode, **kwargs)
    except Exception as error:  # kwargs and data files are the user's: one line, not a traceback
        raise ExportError(f"cannot build environment {env_name!r}: {' '.join(str(error).split())}") from None
    return RolloutCollector(envs, tokenizer, Sampler(model, prompt_buckets=rconfig.prompt_buckets), method,
                            rconfig, seed=seed)


def evaluate_env(model, tokenizer, run: config_lib.Run, env_name: str, episodes: int, greedy: bool, seed: int, max_steps: int,
                 policy: str = "behaviour") -> EvalResult:
    """Plays `episodes` full episodes (threads in parallel) of `policy` (`policy_config`) and averages
    return and success."""
    threads = min(episodes, run.rollout.num_threads)
    collector = playing_collector(model, tokenizer, run, env_name, threads, greedy, seed, policy)
    rng = jax.random.key(seed)
    steps = 0
    try:
        while len(collector.stats.finished_returns) < episodes and steps < max_steps:
            rng, step_rng = jax.random.split(rng)
            collector.collect(step_rng)
            steps += 1
    finally:
        collector.envs.close()
    returns = collector.stats.finished_returns[:episodes]
    success = collector.stats.finished_success[:episodes]
    return EvalResult(
        env_name, "greedy" if greedy else "sampled", len(returns),
        float(np.mean(returns)) if returns else float("nan"),
        float(np.mean(success)) if success else float("nan"),
    )


def format_table(results: list[EvalResult]) -> str:
    """One row per (env, mode); `-` where no episode finished."""
    lines = [f"{'environment':<44}{'mode':<9}{'episodes':>9}{'return':>10}{'success':>9}"]
    for r in results:
        ret = f"{r.mean_return:.3f}" if r.episodes else "-"
        success = f"{r.success_rate:.2f}" if r.episodes else "-"
        lines.append(f"{r.env:<44}{r.mode:<9}{r.episodes:>9}{ret:>10}{success:>9}")
    return "\n".join(lines)


RESULTS_FILE = "evaluation.txt"
# Each policy's table in its own file, so that a run's behaviour and token policy can be compared side by side.
RESULTS_FILES = {"behaviour": RESULTS_FILE, "token": "evaluation_token.txt"}


def save_table(workdir: pathlib.Path, results: list[EvalResult], argv: list[str],
               policy: str = "behaviour") -> pathlib.Path | str:
    """Writes the table, with the command and the time it ran, to `<workdir>/evaluation.txt`
    (`evaluation_token.txt` for `--policy=token`), replacing an earlier evaluation of that policy; returns
    its path, or why it could not be written (a read-only run)."""
    path = workdir / RESULTS_FILES[policy]
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    text = f"# python -m poad_jax.evaluate {shlex.join(argv)}  ({when})\n{format_table(results)}\n"
    try:
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(text)
        temporary.replace(path)
    except OSError as error:
        return f"cannot save the table to {path}: {error.strerror or error}"
    return path


def unfinished_line(results: list[EvalResult], max_steps: int) -> str | None:
    """The error line for environments where no episode finished, else None."""
    empty = sorted({f"{r.env} ({r.mode})" for r in results if r.episodes == 0})
    if not empty:
        return None
    return (f"no episode finished within --max-steps {max_steps} in {', '.join(empty)}; "
            "raise --max-steps")


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m poad_jax.evaluate", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Plays a run's trained actor: per environment, N episodes sampled as in training and N\n"
                    "greedy; prints return and success per environment and mode, one row each, and saves\n"
                    f"the table to <workdir>/{RESULTS_FILE} ({RESULTS_FILES['token']} for --policy=token).",
        epilog="examples:\n"
               "  python -m poad_jax.evaluate --workdir=runs/toy-poad-20261125-120000 --episodes=20\n"
               "  python -m poad_jax.evaluate --workdir=runs/vh --env=all-virtualhome --mode=greedy\n"
               "  python -m poad_jax.evaluate --workdir=runs/vh-action-scores --policy=token")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--env", action="append", help="environment name (repeatable); default: the run's env")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--max-steps", type=int, default=1000, help="env steps per thread before giving up")
    parser.add_argument("--mode", choices=["both", "sampled", "greedy"], default="both")
    parser.add_argument("--policy", choices=POLICIES, default="behaviour",
                        help="behaviour: actions drawn as in training (default); token: from the token policy "
                             "the learner optimises (differs for POAD/NTPO runs with "
                             "restricted_sampling=action_scores or trie_explore_temperature > 0)")
    parser.add_argument("--best-program", action="store_true",
                        help="re-score the run's best DataSciCoding program instead (poad_jax.best_program)")
    args = parser.parse_args(argv)
    if args.best_program:
        return best_program.main(["--workdir", args.workdir])
    if args.episodes < 1 or args.max_steps < 1:
        print("error: --episodes and --max-steps must be >= 1", file=sys.stderr)
        return 2
    try:
        run, model, tokenizer, _ = load_trained_actor(pathlib.Path(args.workdir))  # the run's settings, typed
    except ExportError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    names = expand_env_names(args.env or [run.env.name])
    known = envs_py.registry()
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"error: unknown environment(s) {', '.join(unknown)}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    modes = {"both": (False, True), "sampled": (False,), "greedy": (True,)}[args.mode]
    if policies_differ(run):
        print("policy: the token policy the learner optimised (trie sampling, no exploration)"
              if args.policy == "token" else
              "policy: the behaviour that drew training's actions; --policy=token plays the token policy "
              "the learner optimised", flush=True)
    results = []
    print(format_table([]), flush=True)  # the header, then each row as soon as its episodes are played
    for name in names:
        for greedy in modes:
            try:
                results.append(evaluate_env(model, tokenizer, run, name, args.episodes, greedy, args.seed,
                                            args.max_steps, args.policy))
            except ExportError as error:
                print(f"error: {error}", file=sys.stderr)
                return 2
            print(format_table(results[-1:]).splitlines()[-1], flush=True)
    saved = save_table(pathlib.Path(args.workdir), results, argv if argv is not None else sys.argv[1:], args.policy)
    print(f"saved: {saved}" if isinstance(saved, pathlib.Path) else f"warning: {saved}")
    problem = unfinished_line(results, args.max_steps)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
