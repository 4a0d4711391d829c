"""Pure sampling kernels: top-k / top-p masks, drawing a token, its log-prob.

Log-prob contract: the log-prob recorded for a drawn token is log pi(token)
under the distribution it was actually drawn from,
    pi = softmax(mask_top_p(mask_top_k(logits / T)))
(or, trie-constrained, softmax over the allowed tokens' logits / T), so with
top_k = 0 and top_p = 1 it equals `log_softmax(logits / T)` of a
training-style forward pass.  Greedy decoding (T = 0) takes the argmax and
records the untempered log_softmax(logits).  `policy_logprobs` gives instead
the untruncated policy's log_softmax(logits / T)[token], which the learner
optimises whatever truncation drew the token.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def top_k_mask(logits: jax.Array, k: int) -> jax.Array:
    """`[B, V]` bool: True where logits >= the k-th largest logit of the row.

    Ties with the k-th value are all kept.  k = 0 (or k >= V) keeps everything.
    """
    if k <= 0 or k >= logits.shape[-1]:
        return jnp.ones(logits.shape, bool)
    return logits >= kth_largest(logits, k)


def _ordered_keys(x: jax.Array) -> jax.Array:
    """uint32 keys in the order of the float32 values `x` (the sign bit flipped for x >= 0,
    every bit for x < 0), the radix sort's map."""
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(1 << 31))


def kth_largest(x: jax.Array, k: int) -> jax.Array:
    """`[B, 1]` float32: the k-th largest value of each row of `x [B, V]`, exactly (ties counted;
    NaN-free rows).  The largest key t with #{i : key_i >= t} >= k, found bit by bit from the top
    (32 counting passes over the row):

        t <- t | 2^b  if  #{i : key_i >= t | 2^b} >= k,   b = 31, ..., 0

    On a CPU this is much faster than `jax.lax.top_k` over a large vocabulary (issue 41)."""
    keys = _ordered_keys(x)

    def bit(i, t):
        candidate = t | (jnp.uint32(1) << (31 - i).astype(jnp.uint32))
        enough = jnp.sum(keys >= candidate, axis=-1, keepdims=True) >= k
        return jnp.where(enough, candidate, t)

    t = jax.lax.fori_loop(0, 32, bit, jnp.zeros(x.shape[:-1] + (1,), jnp.uint32))
    bits = jnp.where(t >> 31 == 1, t & jnp.uint32(0x7FFFFFFF), ~t)
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def top_p_mask(logits: jax.Array, p: float) -> jax.Array:
    """`[B, V]` bool nucleus: token i is kept iff the probability mass of the
    tokens ranked strictly before it (descending probability, ties by index) is
    < p.  So the smallest prefix whose mass reaches p is kept; the top token
    always is.  p = 1 keeps everything (including -inf logits, harmless).
    """
    if p >= 1.0:
        return jnp.ones(logits.shape, bool)
    order = jnp.argsort(-logits, axis=-1, stable=True)
    sorted_probs = jax.nn.softmax(jnp.take_along_axis(logits, order, axis=-1), axis=-1)
    mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
    keep_sorted = mass_before < p
    rows = jnp.arange(logits.shape[0])[:, None]
    return jnp.zeros(logits.shape, bool).at[rows, order].set(keep_sorted)


def sampling_logits(logits: jax.Array, temperature: float, top_k: int, top_p: float) -> jax.Array:
    """`[B, V]` logits of the distribution sampled from: logits / T with the
    tokens outside top-k, then outside the nucleus top-p, set to -inf.
    Requires temperature > 0."""
    scaled = logits.astype(jnp.float32) / temperature
    scaled = jnp.where(top_k_mask(scaled, top_k), scaled, -jnp.inf)
    return jnp.where(top_p_mask(scaled, top_p), scaled, -jnp.inf)


def sample_tokens(
    logits: jax.Array, row_keys: jax.Array, temperature: float, top_k: int, top_p: float
) -> tuple[jax.Array, jax.Array]:
    """Draws one token per row from `logits [B, V]` with keys `[B, 2]`.

    Returns `(tokens [B] int32, logprobs [B] float32)` where logprob is
    log softmax(sampling_logits)[token]; greedy (T = 0) takes the argmax and
    records the untempered log_softmax(logits)[token].
    """
    logits = logits.astype(jnp.float32)
    if temperature == 0:
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        dist = logits
    else:
        dist = sampling_logits(logits, temperature, top_k, top_p)
        tokens = jax.vmap(jax.random.categorical)(row_keys, dist).astype(jnp.int32)
    chosen = jnp.take_along_axis(dist, tokens[:, None], axis=-1)[:, 0]
    logprobs = chosen - jax.nn.logsumexp(dist, axis=-1)
    return tokens, logprobs


def policy_logprobs(logits: jax.Array, tokens: jax.Array, temperature: float) -> jax.Array:
    """log pi(token) = log_softmax(logits / T)[token] `[B]` of the untruncated policy at temperature T
    (no top-k / top-p: the distribution the learner takes its log-probs from); T = 0 is read as 1."""
    scaled = logits.astype(jnp.float32) / (temperature if temperature > 0 else 1.0)
    chosen = jnp.take_along_axis(scaled, tokens[:, None], axis=-1)[:, 0]
    return chosen - jax.nn.logsumexp(scaled, axis=-1)


def sample_allowed(
    logits: jax.Array, allowed: jax.Array, valid: jax.Array, row_keys: jax.Array, temperature: float
) -> tuple[jax.Array, jax.Array]:
    """Draws one of the allowed tokens per row: `allowed [B, K]` token ids,
    `valid [B, K]` which of them exist.

    pi = softmax(logits[allowed] / T) over the valid entries (argmax when
    T = 0, its log-prob then untempered).  Returns (choice `[B]`, an index
    into the K entries, and log pi(choice) `[B]`).
    """
    logits_k = jnp.take_along_axis(logits, allowed, axis=-1)
    if temperature > 0:
        logits_k = logits_k / temperature
    logits_k = jnp.where(valid, logits_k, -jnp.inf)
    if temperature == 0:
        choice = jnp.argmax(logits_k, axis=-1)
    else:
        choice = jax.vmap(jax.random.categorical)(row_keys, logits_k)
    logprob = jnp.take_along_axis(jax.nn.log_softmax(logits_k, axis=-1), choice[:, None], axis=-1)[:, 0]
    return choice, logprob


def row_keys(rng: jax.Array, rows: int, step) -> jax.Array:
    """Per-row keys of one decode step: fold_in(fold_in(rng, row), step), so a
    row's draws do not depend on the batch it shares."""
    return jax.vmap(lambda r: jax.random.fold_in(jax.random.fold_in(rng, r), step))(jnp.arange(rows))
