"""Where a run's memory goes: peak resident memory per phase of one update, and the compiled update's buffers.

    python scripts/memory_phases.py --config=configs/datasci.py [--config.x=y ...] [--analysis] [--again]

Builds the run as `python -m poad_jax.train` does (`poad_jax.run.build`), then runs one update phase by
phase: model loading, the learner's state, the sampler, one rollout (sampling), the behaviour pass and the
learner's compiled PPO update.  Before each phase the process's resident high-water mark is reset
(`/proc/self/clear_refs`, "5"), so each line gives the phase's own peak (VmHWM) and what stays resident after
it (VmRSS), in MiB, beside the run's expected peak (`poad_jax.run.memory`).  `--analysis` adds XLA's memory
analysis of the compiled update (`jax.jit(...).lower(...).compile().memory_analysis()`: arguments, outputs,
aliased, temporaries), compiled once more before it runs.  Nothing is written to a run directory.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # this checkout's poad_jax, not the installed one

_CONFIG = config_flags.DEFINE_config_file("config", None, "the run's config file", lock_config=False)
_ANALYSIS = flags.DEFINE_bool("analysis", False, "add XLA's memory analysis of the compiled update")
_AGAIN = flags.DEFINE_bool("again", False, "run the learner's update a second time, on the same batch")
_JSON = flags.DEFINE_string("json", None, "also write the phases as JSON to this file")


def status_mib() -> dict[str, float]:
    """VmRSS and VmHWM of this process, in MiB (Linux /proc/self/status)."""
    fields = {}
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) / 1024.0
    return fields


def reset_peak() -> bool:
    """Resets this process's VmHWM to its current RSS (Linux 4.0+); False where it cannot."""
    try:
        pathlib.Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def main(argv) -> None:
    del argv
    import jax

    from poad_jax.agent.experience import behaviour_statistics, make_token_batch
    from poad_jax.agent.rollout import RolloutCollector
    from poad_jax.run import hardware
    from poad_jax.run import memory as memory_lib
    from poad_jax.run.build import build, placement_of
    from poad_jax.run.train import build_envs

    from poad_jax.run import config as config_lib

    config = _CONFIG.value.copy_and_resolve_references()
    print(hardware.resolve_config(config))
    run = config_lib.typed(config)  # as resolved: what the run trains with
    phases = []

    def phase(name, fn):
        resettable = reset_peak()
        start = time.perf_counter()
        result = fn()
        jax.block_until_ready(jax.tree.leaves(result) if result is not None else None)
        mib = status_mib()
        phases.append({"phase": name, "peak_mib": round(mib["VmHWM"], 1), "rss_after_mib": round(mib["VmRSS"], 1),
                       "seconds": round(time.perf_counter() - start, 1), "own_peak": resettable})
        print(f"{name:<22} peak {mib['VmHWM']:8.0f} MiB   resident after {mib['VmRSS']:8.0f} MiB   "
              f"{time.perf_counter() - start:6.1f} s", flush=True)
        return result

    phases.append({"phase": "imports", **{k: round(v, 1) for k, v in status_mib().items()}})
    placement = placement_of(run)
    built = phase("model loading", lambda: build(run, placement))
    estimate = memory_lib.expected_peak(run)
    print(memory_lib.expected_line(estimate), flush=True)
    envs = build_envs(run, placement.threads, built.seeds.envs)
    update_fn, _, state = phase("learner state", lambda: placement.learner(
        built.graph, built.method, built.learner, built.params, built.seeds.learner))
    sampler = phase("sampler", lambda: placement.sampler(built.graph, built.frozen, built.params,
                                                         built.rollout.prompt_buckets))
    collector = RolloutCollector(envs, built.tokenizer, sampler, built.method, built.rollout, seed=built.seeds.numpy)
    steps, next_prompts = phase("sampling", lambda: collector.collect(built.seeds.rollout))
    if hasattr(sampler, "release_copies"):  # as the training loop does (a checkout before it has none)
        sampler.release_copies()
    arrays, next_arrays = placement.batch_arrays(steps, next_prompts, built.method, built.rollout,
                                                 built.tokenizer.pad_token_id)
    plans = placement.prefix_plans(arrays, next_arrays, built.method, run)

    def behaviour():
        stats = behaviour_statistics(built.graph, built.frozen, state.params, state.params["head"], arrays,
                                     next_arrays, method=built.method, temperature=built.learner.temperature,
                                     critic_kind=built.learner.critic_kind, plans=plans,
                                     reference_logprobs=built.learner.ref_kl_coef > 0)
        return make_token_batch(arrays, stats, prefix_plan=plans.learner if plans else None)

    batch = phase("behaviour pass", behaviour)
    analysis = None
    if _ANALYSIS.value:
        compiled = phase("update compiled (AOT)", lambda: update_fn.lower(state, built.frozen, batch).compile())
        memory = compiled.memory_analysis()
        analysis = {name: round(getattr(memory, f"{name}_size_in_bytes") / 2**20, 1)
                    for name in ("argument", "output", "alias", "temp", "generated_code")}
        print("compiled update (MiB): " + ", ".join(f"{k} {v}" for k, v in analysis.items()), flush=True)
        del compiled
    state, metrics = phase("learner update", lambda: update_fn(state, built.frozen, batch))
    if _AGAIN.value:  # the same batch once more: what the first call held beyond a compiled program's run
        state, metrics = phase("learner update again", lambda: update_fn(state, built.frozen, batch))
    envs.close()
    whole = {"peak_rss_mib": max(p.get("peak_mib", 0.0) for p in phases)}  # the phases' peaks: VmHWM was reset
    print(f"whole process: peak {whole['peak_rss_mib']:.0f} MiB (the largest phase's); expected "
          f"{estimate.total / 2**20:.0f} MiB", flush=True)
    if _JSON.value:
        pathlib.Path(_JSON.value).write_text(json.dumps(
            {"phases": phases, "analysis": analysis, **whole, "expected": estimate.as_dict()}, indent=2))


if __name__ == "__main__":
    flags.mark_flag_as_required("config")
    app.run(main)
    sys.exit(0)
