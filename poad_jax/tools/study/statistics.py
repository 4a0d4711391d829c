"""What a study's numbers are, from one run's records (its metrics.jsonl, one record per update) or from a
sample over seeds: final values, curves, counts of successes and succeeded steps, PPO's dynamics, tests of
two samples.  No files and no study: `tables` reads the cells and lays these numbers out."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import numpy as np

from poad_jax.tools.study.speed import episodes_per_update


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average over up to `window` points, NaNs ignored (NaN if all are NaN)."""
    if window <= 1:
        return values.astype(float)
    out = np.full(len(values), np.nan)
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1): i + 1]
        chunk = chunk[~np.isnan(chunk)]
        if len(chunk):
            out[i] = chunk.mean()
    return out


def curve(records: list[dict[str, Any]], metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(env_steps, metric) per update; NaN where the update finished no episode."""
    steps = np.array([float(r.get("env_steps") or 0) for r in records])
    values = np.array([np.nan if r.get(metric) is None else float(r[metric]) for r in records])
    return steps, values


def final_value(records: list[dict[str, Any]], metric: str, fraction: float = 0.1) -> float:
    """Mean of `metric` over the updates in the last `fraction` of the run's env steps.

        final = mean { m_u : env_steps_u > (1 - fraction) * env_steps_last }   (NaNs skipped)
    """
    steps, values = curve(records, metric)
    if not len(steps):
        return float("nan")
    keep = (steps > (1.0 - fraction) * steps[-1]) & ~np.isnan(values)
    if not keep.any():  # too short a run: take the last update that has a value
        valid = ~np.isnan(values)
        return float(values[valid][-1]) if valid.any() else float("nan")
    return float(values[keep].mean())


def steps_to_threshold(records: list[dict[str, Any]], metric: str, threshold: float, window: int) -> float:
    """First env step at which the smoothed `metric` reaches `threshold` (NaN if never)."""
    steps, values = curve(records, metric)
    smoothed = smooth(values, window)
    hit = np.nonzero(smoothed >= threshold)[0]
    return float(steps[hit[0]]) if len(hit) else float("nan")


def mean_std(values: list[float]) -> tuple[float, float, int]:
    """Mean and sample standard deviation (ddof 1; 0 for one value) over the non-NaN values."""
    array = np.array([v for v in values if not math.isnan(v)])
    if not len(array):
        return float("nan"), float("nan"), 0
    return float(array.mean()), float(array.std(ddof=1)) if len(array) > 1 else 0.0, len(array)


def welch_test(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """Welch's t-test of two samples' means (unequal variances): (t, df, two-sided p),

        t = (mean_a - mean_b) / sqrt(v_a + v_b),   v_x = s_x^2 / n_x   (s_x: sample std, ddof 1)
        df = (v_a + v_b)^2 / (v_a^2 / (n_a - 1) + v_b^2 / (n_b - 1))   (Welch-Satterthwaite)
        p = 2 * P(T_df > |t|)

    NaN values are dropped; all three are NaN when either sample has fewer than two values or both
    have no spread."""
    x, y = (np.array([v for v in sample if not math.isnan(v)], float) for sample in (a, b))
    if len(x) < 2 or len(y) < 2:
        return math.nan, math.nan, math.nan
    va, vb = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    if va + vb == 0:
        return math.nan, math.nan, math.nan
    t = float((x.mean() - y.mean()) / math.sqrt(va + vb))
    df = float((va + vb) ** 2 / (va ** 2 / (len(x) - 1) + vb ** 2 / (len(y) - 1)))
    from scipy import stats  # noqa: PLC0415  (scikit-learn's dependency; only a report with pairs needs it)
    return t, df, float(2 * stats.t.sf(abs(t), df))


PHASE_SECONDS = ("seconds_sampling", "seconds_env", "seconds_behaviour", "seconds_learner")


@dataclasses.dataclass
class StepOutcomes:
    """One cell's steps that succeeded (e.g. programs that ran) and what they scored (e.g. their AUC)."""
    steps: int
    succeeded: int
    mean_reward: float  # over every succeeded step of the run
    final_mean_reward: float  # over the succeeded steps of the updates in the last `final_fraction`
    best_reward: float
    cut_off: int | None = None  # actions the token limit ended (`actions_cut_off`); None unless every update logged it


def step_outcomes(records: list[dict[str, Any]], fraction: float) -> StepOutcomes:
    """Counts and rewards of the succeeded steps, weighted by step (not by update):

        mean = sum_u k_u * rbar_u / sum_u k_u   (k_u = steps_succeeded_u, rbar_u = success_reward_mean_u)
        final mean: the same sum over { u : env_steps_u > (1 - fraction) * env_steps_last }
    """
    steps = np.array([float(r.get("env_steps") or 0) for r in records])
    counts = np.array([float(r.get("steps_succeeded") or 0) for r in records])
    means = np.array([np.nan if r.get("success_reward_mean") is None else float(r["success_reward_mean"])
                      for r in records])
    counted = (counts > 0) & ~np.isnan(means)

    def weighted(keep: np.ndarray) -> float:
        keep = keep & counted
        return float((counts[keep] * means[keep]).sum() / counts[keep].sum()) if keep.any() else float("nan")

    best = [float(r["best_step_reward"]) for r in records if r.get("best_step_reward") is not None]
    cut = [r.get("actions_cut_off") for r in records]
    return StepOutcomes(
        steps=int(steps[-1]) if len(steps) else 0, succeeded=int(counts.sum()),
        mean_reward=weighted(np.ones(len(records), bool)),
        final_mean_reward=weighted(steps > (1.0 - fraction) * (steps[-1] if len(steps) else 0.0)),
        best_reward=max(best) if best else float("nan"),
        cut_off=sum(int(c) for c in cut) if cut and None not in cut else None,  # a partial sum would mislead
    )


def step_successes(records: list[dict[str, Any]], fraction: float) -> tuple[int, int]:
    """Succeeded and taken env steps of a run's updates in the last `fraction` of its env steps:

        k = sum_{u in U} k_u,   n = sum_{u in U} (T_u - T_{u-1})   (T_0 = 0)

    with k_u = steps_succeeded_u (e.g. programs that ran), T_u the env steps after update u, and
    U = { u : T_u > (1 - fraction) * T_last }, as `final_value` takes them."""
    taken = [float(r.get("env_steps") or 0) for r in records]
    if not taken:
        return 0, 0
    since = (1.0 - fraction) * taken[-1]
    k = n = 0
    for before, after, record in zip([0.0, *taken[:-1]], taken, records):
        if after > since:
            k += int(record.get("steps_succeeded") or 0)
            n += int(after - before)
    return k, n


def episode_successes(records: list[dict[str, Any]], fraction: float | None = None) -> tuple[int, int]:
    """Successful and counted episodes of a run, from its per-update success rates:

        k = sum_{u in U} round(s_u * (E_u - E_{u-1})),   n = sum_{u in U} (E_u - E_{u-1})   (E_0 = 0)

    where E_u is the episodes finished by update u and s_u the success rate of those finished in it;
    updates whose rate is unknown (None or NaN) count in neither (`speed.episodes_per_update`).  U is every
    update, or with `fraction` those in the last `fraction` of the run's env steps, as `final_value` takes
    them: { u : env_steps_u > (1 - fraction) * env_steps_last }.
    """
    updates = episodes_per_update(records)
    if fraction is not None and records:
        since = (1.0 - fraction) * float(records[-1].get("env_steps") or 0)
        updates = [u for u in updates if u[0] > since]
    return sum(won for _, _, won in updates), sum(ended for _, ended, _ in updates)


@dataclasses.dataclass
class Dynamics:
    """How a cell's policy moved, update by update (PPO's own diagnostics)."""
    updates: int
    median_kl: float
    max_kl: float
    entropy: tuple[float, float, float]  # at the first update, half-way, the last
    explained_variance: tuple[float, float]  # the critic's: median and min over updates (NaN if not logged)
    skipped: int  # minibatch steps the KL threshold skipped
    steps: int  # minibatch steps in all (skipped ones included)
    median_seconds: float  # per update, sampling + env + behaviour + learner
    no_policy_gradient: bool = False  # advantages, yet the policy loss exactly 0 in every update
    no_advantage: bool = False  # every advantage 0 in every update: no return differed from its baseline


def training_dynamics(records: list[dict[str, Any]]) -> Dynamics | None:
    """Medians and extremes over updates u of approx_kl_u, of the critic's explained_variance_u (none
    when value_loss_u is 0 in every update: no critic trained) and of t_u = sum_phase seconds_phase,u;
    entropy at updates 1, ceil(U / 2), U; skipped = sum_u skipped_minibatches_u and, with f_u =
    skipped_u their fraction, steps = sum_u skipped_minibatches_u / f_u over the updates with f_u > 0,
    else their count / f taken from any update's epochs x minibatches (None when the records carry no
    approx_kl).  no_policy_gradient: policy_loss_u == 0 exactly for every u that logged it although
    advantage_mean_u != 0 for some u (the advantages were normalised away; a run with no reward yet,
    whose advantages are all 0, is not flagged).  no_advantage: that run, every advantage 0 in every
    update: groups_with_signal_u == 0 for every u where a group method logged it, else advantage_mean_u
    == 0 exactly for every u that logged one."""
    kept = [r for r in records if r.get("approx_kl") is not None and not math.isnan(float(r["approx_kl"]))]
    if not kept:
        return None
    kl = np.array([float(r["approx_kl"]) for r in kept])
    entropy = [float(r.get("entropy", float("nan"))) for r in kept]
    seconds = [sum(float(r.get(key) or 0.0) for key in PHASE_SECONDS) for r in kept]
    variance = np.array([float(r["explained_variance"]) for r in kept if r.get("explained_variance") is not None])
    value_losses = [float(r["value_loss"]) for r in kept if r.get("value_loss") is not None]
    if value_losses and all(loss == 0.0 for loss in value_losses):
        variance = variance[:0]  # no critic trained (GRPO, GiGPO): its explained variance says nothing
    variance = variance[~np.isnan(variance)]
    skipped = [int(round(float(r.get("skipped_minibatches") or 0))) for r in kept]
    fractions = [float(r.get("skipped") or 0.0) for r in kept]
    per_update = {round(k / f) for k, f in zip(skipped, fractions) if k > 0 and f > 0}
    steps = per_update.pop() * len(kept) if len(per_update) == 1 else 0
    policy_losses = [float(r["policy_loss"]) for r in kept if r.get("policy_loss") is not None]
    advantages = any(float(r.get("advantage_mean") or 0.0) != 0.0 for r in kept)
    signals = [r["groups_with_signal"] for r in kept if r.get("groups_with_signal") is not None]
    logged = any(r.get("advantage_mean") is not None for r in kept)
    no_advantage = all(k == 0 for k in signals) if signals else logged and not advantages
    return Dynamics(updates=len(kept), median_kl=float(np.median(kl)), max_kl=float(kl.max()),
                    entropy=(entropy[0], entropy[(len(kept) - 1) // 2], entropy[-1]),
                    explained_variance=(float(np.median(variance)), float(variance.min())) if len(variance)
                    else (float("nan"), float("nan")), skipped=int(sum(skipped)),
                    steps=steps, median_seconds=float(np.median(seconds)),
                    no_policy_gradient=advantages and bool(policy_losses)
                    and all(loss == 0.0 for loss in policy_losses), no_advantage=no_advantage)


MACHINERY_KEYS = ("seconds_", "compiles_", "peak_rss_mb")  # what the machine and the process change, not the run


def learning_numbers(records: list[dict[str, Any]]) -> str:
    """Every update's logged values but the machinery's (keys starting with one of `MACHINERY_KEYS`:
    timings, compile counts, memory), as one canonical JSON text: equal texts, equal runs."""
    return json.dumps([{k: v for k, v in r.items() if not k.startswith(MACHINERY_KEYS)} for r in records],
                      sort_keys=True)
