"""How far a run's behaviour is from the token policy PPO optimises, at the states the behaviour visits
(study C, docs/results/virtualhome_compare.md: POAD/NTPO drawing actions from the action scores with the
importance correction).

At a run's newest checkpoint, plays `--episodes` episodes with the behaviour mu (the action scores'
softmax, as in training) and, at every step, sets beside it the token policy pi the learner optimises
(the trie policy: the product of the next-token distributions renormalised over the offered
continuations, at temperature 1), for the offered action that was taken and for every other:

    mu(a) = softmax_a(s_a),  s_a = sum_j log p(w_j | o, w_<j) / n_a          (`Sampler.score_actions`)
    pi(a) = prod_j p(w_j | o, w_<j) / sum_{t offered after w_<j} p(t | o, w_<j)  (`constrained_action_probs`)
    rho_j = min(1, pi(w_j | w_<j) / mu(w_j | w_<j))    the learner's truncated weight of token j, with
            either policy's token conditional its action mass marginalised onto prefixes
            (`rollout.prefix_token_logprobs`)

and reports, pooled over steps, over the steps of successful and of failed episodes, and per action
taken: mu and pi of the taken action, how often their most likely actions differ, and the weights the
correction would give the taken action's tokens (their mean beside the run's logged `importance_weight`).
`behaviour_logprobs` recorded by the collector are checked against mu recomputed here. With `--initial`,
both policies as training started (LoRA B = 0: the base model) are scored at the same states too, so the
report shows how far training moved each action's probability.

    .venv/bin/python scripts/behaviour_gap.py --workdir=<run> [--episodes=20] [--seed=12345] [--initial] [--out=<dir>]

`--out` writes `behaviour_gap.md` and every step as `behaviour_gap_steps.jsonl` there.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import sys

import numpy as np


@dataclasses.dataclass
class StepGap:
    """One step of the behaviour: the taken action and both policies' view of the offered ones."""
    episode: int  # index among the finished episodes (filled in when the thread's episode ends)
    thread: int
    action: str
    offered: int
    mu: float  # of the taken action
    pi: float
    weights: list[float]  # rho_j of the taken action's tokens
    mu_best: str  # the offered action each policy finds most likely
    pi_best: str
    recorded_gap: float  # max_j |log mu(w_j) recomputed - the collector's behaviour_logprobs_j|
    success: bool = False  # of the episode
    mu_initial: float = math.nan  # of the taken action, as training started (`--initial`; else NaN)
    pi_initial: float = math.nan


def step_gap(candidates: list[list[int]], texts: list[str], mu: np.ndarray, pi: np.ndarray, chosen: int,
             recorded: list[float] | None) -> StepGap:
    """A `StepGap` (episode and thread left 0) from both action distributions over `candidates`."""
    from poad_jax.agent.rollout import prefix_token_logprobs

    mu, pi = np.asarray(mu, np.float64) / np.sum(mu), np.asarray(pi, np.float64) / np.sum(pi)
    log_mu = np.array(prefix_token_logprobs(candidates, mu, chosen))
    log_pi = np.array(prefix_token_logprobs(candidates, pi, chosen))
    weights = np.minimum(1.0, np.exp(log_pi - log_mu))
    gap = float(np.max(np.abs(log_mu - np.asarray(recorded)))) if recorded is not None else math.nan
    return StepGap(0, 0, texts[chosen], len(candidates), float(mu[chosen]), float(pi[chosen]),
                   [float(w) for w in weights], texts[int(np.argmax(mu))], texts[int(np.argmax(pi))], gap)


def refuse_unless_action_scores(config: dict) -> None:
    """Exits with one line unless the run (its config.json) is POAD/NTPO sampling the action scores at
    temperature 1 (the trie policy compared here is at temperature 1)."""
    if config.get("method") == "twosome" or config.get("restricted_sampling") != "action_scores":
        raise SystemExit("error: the run's behaviour is its token policy (not POAD/NTPO with "
                         "restricted_sampling='action_scores'): there is no gap to measure")
    temperature = float((config.get("sampling") or {}).get("temperature", 1.0))
    if temperature != 1.0:
        raise SystemExit(f"error: the token policy here is the trie at temperature 1; the run samples at {temperature}")


