"""Matmul FLOPs of the training loop's passes, from the model config and the shapes they run.

A multiply-add is 2 FLOPs.  Counted: the decoder's projections, attention's
two matmuls (scores q k^T and weights x v, masked entries included: the
kernels compute them), the output layer at the columns whose logits a pass
takes, and the critic head's MLP.  Not counted: LoRA's rank-r matmuls (about
0.5 % of a SmolLM2 layer's at rank 8 on q and v), norms, RoPE, softmax and
other elementwise work.  `config` is a `models.LlamaConfig` (any object with
its fields).

Where the loop spends them (`Sampler.matmul_flops`, `update_flops`; the
`flops_*` fields of a training record):

- sampler: prefill (`P - 1` prompt tokens over their own keys), then per
  decode step one token per row over every cache slot, with the
  full-vocabulary output layer; TWOSOME scoring: one forward of
  `prompt | candidates`;
- behaviour pass: the policy's forward, the critic features' forward
  (adapters off), the value head, the bootstrap rows' forward;
- learner: per epoch every row forward and backward (`training_flops`).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

# Forward passes that one forward + backward costs, per kind of matmul (`PassFlops`) and
# remat policy.  Backward: a projection or the output layer with a frozen weight computes
# the activation gradient only (1 pass), attention's two matmuls the gradients of both
# operands (2).  Recomputation: "full" runs again every layer matmul whose result the
# backward pass reads, i.e. all but the MLP's down projection (its result only feeds the
# layer's output); "dots" saves the projections' results (matmuls without batch
# dimensions) and recomputes attention's scores, not its weighted values (they only feed
# o_proj, whose frozen weight needs no input for its backward; LoRA on o_proj would).
TRAINING_PASSES = {
    "none": {"projections": 2, "mlp_output": 2, "scores": 3, "values": 3, "output": 2},
    "dots": {"projections": 2, "mlp_output": 2, "scores": 4, "values": 3, "output": 2},
    "full": {"projections": 3, "mlp_output": 2, "scores": 4, "values": 4, "output": 2},
}


@dataclasses.dataclass(frozen=True)
class Pass:
    """One forward pass: `rows` rows of `length` tokens, every query attending over
    `keys` slots (None: `length`, the full square), logits at `logit_columns` columns of each row."""

    rows: int
    length: int
    logit_columns: int = 0
    keys: int | None = None


class PassFlops(NamedTuple):
    """A forward pass's matmul FLOPs by kind: the decoder's projections but the MLP's
    output (`mlp_output`, the down projection), attention's scores and weighted values,
    and the output layer."""

    projections: int
    mlp_output: int
    scores: int
    values: int
    output: int

    @property
    def total(self) -> int:
        return sum(self)


class SchemePasses(NamedTuple):
    """A credit scheme's passes over one batch (`agent.methods.TokenLevel.passes`, `ActionLevel.passes`): the policy's, the
    critic features' (no logits), how many value-head inputs they give, and whether the policy's logits go
    row by row (`core.policy.rowwise_policy_terms` on one device: the backward recomputes the output layer)."""

    policy: Pass
    critic: Pass
    values: int
    policy_rowwise: bool = True


def layer_weights(config) -> tuple[int, int]:
    """(projection weights but the down projection, down projection weights) of one decoder layer:
    (H (2 Q + 2 K) + 2 H I, H I), with Q the query width (heads x head dim), K the key/value
    width and I the MLP width."""
    query = config.num_attention_heads * config.dim_per_head
    kv = config.num_key_value_heads * config.dim_per_head
    hidden, inter = config.hidden_size, config.intermediate_size
    return hidden * (2 * query + 2 * kv) + 2 * hidden * inter, hidden * inter


def decoder_weights(config) -> int:
    """Matmul weights of the decoder layers: L x sum(layer_weights)."""
    return config.num_hidden_layers * sum(layer_weights(config))


def pass_flops(config, p: Pass) -> PassFlops:
    """FLOPs of a forward pass (T = rows x length tokens, S = keys per query):

        projections = 2 L (H (2 Q + 2 K) + 2 H I) T,   mlp_output = 2 L H I T
        scores      = values = 2 L Q T S
        output      = 2 H V x rows x logit_columns
    """
    keys = p.length if p.keys is None else p.keys
    tokens = p.rows * p.length
    layers = config.num_hidden_layers
    projections, down = layer_weights(config)
    attention = 2 * layers * config.num_attention_heads * config.dim_per_head * tokens * keys
    return PassFlops(
        projections=2 * layers * projections * tokens,
        mlp_output=2 * layers * down * tokens,
        scores=attention,
        values=attention,
        output=2 * config.hidden_size * config.vocab_size * p.rows * p.logit_columns,
    )


def training_flops(config, p: Pass, remat: str, output_recomputed: bool = False) -> int:
    """Forward + backward of a pass through the frozen base (adapters aside):
    sum over kinds of TRAINING_PASSES[remat][kind] x that kind's forward FLOPs, plus one more forward of
    the output layer where the backward recomputes it (`output_recomputed`: the policy's log-probs one row
    at a time on one device, `core.policy.rowwise_policy_terms`)."""
    passes = TRAINING_PASSES[remat]
    flops = pass_flops(config, p)
    return sum(passes[kind] * n for kind, n in flops._asdict().items()) + (flops.output if output_recomputed else 0)


def head_layer_weights(hidden: int, sizes) -> list[int]:
    """fan_in x fan_out of each layer of the value head `hidden -> sizes... -> 1`."""
    dims = (int(hidden), *(int(s) for s in sizes), 1)
    return [a * b for a, b in zip(dims[:-1], dims[1:])]


def head_flops(hidden: int, sizes, elements: int) -> int:
    """The value head's forward over `elements` inputs: 2 x elements x sum of its layers' weights."""
    return 2 * elements * sum(head_layer_weights(hidden, sizes))


def head_training_flops(hidden: int, sizes, elements: int, features_trained: bool = False) -> int:
    """The head's forward and backward: forward, weight gradients (one forward each), and the
    input gradients of every layer but the first, whose input, the features, is constant
    unless `features_trained` (critic "lora"):

        2 x elements x (3 x sum(weights) - weights of the first layer [unless features_trained])
    """
    weights = head_layer_weights(hidden, sizes)
    return 2 * elements * (3 * sum(weights) - (0 if features_trained else weights[0]))


def prefill_flops(config, rows: int, prompt_len: int) -> int:
    """The sampler's prefill: `P - 1` prompt tokens per row over their own keys, no logits."""
    return pass_flops(config, Pass(rows, prompt_len - 1)).total if prompt_len > 1 else 0


