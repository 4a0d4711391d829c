"""Mixed-precision matmuls: bfloat16 operands, float32 accumulation, in both passes."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def _swap_einsum_spec(spec: str) -> tuple[str, str]:
    """The cotangent specs of a two-operand einsum "A,B->C": ("C,B->A", "A,C->B")."""
    inputs, out = spec.split("->")
    a, b = inputs.split(",")
    return f"{out},{b}->{a}", f"{a},{out}->{b}"


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3))
def mixed_einsum(spec: str, a: jax.Array, b: jax.Array, operand_dtype) -> jax.Array:
    """C = einsum(spec, a, b) with operands rounded to `operand_dtype`, accumulated in float32.

    Forward:  C = sum_k round(a) round(b)            (float32 accumulation)
    Backward: dA = einsum("C,B->A", round(dC), round(b)),
              dB = einsum("A,C->B", round(a), round(dC)),
    i.e. the backward matmuls take `operand_dtype` operands too (JAX's own
    transpose would pair a float32 cotangent with a bfloat16 operand, which
    XLA:CPU runs on its slow path).  With bfloat16 operands XLA:CPU uses the
    AMX/AVX-512-BF16 kernels: 3-4x the float32 matmul throughput on this CPU.
    Every index of each operand must appear in the other operand or the output
    (true for projections and attention), so the swapped specs are valid.
    """
    return jnp.einsum(
        spec, a.astype(operand_dtype), b.astype(operand_dtype), preferred_element_type=jnp.float32
    )


def _mixed_einsum_fwd(spec, a, b, operand_dtype):
    a_low, b_low = a.astype(operand_dtype), b.astype(operand_dtype)
    out = jnp.einsum(spec, a_low, b_low, preferred_element_type=jnp.float32)
    # Residuals must be arrays: two empty ones carry the primal dtypes.
    return out, (a_low, b_low, jnp.zeros((0,), a.dtype), jnp.zeros((0,), b.dtype))


def _mixed_einsum_bwd(spec, operand_dtype, residuals, grad):
    a_low, b_low, a_marker, b_marker = residuals
    grad_spec_a, grad_spec_b = _swap_einsum_spec(spec)
    grad_low = grad.astype(operand_dtype)
    grad_a = jnp.einsum(grad_spec_a, grad_low, b_low, preferred_element_type=jnp.float32)
    grad_b = jnp.einsum(grad_spec_b, a_low, grad_low, preferred_element_type=jnp.float32)
    return grad_a.astype(a_marker.dtype), grad_b.astype(b_marker.dtype)


mixed_einsum.defvjp(_mixed_einsum_fwd, _mixed_einsum_bwd)