def initial_actor(model):
    """A copy of the trained actor `model` with every LoRA B set to zero: the actor as training started
    (B is initialised to zero, so the adapted forward W x + s A B x is the base model's W x)."""
    import jax.numpy as jnp
    from flax import nnx

    initial = nnx.clone(model)
    for name in list(initial.layers.lora_b.keys()):
        initial.layers.lora_b[name][...] = jnp.zeros_like(initial.layers.lora_b[name][...])
    return initial


def play(workdir: pathlib.Path, episodes: int, seed: int, max_steps: int,
         initial: bool = False) -> tuple[list[StepGap], dict]:
    """The `StepGap` of every step of the first `episodes` finished episodes, and the run's settings; with
    `initial`, each step also scored by the actor as training started (`initial_actor`)."""
    import jax

    from poad_jax.tools.evaluate import playing_collector
    from poad_jax.tools.export import load_trained_actor

    recorded = workdir / "config.json"  # refused before the model loads: what the run sampled from
    if recorded.exists():
        refuse_unless_action_scores(json.loads(recorded.read_text()))
    run, model, tokenizer, _ = load_trained_actor(workdir)  # the run's settings, typed
    collector = playing_collector(model, tokenizer, run, run.env.name, min(episodes, run.rollout.num_threads),
                                  False, seed)
    sampler, normalization = collector.sampler, collector.config.twosome_normalization
    if initial:
        from poad_jax.sampling import Sampler

        start = Sampler(initial_actor(model), prompt_buckets=collector.config.prompt_buckets)
    running: dict[int, list[StepGap]] = {}
    finished: list[StepGap] = []
    rng, steps, done = jax.random.key(seed), 0, 0
    try:
        while len(collector.stats.finished_success) < episodes and steps < max_steps:
            rng, step_rng = jax.random.split(rng)
            before = len(collector.stats.finished_success)
            records = collector.collect(step_rng)[0][0]
            ended = [b for b, record in enumerate(records) if record.done]
            for b, record in enumerate(records):
                mu, pi = action_probabilities(sampler, record, normalization)
                gap = step_gap(record.candidates, record.candidate_texts, mu, pi, record.chosen,
                               record.behaviour_logprobs)
                gap.thread = b
                if initial:
                    gap.mu_initial, gap.pi_initial = initial_probabilities(start, record, normalization)
                running.setdefault(b, []).append(gap)
            for b, success in zip(ended, collector.stats.finished_success[before:]):  # in thread order
                for gap in running.pop(b):
                    gap.episode, gap.success = done, bool(success)
                    finished.append(gap)
                done += 1
            steps += 1
    finally:
        collector.envs.close()
    kept = [g for g in finished if g.episode < episodes]
    return kept, run


def action_probabilities(sampler, record, normalization: str) -> tuple[np.ndarray, np.ndarray]:
    """(mu, pi) over `record`'s offered actions under `sampler`'s actor: the action scores' softmax and the
    trie policy at temperature 1."""
    mu = sampler.score_actions(record.prompt, record.candidates, normalization=normalization,
                               action_texts=record.candidate_texts).probs
    pi = sampler.constrained_action_probs(record.prompt, record.candidates)
    return np.asarray(mu, np.float64), np.asarray(pi, np.float64)


def initial_probabilities(sampler, record, normalization: str) -> tuple[float, float]:
    """(mu, pi) of `record`'s taken action under `sampler`'s actor (normalised over the offered ones)."""
    mu, pi = action_probabilities(sampler, record, normalization)
    return float(mu[record.chosen] / mu.sum()), float(pi[record.chosen] / pi.sum())


def _mean(values: list[float]) -> str:
    return "-" if not values else f"{np.mean(values):.3f}"


def summary_rows(label: str, gaps: list[StepGap]) -> str:
    """A markdown row: steps, mean mu and pi of the taken action, median pi / mu, the share of steps whose
    most likely action differs, the mean weight over the taken actions' tokens and the mean least one."""
    if not gaps:
        return f"| {label} | 0 | - | - | - | - | - | - |"
    ratio = np.median([g.pi / g.mu for g in gaps])
    differ = np.mean([g.mu_best != g.pi_best for g in gaps])
    tokens = [w for g in gaps for w in g.weights]
    return (f"| {label} | {len(gaps)} | {_mean([g.mu for g in gaps])} | {_mean([g.pi for g in gaps])} | "
            f"{ratio:.3f} | {differ:.2f} | {_mean(tokens)} | {_mean([min(g.weights) for g in gaps])} |")