def decode_flops(config, rows: int, steps: int, cache_len: int) -> int:
    """`steps` decode steps: one token per row over all `cache_len` slots, logits over the vocabulary."""
    return steps * pass_flops(config, Pass(rows, 1, 1, keys=cache_len)).total


def shared_prompt_pass(rows: int, prompt_len: int, candidates: int, action_len: int) -> Pass:
    """One row `prompt | K candidates` per state (`P + K A` tokens, `policy.shared_prompt_token_logprobs`),
    logits at the prompt's last column and the first `A - 1` columns of every candidate."""
    return Pass(rows, prompt_len + candidates * action_len, 1 + candidates * (action_len - 1))


def scoring_flops(config, rows: int, prompt_len: int, candidates: int, action_len: int) -> int:
    """TWOSOME scoring in the sampler: one `shared_prompt_pass` forward."""
    return pass_flops(config, shared_prompt_pass(rows, prompt_len, candidates, action_len)).total


def update_flops(config, passes: SchemePasses, *, head_sizes, next_rows: int, prompt_len: int, critic_kind: str,
                 remat: str, epochs: int, sampler_logprobs: bool = False, behaviour_passes: SchemePasses | None = None,
                 bootstrap: Pass | None = None, reference_logprobs: bool = False,
                 rowwise_output: bool = False) -> dict[str, int]:
    """Matmul FLOPs of one update's behaviour pass and learner, `{"behaviour": ..., "learner": ...}`.

    behaviour = policy forward + critic forward + head(values)
                + bootstrap forward (`next_rows` rows of `P + 1` tokens) + head(next_rows)
                (without the policy forward when the old log-probs are the sampler's)
    learner   = epochs x [training(policy) + head training(values)
                          (+ training(critic) with the features trained, critic_kind "lora")]

    `critic_kind="none"` (GRPO, GiGPO): no critic, head or bootstrap pass; the behaviour pass is
    the policy forward (plus a second, the frozen base's, with `reference_logprobs`).

    `behaviour_passes` and `bootstrap` replace the behaviour pass's own where it runs other
    passes than the learner (rows packed by another prefix plan, `core/shared_prefix.py`).
    `rowwise_output`: the learner's policy pass recomputes its output layer in the backward (one device).
    """
    hidden = config.hidden_size
    bootstrap = Pass(next_rows, prompt_len + 1) if bootstrap is None else bootstrap
    behaviour_passes = passes if behaviour_passes is None else behaviour_passes
    policy = 0 if sampler_logprobs else pass_flops(config, behaviour_passes.policy).total
    if critic_kind == "none":  # a critic-free method (GRPO, GiGPO): the policy alone
        reference = pass_flops(config, behaviour_passes.policy).total if reference_logprobs else 0
        return {"behaviour": policy + reference,
                "learner": epochs * training_flops(config, passes.policy, remat,
                                                   rowwise_output and passes.policy_rowwise)}
    behaviour = (policy + pass_flops(config, behaviour_passes.critic).total
                 + pass_flops(config, bootstrap).total + head_flops(hidden, head_sizes, passes.values + next_rows))
    lora_critic = critic_kind == "lora"
    learner = (training_flops(config, passes.policy, remat, rowwise_output and passes.policy_rowwise)
               + head_training_flops(hidden, head_sizes, passes.values, features_trained=lora_critic))
    if lora_critic:
        learner += training_flops(config, passes.critic, remat)
    return {"behaviour": behaviour, "learner": epochs * learner}
