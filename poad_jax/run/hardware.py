"""Settings chosen from the machine: `matmul_dtype="auto"` and `behaviour_logprobs="auto"`.

bfloat16 matmul operands pay where the hardware multiplies bfloat16
natively (a GPU or TPU; a CPU with AVX-512-BF16 or AMX): there they run at
1.3-1.7x float32's speed.  A CPU without either converts every operand and
runs bfloat16 matmuls *slower* than float32 ones (a 2-core AMD EPYC with
AVX2 only: 43 against 63 GFLOP/s on `[2048, 2048]`; docs/performance.md),
while rounding them.  "auto" therefore picks bfloat16 only where it is native.
A run directory records the resolved dtype in its config.json, and a resumed
run keeps the recorded one, so that a run moved to another machine keeps
its numerics.
"""

from __future__ import annotations

import importlib.metadata
import pathlib
from typing import Any, Iterable

AUTO = "auto"
# CPU feature flags (Linux /proc/cpuinfo names) of a native bfloat16 dot product.
NATIVE_BFLOAT16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
# The instruction-set extensions by which OpenBLAS (numpy, scipy, scikit-learn) and XLA choose their kernels:
# two CPUs that agree on these and on the model name take the same floating-point paths.
KERNEL_CPU_FLAGS = ("avx", "fma", "avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                    "avx512_fp16", "amx_bf16", "amx_tile")
# The packages whose numbers a scored program's ROC AUC depends on.
SCORING_PACKAGES = ("numpy", "scipy", "scikit-learn")


def cpu_flags(cpuinfo: str | pathlib.Path = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags from Linux's /proc/cpuinfo; empty where it cannot be read (macOS, Windows)."""
    try:
        text = pathlib.Path(cpuinfo).read_text()
    except OSError:
        return frozenset()
    flags: set[str] = set()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            flags.update(value.split())
    return frozenset(flags)


def cpu_model_name(cpuinfo: str | pathlib.Path = "/proc/cpuinfo") -> str:
    """The CPU's model name from Linux's /proc/cpuinfo (`lscpu`'s "Model name"); "unknown" where unreadable."""
    try:
        text = pathlib.Path(cpuinfo).read_text()
    except OSError:
        return "unknown"
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "model name":
            return value.strip()
    return "unknown"


def scoring_machine(cpuinfo: str | pathlib.Path = "/proc/cpuinfo") -> dict[str, Any]:
    """What a number computed by numpy/scikit-learn on this machine depends on: the CPU's model name, its
    kernel-choosing extensions (`KERNEL_CPU_FLAGS`) and the versions of `SCORING_PACKAGES`.  Two
    machines with equal records compute equal numbers; a record from another machine may differ in the
    last digits, or more where an iteration cap stops an optimiser (lbfgs) at a path-dependent point."""
    versions = {}
    for package in SCORING_PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {"cpu": cpu_model_name(cpuinfo), "isa": sorted(cpu_flags(cpuinfo) & set(KERNEL_CPU_FLAGS)),
            "packages": versions}


def native_matmul_dtype(backend: str, flags: Iterable[str]) -> tuple[str, str]:
    """(dtype name, why): "bfloat16" on an accelerator or a CPU with a native bfloat16 dot
    product (`NATIVE_BFLOAT16_CPU_FLAGS`), else "float32"."""
    if backend != "cpu":
        return "bfloat16", f"the {backend} multiplies bfloat16 natively"
    native = sorted(set(flags) & set(NATIVE_BFLOAT16_CPU_FLAGS))
    if native:
        return "bfloat16", f"this CPU multiplies bfloat16 natively ({', '.join(native)})"
    return "float32", ("this CPU has no native bfloat16 matmul (neither "
                       f"{' nor '.join(NATIVE_BFLOAT16_CPU_FLAGS)}): float32 is faster here, and exact")


def machine_matmul_dtype() -> tuple[str, str]:
    """`native_matmul_dtype` for this process's default JAX backend and CPU."""
    import jax  # here, so that reading a config does not start JAX

    return native_matmul_dtype(jax.default_backend(), cpu_flags())


def resolve_matmul_dtype(name: str, recorded: str | None = None) -> tuple[str, str]:
    """The matmul dtype a run uses for `config.matmul_dtype = name`, and why.

    A concrete name stays.  "auto" takes the run directory's recorded dtype
    when there is one (a resumed run keeps its numerics), else the machine's
    (`machine_matmul_dtype`)."""
    if name != AUTO:
        return name, "set in the config"
    if recorded and recorded != AUTO:
        return recorded, "auto: the run directory's recorded dtype"
    dtype, why = machine_matmul_dtype()
    return dtype, f"auto: {why}"


def resolve_behaviour_logprobs(config: Any, recorded: str | None = None) -> tuple[str, str]:
    """PPO's old log-probs for `config.behaviour_logprobs` (with a concrete `matmul_dtype`), and why.

    "auto" takes the recorded choice when there is one, else the sampler's where the matmuls are
    float32 and the method decodes its own tokens (`config.sampler_logprobs_refusal` is None): the
    learner's forward would give the same numbers to float32 rounding (|ratio - 1| <= 1e-5, `bench
    logprob_gap`), so the behaviour pass skips it; with bfloat16 matmuls the two differ by more
    (up to 0.055), so the learner recomputes them."""
    from poad_jax.run import config as config_lib

    name = config.behaviour_logprobs
    if name != AUTO:
        return name, "set in the config"
    if recorded and recorded != AUTO:
        return recorded, "auto: the run directory's recorded choice"
    refusal = config_lib.sampler_logprobs_refusal(config)
    if refusal is None and config.matmul_dtype == "float32":
        return "sampler", "auto: float32 decoding gives the learner's own to rounding"
    return "recompute", "auto: " + ("bfloat16 decoding rounds them differently" if refusal is None
                                    else "the sampler's cannot serve this method")


def resolve_config(config: Any, stored: dict[str, Any] | None = None) -> str | None:
    """Replaces `config.matmul_dtype = "auto"` and `config.behaviour_logprobs = "auto"` by what they
    resolve to (in place; `stored`: the run directory's config.json, if any).  Returns the line a
    run prints about them, or None when nothing was automatic."""
    stored = stored or {}
    lines = []
    name = config.matmul_dtype
    if name == AUTO:
        recorded = stored.get("matmul_dtype")
        dtype, why = resolve_matmul_dtype(name, str(recorded) if recorded else None)
        config.matmul_dtype = dtype
        lines.append(f"matmuls in {dtype} ({why})")
    if config.behaviour_logprobs == AUTO:
        recorded = stored.get("behaviour_logprobs")
        source, why = resolve_behaviour_logprobs(config, str(recorded) if recorded else None)
        config.behaviour_logprobs = source
        lines.append(f"PPO's old log-probs: {source} ({why})")
    return "; ".join(lines) or None