def report(gaps: list[StepGap], workdir: pathlib.Path, logged_weight: float | None) -> str:
    """The markdown report of `play`'s steps."""
    episodes = sorted({(g.episode, g.success) for g in gaps})
    won = sum(success for _, success in episodes)
    lines = [f"# Behaviour (mu) against token policy (pi) at the states mu visits: `{workdir}`", "",
             f"{len(episodes)} episodes of mu, {won} successful; {len(gaps)} steps. Largest gap between mu "
             f"recomputed here and the collector's recorded log-probs: "
             f"{max((g.recorded_gap for g in gaps), default=math.nan):.2e} nats.", "",
             "| steps | count | mean mu(taken) | mean pi(taken) | median pi / mu | most likely action differs | "
             "mean weight per token | mean least weight |", "|" + "---|" * 8,
             summary_rows("all", gaps), summary_rows("in successful episodes", [g for g in gaps if g.success]),
             summary_rows("in failed episodes", [g for g in gaps if not g.success])]
    if logged_weight is not None:
        lines += ["", f"The run's logged `importance_weight` (mean over its last 10 updates): {logged_weight:.3f}."]
    by_action: dict[str, list[StepGap]] = {}
    for gap in gaps:
        by_action.setdefault(gap.action, []).append(gap)
    initial = any(not math.isnan(g.pi_initial) for g in gaps)
    start = " | mean mu as training started | mean pi as training started" if initial else ""
    lines += ["", "Per action taken (most taken first):", "",
              f"| action | taken | of them in successful episodes | mean mu | mean pi{start} | "
              "mean weights of its tokens |", "|" + "---|" * (8 if initial else 6)]
    for action, taken in sorted(by_action.items(), key=lambda item: -len(item[1])):
        weights = np.mean([g.weights for g in taken], axis=0) if len({len(g.weights) for g in taken}) == 1 else None
        shown = "-" if weights is None else ", ".join(f"{w:.3f}" for w in weights)
        before = (f" | {_mean([g.mu_initial for g in taken])} | {_mean([g.pi_initial for g in taken])}"
                  if initial else "")
        lines.append(f"| {action} | {len(taken)} | {sum(g.success for g in taken)} | {_mean([g.mu for g in taken])} | "
                     f"{_mean([g.pi for g in taken])}{before} | {shown} |")
    return "\n".join(lines) + "\n"


def logged_importance_weight(workdir: pathlib.Path) -> float | None:
    """Mean `importance_weight` over the run's last 10 logged updates, or None."""
    from poad_jax.run.metrics import read_metrics  # a raw snapshot's metrics.jsonl.gz too

    values = [record.get("importance_weight") for record in read_metrics(workdir / "metrics.jsonl")]
    values = [float(v) for v in values if v is not None][-10:]
    return float(np.mean(values)) if values else None


def jsonable(step: dict) -> dict:
    """A step's fields with NaN (not measured) as None, which JSON has."""
    return {key: None if isinstance(value, float) and math.isnan(value) else value for key, value in step.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/behaviour_gap.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, type=pathlib.Path)
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--max-steps", type=int, default=1000, help="env steps per thread before giving up")
    parser.add_argument("--initial", action="store_true",
                        help="also score each step with the actor as training started (LoRA B = 0)")
    parser.add_argument("--out", type=pathlib.Path, help="directory for behaviour_gap.md and its steps")
    args = parser.parse_args(argv)
    from poad_jax.tools.export import ExportError

    try:
        gaps, _ = play(args.workdir, args.episodes, args.seed, args.max_steps, args.initial)
    except ExportError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    text = report(gaps, args.workdir, logged_importance_weight(args.workdir))
    print(text, end="")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "behaviour_gap.md").write_text(text)
        (args.out / "behaviour_gap_steps.jsonl").write_text(
            "".join(json.dumps(jsonable(dataclasses.asdict(g))) + "\n" for g in gaps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
