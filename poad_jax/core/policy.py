"""Actor and critic over one frozen base model.

- Actor: the frozen base plus the actor's LoRA adapters (`nnx.LoRAParam`).
- Critic ("head", the paper's): an MLP `hidden -> critic.hidden_sizes -> 1` (ReLU; `CriticConfig`) over
  the frozen base's final hidden states with adapters off; only the head
  trains, so its input features can be computed once per rollout.
- Critic ("lora"): the same frozen base with a second LoRA state (the actor's
  graph merged with other adapter weights) plus the MLP head.

One base state lives in memory: the model is split once into
`(graphdef, base, actor_lora, rest)` and every forward pass merges the base
with whichever LoRA state it needs (`nnx.merge`), inside `jax.jit`.

Positions convention of a TokenBatch row (`core/token_batch.py`): the prompt is left
padded to P columns and the action occupies columns [P, P + A).  The log-prob
of action token j reads the logits at column P + j - 1, and the value
V(o, w^{<j}) reads the hidden state at the same column.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from poad_jax.core import shared_prefix
from poad_jax.core.critic_config import CriticConfig
from poad_jax.models.llama import Llama, base_filter


# PyTorch's default nn.Linear init (kaiming_uniform with a = sqrt(5)): weights
# U(-1/sqrt(fan_in), 1/sqrt(fan_in)), i.e. variance scaling 1/3, fan in, uniform.
TORCH_LINEAR_INIT = nnx.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")


class ValueHead(nnx.Module):
    """V = w3 relu(W2 relu(W1 h + b1) + b2) + b3, the paper's critic head, over features of
    `hidden_size`, shaped as `config` (`CriticConfig`: `hidden_sizes`, `bias`, `init`) declares.

    `init="zero_output"` (ours): Flax's default hidden layers and a zero output
    layer, so V = 0 until the critic learns.  `init="torch"`: every weight drawn
    as PyTorch's nn.Linear default, U(+-1/sqrt(fan_in)) (biases too, if any);
    with `bias=False` this is the authors' head (`mappo/models/critic.py`).
    """

    def __init__(self, hidden_size: int, config: CriticConfig, *, rngs: nnx.Rngs):
        dims, bias, init = (hidden_size, *config.hidden_sizes), config.bias, config.init

        def linear(fan_in, fan_out, output=False):
            if init == "torch":
                bound = 1.0 / fan_in ** 0.5
                bias_init = lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound, bound)
                return nnx.Linear(fan_in, fan_out, use_bias=bias, kernel_init=TORCH_LINEAR_INIT,
                                  bias_init=bias_init, rngs=rngs)
            kernel_init = nnx.initializers.zeros_init() if output else nnx.nn.linear.default_kernel_init
            return nnx.Linear(fan_in, fan_out, use_bias=bias, kernel_init=kernel_init, rngs=rngs)

        self.hidden_layers = nnx.List([linear(a, b) for a, b in zip(dims[:-1], dims[1:])])
        self.out = linear(dims[-1], 1, output=True)

    def __call__(self, features: jax.Array) -> jax.Array:
        x = features.astype(jnp.float32)
        for layer in self.hidden_layers:
            x = jax.nn.relu(layer(x))
        return self.out(x)[..., 0]


@dataclasses.dataclass(frozen=True, eq=False)
class PolicyGraph:
    """Static parts: the model's and the head's graph definitions.

    Compared and hashed by identity (NNX graph definitions holding dict
    metadata are not hashable), so it can be a static jit argument: one
    PolicyGraph per run, one compilation per shape.
    """

    model_graphdef: Any
    head_graphdef: Any
    # Applied to the residual stream at the top of every decoder layer in the
    # learner's and the behaviour statistics' forward passes (`Llama.__call__`'s
    # `constrain`); None = no constraint.  A mesh sets it
    # (`poad_jax.agent.sharded_update.constrained_graph`): FSDP then gathers weights, not rows.
    constrain: Callable[[jax.Array], jax.Array] | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class FrozenBase:
    """The frozen base weights (and the model's non-parameter state)."""

    base: Any
    rest: Any


class PackedRows(NamedTuple):
    """The rows one forward pass reads, in a TokenBatch's layout (`core/token_batch.py`): `tokens`,
    `positions` and `key_mask` `[N, P + A]` (`[N, K, P + A]` for TWOSOME's candidates), the prompt
    left padded to the first `prompt_len` = P columns (a static int)."""

    tokens: jax.Array
    positions: jax.Array
    key_mask: jax.Array
    prompt_len: int
    # Token-level rows only: run the forward over the rows packed with their common prompt
    # prefix once (`core/shared_prefix.py`); None runs every row as it is.
    prefix_plan: shared_prefix.PrefixPlan | None = None

    @classmethod
    def of(cls, batch, prefix_plan: shared_prefix.PrefixPlan | None = None) -> "PackedRows":
        """The rows of a TokenBatch (or of anything with its `tokens`, `positions`, `key_mask` and
        `prompt_len`), run with `prefix_plan` (a token-level batch's own: `TokenLevelBatch.prefix_plan`)."""
        return cls(batch.tokens, batch.positions, batch.key_mask, batch.prompt_len, prefix_plan)

    def flat(self) -> "PackedRows":
        """Candidate rows `[N, K, L]` as `[N K, L]` rows of their own."""
        length = self.tokens.shape[-1]
        return PackedRows(*(x.reshape(-1, length) for x in (self.tokens, self.positions, self.key_mask)),
                          self.prompt_len)  # no prefix plan: candidate rows share their prompt their own way


def split_policy(model: Llama, head: ValueHead) -> tuple[PolicyGraph, FrozenBase, dict[str, Any]]:
    """Splits model + head into static graph, frozen base, trainable params.

    Trainable params: {"actor": actor LoRA state, "head": head state}.
    """
    model_graphdef, base, actor_lora, rest = nnx.split(model, base_filter(), nnx.LoRAParam, ...)
    head_graphdef, head_state = nnx.split(head)
    graph = PolicyGraph(model_graphdef, head_graphdef)
    return graph, FrozenBase(base, rest), {"actor": actor_lora, "head": head_state}


def merge_model(graph: PolicyGraph, frozen: FrozenBase, lora) -> Llama:
    return nnx.merge(graph.model_graphdef, frozen.base, lora, frozen.rest)


def action_window(x: jax.Array, prompt_len: int, action_len: int) -> jax.Array:
    """Columns [P - 1, P - 1 + A) of `x [N, L, ...]`: the positions that predict actions."""
    return jax.lax.slice_in_dim(x, prompt_len - 1, prompt_len - 1 + action_len, axis=1)


def hidden_before_actions(model: Llama, rows: PackedRows, *, use_lora: bool, constrain=None) -> jax.Array:
    """`[N, A, H]`: the final hidden states at the columns that predict the action tokens of
    `rows` `[N, P + A]` (columns [P - 1, P - 1 + A)), from one forward over the rows, or over
    their packing with the common prompt prefix once where `rows.prefix_plan` says so
    (`shared_prefix.hidden_before_actions`: the same states to rounding, fewer columns)."""
    action_len = rows.tokens.shape[1] - rows.prompt_len
    if rows.prefix_plan is not None:
        return shared_prefix.hidden_before_actions(model, rows.tokens, rows.positions, rows.key_mask,
                                                   rows.prompt_len, rows.prefix_plan, use_lora=use_lora,
                                                   constrain=constrain)
    hidden = model(rows.tokens, rows.positions, rows.key_mask, use_lora=use_lora, return_logits=False,
                   constrain=constrain).hidden
    return action_window(hidden, rows.prompt_len, action_len)


class TokenPolicyTerms(NamedTuple):
    """Per action column `[N, A]`: the chosen token's log-prob and the entropy, each under
    two distributions.  `offered`: the softmax restricted to the offered continuations where
    a column is constrained (`allowed_mask` has a True), the full softmax elsewhere;
    `vocabulary`: the full softmax everywhere."""

    logprobs_offered: jax.Array
    entropy_offered: jax.Array
    logprobs_vocabulary: jax.Array
    entropy_vocabulary: jax.Array


def token_policy_terms(
    logits: jax.Array, tokens: jax.Array, allowed_tokens: jax.Array | None, allowed_mask: jax.Array | None
) -> TokenPolicyTerms:
    """log pi(token) and the entropy of pi at each position, `logits [N, A, V]`, under the full
    softmax and, at constrained positions, under the softmax restricted to the allowed ids
    `allowed_tokens[n, j, :M]` (restricted action sets, trie decoding):

        log pi(w) = logit(w) - logsumexp_{v allowed} logit(v)
        H         = - sum_{v allowed} pi(v) log pi(v)

    the distribution the trie sampler draws from (a forced token has log pi 0 and H 0).
    """
    logp_full = jax.nn.log_softmax(logits, axis=-1)
    logprobs = jnp.take_along_axis(logp_full, tokens[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logp_full) * logp_full, axis=-1)
    if allowed_tokens is None:
        return TokenPolicyTerms(logprobs, entropy, logprobs, entropy)
    constrained = jnp.any(allowed_mask, axis=-1)
    allowed_logits = jnp.take_along_axis(logits, allowed_tokens, axis=-1)
    allowed_logits = jnp.where(allowed_mask, allowed_logits, -jnp.inf)
    log_normalizer = jax.nn.logsumexp(allowed_logits, axis=-1)
    chosen_logits = jnp.take_along_axis(logits, tokens[..., None], axis=-1)[..., 0]
    constrained_logp = jnp.where(allowed_mask, allowed_logits - log_normalizer[..., None], 0.0)
    constrained_entropy = -jnp.sum(jnp.where(allowed_mask, jnp.exp(constrained_logp) * constrained_logp, 0.0), -1)
    offered_logprobs = jnp.where(constrained, chosen_logits - jnp.where(constrained, log_normalizer, 0.0), logprobs)
    offered_entropy = jnp.where(constrained, constrained_entropy, entropy)
    return TokenPolicyTerms(offered_logprobs, offered_entropy, logprobs, entropy)


def token_logprobs_and_entropy(
    logits: jax.Array, tokens: jax.Array, allowed_tokens: jax.Array | None, allowed_mask: jax.Array | None
) -> tuple[jax.Array, jax.Array]:
    """(log pi(token), entropy) `[N, A]` of the offered distribution (`token_policy_terms`):
    restricted to the allowed tokens at constrained positions, the full softmax elsewhere."""
    terms = token_policy_terms(logits, tokens, allowed_tokens, allowed_mask)
    return terms.logprobs_offered, terms.entropy_offered


def action_policy_terms(
    graph: PolicyGraph,
    frozen: FrozenBase,
    actor_lora,
    rows: PackedRows,
    temperature: float,
    allowed_tokens: jax.Array | None = None,
    allowed_mask: jax.Array | None = None,
) -> TokenPolicyTerms:
    """`token_policy_terms` `[N, A]` of softmax(logits / temperature) at each action column of
    `rows` `[N, P + A]` (one forward of the actor).

    On one device the output layer and the softmax run a piece of a row at a time (`rowwise_policy_terms`):
    the float32 logits of at most `OUTPUT_CHUNK_TOKENS` tokens exist at once, not `[N, A, V]` (1.2 GB per buffer for 8 of
    DataSciCoding's rows over Qwen's 151 936 tokens); on a mesh (`graph.constrain`) the rows stay split
    over its devices as they are."""
    num_rows, length = rows.tokens.shape
    prompt_len = rows.prompt_len
    action_len = length - prompt_len
    model = merge_model(graph, frozen, actor_lora)
    hidden = hidden_before_actions(model, rows, use_lora=True, constrain=graph.constrain)
    tokens = rows.tokens[:, prompt_len:]
    if graph.constrain is None:
        terms = rowwise_policy_terms(model, hidden, tokens, temperature, allowed_tokens, allowed_mask)
    else:
        terms = token_policy_terms(model.logits(hidden) / temperature, tokens, allowed_tokens, allowed_mask)
    chex.assert_shape(list(terms), (num_rows, action_len))
    return terms


OUTPUT_CHUNK_TOKENS = 64  # action tokens per step of the output layer: 64 x 151 936 float32 = 37 MiB a buffer (Qwen)


def output_pieces(action_len: int, chunk: int = OUTPUT_CHUNK_TOKENS) -> int:
    """p, the pieces a row's `action_len` action tokens split into for the output layer: the fewest equal
    pieces of at most `chunk` tokens (p divides A; 1 where A <= chunk)."""
    return next(p for p in range(max(-(-action_len // chunk), 1), action_len + 1) if action_len % p == 0)


def rowwise_policy_terms(model, hidden: jax.Array, tokens: jax.Array, temperature: float,
                         allowed_tokens: jax.Array | None, allowed_mask: jax.Array | None,
                         chunk: int = OUTPUT_CHUNK_TOKENS) -> TokenPolicyTerms:
    """`token_policy_terms` `[N, A]` of the logits of `hidden [N, A, H]`, one piece of a row at a time
    (`lax.map` over `[N p, A / p]`, p = `output_pieces(A, chunk)`).  Each piece's logits are recomputed in the
    backward pass (`jax.checkpoint`) rather than kept: what a differentiated pass holds of the output layer
    is one piece's `[A / p, V]`, not every row's and its log-softmax.  Every term is a token's own (its
    log-softmax over V), so each piece computes what the whole batch computes for its tokens."""
    rows, action_len = tokens.shape
    pieces = output_pieces(action_len, chunk)
    split = lambda x: None if x is None else x.reshape(rows * pieces, action_len // pieces, *x.shape[2:])  # noqa: E731

    @jax.checkpoint
    def one_piece(piece):
        h, t, allowed, mask = piece
        logits = model.logits(h[None]) / temperature
        terms = token_policy_terms(logits, t[None], None if allowed is None else allowed[None],
                                   None if mask is None else mask[None])
        return TokenPolicyTerms(*(term[0] for term in terms))

    terms = jax.lax.map(one_piece, tuple(split(x) for x in (hidden, tokens, allowed_tokens, allowed_mask)))
    return TokenPolicyTerms(*(term.reshape(rows, action_len) for term in terms))


def action_logprobs(*args, **kwargs) -> tuple[jax.Array, jax.Array]:
    """log pi(w_j | o, w^{<j}) and the policy's entropy at each action column, `(logprobs [N, A],
    entropy [N, A])`: `action_policy_terms`'s offered distribution (its arguments): softmax(logits /
    temperature), the distribution the sampler draws from, restricted to the allowed tokens where
    `allowed_mask` says so."""
    terms = action_policy_terms(*args, **kwargs)
    return terms.logprobs_offered, terms.entropy_offered


def base_features(graph: PolicyGraph, frozen: FrozenBase, lora, rows: PackedRows, use_lora: bool = False) -> jax.Array:
    """Final hidden states `[N, A, H]` at the action-predicting columns of `rows` `[N, P + A]`.

    With `use_lora=False` this is the frozen base with adapters off (the
    paper's critic input; `lora` is any LoRA state of the model, unused); with
    `use_lora=True` it is the forward with the given (critic) LoRA state.
    """
    model = merge_model(graph, frozen, lora)
    return hidden_before_actions(model, rows, use_lora=use_lora, constrain=graph.constrain)


def head_values(graph: PolicyGraph, head_state, features: jax.Array) -> jax.Array:
    """V(features): `[..., H] -> [...]`."""
    head = nnx.merge(graph.head_graphdef, head_state)
    return head(features)


# ---------------------------------------------------------------------------
# Action level (TWOSOME): every candidate action of a state, prompt shared.


def shared_prompt_visibility(prompt_len: int, num_candidates: int, action_len: int) -> jax.Array:
    """`[1, T, T]` bool of a packed row `prompt | candidate 0 | ... | candidate K-1`
    (T = P + K * A, each candidate in its own block of A columns): key column
    s is visible to query column t iff s is a prompt column or s lies in t's
    candidate block.  The model ANDs it with its causal rule and key mask, so
    each candidate attends to the prompt and to its own earlier tokens, exactly
    as it would in a row of its own.
    """
    columns = jnp.arange(prompt_len + num_candidates * action_len)
    block = jnp.where(columns < prompt_len, -1, (columns - prompt_len) // action_len)
    return ((block[None, :] == -1) | (block[None, :] == block[:, None]))[None]


def shared_prompt_token_logprobs(
    model: Llama,
    prompt: jax.Array,
    prompt_positions: jax.Array,
    prompt_mask: jax.Array,
    actions: jax.Array,
    action_positions: jax.Array,
    action_mask: jax.Array,
    *,
    use_lora: bool = True,
    unstacked=None,
    constrain=None,
) -> jax.Array:
    """log p(action token j | prompt, action tokens < j) of K candidates per
    prompt, the prompt encoded once: `[N, K, A]` (padding columns hold
    meaningless values; callers mask them with `action_mask`).

    Inputs: the prompt `[N, P]` (left padded, its positions and key mask) and
    the candidates `[N, K, A]` (right padded, positions continuing the
    prompt's, mask of real tokens).  The row `prompt | candidates` `[N, P + K A]`
    runs through the model once with `shared_prompt_visibility`: the prompt's
    activations (and, in the backward pass, their gradients) exist once per
    state instead of once per candidate.  Token 0 of every candidate is read
    from the prompt's last column, token j > 0 from its own column j - 1.
    """
    rows, num_candidates, action_len = actions.shape
    prompt_len = prompt.shape[1]
    flat = lambda x: x.reshape(rows, num_candidates * action_len)
    tokens = jnp.concatenate([prompt, flat(actions)], axis=1)
    positions = jnp.concatenate([prompt_positions, flat(action_positions)], axis=1)
    key_mask = jnp.concatenate([prompt_mask, flat(action_mask)], axis=1)
    visibility = shared_prompt_visibility(prompt_len, num_candidates, action_len)
    hidden = model(
        tokens, positions, key_mask, use_lora=use_lora, return_logits=False, unstacked=unstacked,
        visibility=visibility, constrain=constrain,
    ).hidden
    first = jax.nn.log_softmax(model.logits(hidden[:, prompt_len - 1], unstacked), axis=-1)  # [N, V]
    first = jnp.take_along_axis(first, actions[:, :, 0], axis=-1)  # [N, K]
    within = hidden[:, prompt_len:].reshape(rows, num_candidates, action_len, -1)[:, :, :-1]
    rest = jax.nn.log_softmax(model.logits(within, unstacked), axis=-1)  # [N, K, A - 1, V]
    rest = jnp.take_along_axis(rest, actions[:, :, 1:, None], axis=-1)[..., 0]
    logprobs = jnp.concatenate([first[..., None], rest], axis=-1)
    chex.assert_shape(logprobs, (rows, num_candidates, action_len))
    return logprobs


def candidate_token_logprobs(
    graph: PolicyGraph, frozen: FrozenBase, actor_lora, rows: PackedRows, share_prompt: bool = True
) -> jax.Array:
    """`[N, K, A]` token log-probs (temperature 1, full vocabulary) of the K
    candidate rows `rows` `[N, K, P + A]` of an action-level TokenBatch.

    `share_prompt=True` encodes each state's prompt once
    (`shared_prompt_token_logprobs`); `False` is the per-candidate
    computation (every candidate row runs prompt + action through the model),
    kept as the reference the shared one is tested against.  The rows of a
    state must share their prompt columns (`rollout.pack_batch` makes them so).
    """
    num_rows, num_candidates, _ = rows.tokens.shape
    if not share_prompt:
        logprobs, _ = action_logprobs(graph, frozen, actor_lora, rows.flat(), 1.0)
        return logprobs.reshape(num_rows, num_candidates, -1)
    model = merge_model(graph, frozen, actor_lora)
    tokens, positions, key_mask, prompt_len = rows.tokens, rows.positions, rows.key_mask, rows.prompt_len
    return shared_prompt_token_logprobs(
        model,
        tokens[:, 0, :prompt_len], positions[:, 0, :prompt_len], key_mask[:, 0, :prompt_len],
        tokens[:, :, prompt_len:], positions[:, :, prompt_len:], key_mask[:, :, prompt_len:],
        constrain=graph.constrain,
    )


def action_level_log_policy(
    token_logprobs: jax.Array, action_mask: jax.Array, normalizer: jax.Array, candidate_mask: jax.Array
) -> jax.Array:
    """TWOSOME's policy over the candidates, `[N, K]` log-probs (0 on padding candidates):

        log pi(a_k) = log_softmax_k( sum_j log p(w_kj) / normalizer_k )

    over the real candidates (`candidate_mask`), from token log-probs `[N, K, A]`.
    """
    scores = jnp.sum(jnp.where(action_mask, token_logprobs, 0.0), axis=-1) / normalizer
    scores = jnp.where(candidate_mask, scores, -jnp.inf)
    log_pi = jax.nn.log_softmax(scores, axis=-1)
    return jnp.where(candidate_mask, log_pi, 0.0)
