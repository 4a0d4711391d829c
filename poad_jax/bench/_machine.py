"""What the machine can do, measured inside a benchmark: matmul throughput and memory
read bandwidth, the two ceilings a compute-bound and a memory-bound phase are judged by.

Both time a jitted call (after one warm-up call that compiles it) and keep the
best of `repeats`: the machine's speed at its least disturbed moment, as a
ceiling should be.
"""

from __future__ import annotations

import time

MATMUL_SIZE = 2048  # M = K = N of the timed matmul: large enough to run at the kernel's full speed
MATMUL_REPEATS = 5
READ_BYTES = 512 * 2**20  # well beyond any CPU's last-level cache
READ_REPEATS = 8


def best_seconds(fn, repeats: int) -> float:
    """Minimum wall time of `fn()` (its result waited for) over `repeats` calls, after one warm-up."""
    import jax

    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return min(times)


def matmul_gflops(matmul_dtype: str, size: int = MATMUL_SIZE, repeats: int = MATMUL_REPEATS) -> float:
    """GFLOP/s of a `[size, size] x [size, size]` matmul as the model runs its matmuls:
    `models.precision.mixed_einsum` (operands in `matmul_dtype`, float32 accumulation) for
    "bfloat16", a float32 matmul for "float32".  2 size^3 FLOPs / best time."""
    import jax
    import jax.numpy as jnp

    from poad_jax.models.precision import mixed_einsum

    a = jax.random.normal(jax.random.key(0), (size, size), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (size, size), jnp.float32)
    if matmul_dtype == "float32":
        product = jax.jit(lambda x, y: x @ y)
    else:
        low = jnp.dtype(matmul_dtype)
        a, b = a.astype(low), b.astype(low)  # the model stores its weights in the low dtype
        product = jax.jit(lambda x, y: mixed_einsum("ij,jk->ik", x, y, low))
    return 2 * size**3 / best_seconds(lambda: product(a, b), repeats) / 1e9


def read_gbs(num_bytes: int = READ_BYTES, repeats: int = READ_REPEATS) -> float:
    """Memory read bandwidth in GB/s: bytes / best time of a jitted sum over a float32 array of
    `num_bytes` (one streaming pass over it per call)."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((num_bytes // 4,), jnp.float32)
    summed = jax.jit(jnp.sum)
    return num_bytes / best_seconds(lambda: summed(x), repeats) / 1e9
