"""One jit-compiled PPO update for the five methods: POAD, NTPO, TWOSOME, GRPO and GiGPO.

The whole update is one compiled call (PureJaxRL style), top to bottom:

1. Advantages: the method's credit scheme (`methods.py`) lays the rollout's
   behaviour values and rewards out as per-thread streams (one element per
   action token for POAD/NTPO, one per action for TWOSOME) with their
   discounts, and `gae.token_gae` runs one reverse scan.  GRPO and GiGPO
   have no critic: their group-relative advantages come with the batch
   (`core/group_advantages.py`), on every token of a step's action, and
   their value loss is 0.
2. `epochs x minibatches` nested `lax.scan`: each minibatch normalises its
   advantages over its valid tokens, accumulates gradients over
   `accumulation_steps` micro-batches (bounding activation memory), computes
   the clipped policy loss (token mean), clipped value loss, entropy bonus and
   approximate KL; a minibatch whose KL exceeds `target_kl` is skipped (no
   parameter or optimiser change; with `kl_skip="actor"`, as the authors'
   trainer, only the actor's), otherwise gradients are clipped by global
   norm and applied by separate actor and critic Adam optimisers.  A
   minibatch whose loss, approximate KL or gradient norm is not finite
   changes neither actor nor critic, parameters nor optimiser states, and is
   counted (`nonfinite_steps`): one bad number costs one minibatch step.  The
   policy terms are one token mean over the minibatch, or with `loss_chunks`
   C > 1 the mean of C row chunks' token means (the authors' averaging);
   `advantage_normalization="adrl"` normalises as their trainer does
   (docs/adrl_parity.md).

The frozen base is an argument (never a closed-over constant) and the train
state is donated, so the update runs in place.  The math is pure functions
below the agent: the per-element terms, the advantage normalisations and the
importance correction in `core/losses.py`, GAE in `core/gae.py`, the means
over a minibatch's steps in `core/step_statistics.py`; this module composes
them with the scans and the optimisers.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from poad_jax.core import gae, losses
from poad_jax.core.step_statistics import finite_step_means, step_is_finite
from poad_jax.agent.methods import Method
from poad_jax.agent.learner_config import LearnerConfig
from poad_jax.core.policy import FrozenBase, PolicyGraph, head_values
from poad_jax.core.token_batch import CorrectedTokenBatch, TokenBatch


def check_batch_rows(num_rows: int, config: LearnerConfig, row_groups: int = 1) -> None:
    """The batch splits into `num_minibatches x accumulation_steps` equal parts on each of
    `row_groups` batch shards (a shape contract of the update; the settings themselves are
    checked once, by `poad_jax.run.config.validate`)."""
    if num_rows % (config.num_minibatches * config.accumulation_steps * row_groups):
        shards = " x batch shards" if row_groups != 1 else ""
        counts = f" x {row_groups}" if row_groups != 1 else ""
        raise ValueError(
            f"rows per update ({num_rows}) must be divisible by num_minibatches x accumulation_steps{shards} "
            f"({config.num_minibatches} x {config.accumulation_steps}{counts})"
        )


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
    """Everything the update changes: params, optimiser states, RNG, counters."""

    params: dict[str, Any]  # {"actor": LoRA state, "head": head state[, "critic_lora": ...]}
    actor_opt_state: Any
    critic_opt_state: Any
    rng: jax.Array
    update_step: jax.Array  # int32 scalar


def make_optimizers(config: LearnerConfig) -> tuple[optax.GradientTransformation, optax.GradientTransformation]:
    """Actor and critic optimisers: clip by global norm, then Adam(eps)."""
    def chain(lr):
        return optax.chain(
            optax.clip_by_global_norm(config.max_grad_norm), optax.adam(lr, eps=config.adam_eps)
        )

    return chain(config.actor_lr), chain(config.critic_lr)


def critic_params(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if k != "actor"}


def init_train_state(params: dict[str, Any], config: LearnerConfig, rng: jax.Array) -> TrainState:
    actor_opt, critic_opt = make_optimizers(config)
    return TrainState(
        params=params,
        actor_opt_state=actor_opt.init(params["actor"]),
        critic_opt_state=critic_opt.init(critic_params(params)),
        rng=rng,
        update_step=jnp.zeros((), jnp.int32),
    )


@dataclasses.dataclass(frozen=True)
class UpdateContext:
    """What one compiled update is built for: static and hashable, so a `jax.jit` static value
    (one compilation per context and batch shape).

    Attributes:
      graph: the policy's graph (`core/policy.py`; hashed by identity).
      method: the method, whose credit scheme lays the batch out.
      config: the PPO settings (`LearnerConfig`).
      row_groups: G, the batch's rows form G equal contiguous groups (one per device holding
        rows) and every minibatch and micro-batch takes as many rows from each
        (`minibatch_order`); 1 on one device.
    """

    graph: PolicyGraph
    method: Method
    config: LearnerConfig
    row_groups: int = 1


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class UpdateBatch:
    """A rollout's batch with its GAE targets, in the batch's row layout (`[N, A]` token level,
    `[N]` action level): what the minibatch steps take rows of (`_take_group_rows`)."""

    batch: TokenBatch
    advantages: jax.Array
    returns: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class WeightedRows(UpdateBatch):
    """A minibatch's (or micro-batch's) rows, their advantages normalised, with each element's
    share of the minibatch's means (`losses.chunk_weights`): `policy_weights` for the policy,
    entropy and KL terms, `value_weights` for the value term."""

    policy_weights: jax.Array
    value_weights: jax.Array


def split_rng(state: TrainState) -> tuple[TrainState, jax.Array]:
    """(the state with its RNG advanced, a fresh key): the key an epoch draws its minibatch order with."""
    rng, key = jax.random.split(state.rng)
    return dataclasses.replace(state, rng=rng), key


def compute_advantages(batch: TokenBatch, method: Method, config: LearnerConfig):
    """GAE advantages and returns in the batch's row layout (the scheme's
    streams and discounts, one `gae.token_gae` scan).

    Token level: `[N, A]`; action level: `[N]`.  A critic-free method's (GRPO, GiGPO):
    each row's group-relative advantage on every token of its action, and no returns (zeros).
    """
    if not method.uses_critic:
        advantages = jnp.where(batch.action_mask, batch.advantages[:, None], 0.0)
        return advantages, jnp.zeros_like(advantages)
    streams = method.scheme.streams(batch, config.gamma)
    lam = config.lam
    if config.lambda_scope == "action" and method.token_level:
        lam = gae.action_lambdas(streams["action_end"], config.lam)
    advantages, returns = gae.token_gae(
        streams["rewards"],
        streams["values"],
        streams["discounts"],
        streams["valid"],
        batch.bootstrap_value,
        lam,
    )
    shape = batch.old_values.shape
    return advantages.reshape(shape), returns.reshape(shape)


def policy_outputs(
    graph: PolicyGraph,
    frozen: FrozenBase,
    params: dict[str, Any],
    batch: TokenBatch,
    method: Method,
    config: LearnerConfig,
):
    """(logprobs, entropy, values, mask) of the current params on `batch` rows.

    The method's scheme computes the log-probs and entropy (token level: per
    action token `[n, A]`; action level, TWOSOME: the softmax over the K
    candidates of their summed token log-probs divided by the normaliser,
    per action `[n]`) and the critic's input; the value head is shared.
    (What a test or a benchmark reads; the update reads `policy_and_value_terms`.)
    """
    context = UpdateContext(graph, method, config)
    logprobs, entropy, _, values, mask = policy_and_value_terms(params, frozen, batch, context)
    return logprobs, entropy, values, mask


def policy_and_value_terms(params: dict[str, Any], frozen: FrozenBase, batch: TokenBatch, context: UpdateContext):
    """`policy_outputs` with the entropies over each support the scheme has
    (`{"entropy_vocabulary", "entropy_offered"}` at the token level, for the logs):
    (logprobs, entropy, entropies, values, mask)."""
    graph, method, config = context.graph, context.method, context.config
    scheme = method.scheme
    logprobs, entropy, entropies = scheme.policy_terms(graph, frozen, params["actor"], batch, config.temperature)
    if not method.uses_critic:  # no critic: the values are the batch's zeros, and the value loss 0
        return logprobs, entropy, entropies, batch.old_values, scheme.valid(batch)
    if config.critic_kind == "lora":
        features = scheme.critic_features(graph, frozen, params["critic_lora"], batch, use_lora=True)
    else:
        features = batch.features
    values = head_values(graph, params["head"], features)
    return logprobs, entropy, entropies, values, scheme.valid(batch)


def _take_rows(tree, index):
    return jax.tree.map(lambda x: jnp.take(x, index, axis=0), tree)


def _take_group_rows(tree, index):
    """Rows `index [G, k]` of `tree`, whose N rows form G equal contiguous
    groups and `index[g]` indexes rows within group g: `[G * k, ...]`, group
    by group.  With the rows split over G devices (`poad_jax.parallel`)
    every device takes only its own rows (a batched gather, no collective);
    G = 1 is a plain take.
    """
    groups = index.shape[0]
    if groups == 1:
        return _take_rows(tree, index[0])

    def take(x):
        grouped = x.reshape(groups, x.shape[0] // groups, *x.shape[1:])
        taken = jax.vmap(lambda rows, i: jnp.take(rows, i, axis=0))(grouped, index)
        return taken.reshape(-1, *x.shape[1:])

    return jax.tree.map(take, tree)


def _take_fields(rows: UpdateBatch, index) -> UpdateBatch:
    """`rows` with the rows `index [G, k]` of each field (`_take_group_rows`), taken field by
    field: the order of operations the compiled update has always had (one shared slice of
    `index` computes the same but changes the HLO's text, `scripts/hlo_hash.py`)."""
    return type(rows)(*(_take_group_rows(getattr(rows, f.name), index) for f in dataclasses.fields(rows)))


def minibatch_order(rng: jax.Array, num_rows: int, num_minibatches: int, row_groups: int = 1) -> jax.Array:
    """`[M, G, N / (M G)]` row indices within each of G groups: minibatch m
    takes chunk m of an independent permutation of every group's N / G rows.

    G = 1 is one permutation of all rows (minibatches drawn uniformly).  G > 1
    (one group per batch shard) keeps every minibatch's rows on the devices
    that hold them: a global permutation would move rows between devices.
    """
    if row_groups == 1:
        return jax.random.permutation(rng, num_rows).reshape(num_minibatches, 1, -1)
    keys = jax.random.split(rng, row_groups)
    perms = jax.vmap(lambda key: jax.random.permutation(key, num_rows // row_groups))(keys)
    return jnp.swapaxes(perms.reshape(row_groups, num_minibatches, -1), 0, 1)


def jit_update(
    graph: PolicyGraph, method: Method, config: LearnerConfig
) -> tuple[Callable[[TrainState, FrozenBase, TokenBatch], tuple[TrainState, dict]], Callable[[], int]]:
    """Builds the jit-compiled update `(state, frozen, batch) -> (state, metrics)`.

    Returns the update function and a function giving its compile count.
    (On a device mesh: `poad_jax.agent.sharded_update.jit_sharded_update`.)
    """
    update, compiles = build_update(graph, method, config)
    return jax.jit(update, donate_argnums=(0,)), compiles


def build_update(
    graph: PolicyGraph, method: Method, config: LearnerConfig, row_groups: int = 1,
) -> tuple[Callable[[TrainState, FrozenBase, TokenBatch], tuple[TrainState, dict]], Callable[[], int]]:
    """The update function `(state, frozen, batch) -> (state, metrics)` before `jax.jit`
    (`ppo_update` in the context of `graph`, `method`, `config` and `row_groups`,
    `UpdateContext`), and its trace count."""
    context = UpdateContext(graph, method, config, row_groups)
    traces = {"count": 0}

    def update(state: TrainState, frozen: FrozenBase, batch: TokenBatch):
        traces["count"] += 1  # runs at trace time only: counts compilations
        state, metrics, _ = ppo_update(state, frozen, batch, context)
        return state, metrics

    return update, lambda: traces["count"]


def update_batch(batch: TokenBatch, context: UpdateContext) -> UpdateBatch:
    """The batch with its advantages and returns (`compute_advantages`), once per update.
    ValueError (one line) for a batch without what the settings read: the importance
    correction reads a `CorrectedTokenBatch`'s behaviour log-probs."""
    if context.config.behaviour_correction == "importance" and not isinstance(batch, CorrectedTokenBatch):
        raise ValueError(f"ppo.behaviour_correction='importance' needs a CorrectedTokenBatch (the behaviour "
                         f"log-probs, packed with the rollout's pack_behaviour), got a {type(batch).__name__}")
    advantages, returns = compute_advantages(batch, context.method, context.config)
    return UpdateBatch(batch, advantages, returns)


def ppo_update(state: TrainState, frozen: FrozenBase, batch: TokenBatch,
               context: UpdateContext) -> tuple[TrainState, dict, dict]:
    """One PPO update: advantages and returns once (`update_batch`), then `epochs` passes
    over the batch in `num_minibatches` minibatches (`minibatch_step`), each epoch in a
    fresh random order (`minibatch_order`).

    Returns (state, metrics, details) (`finish_update`).  A harness that replays given
    minibatch orders composes the same parts (`bench/adrl_parity.py:replayed_update`).
    """
    config = context.config
    num_rows = batch.num_rows
    check_batch_rows(num_rows, config, context.row_groups)
    data = update_batch(batch, context)
    value_mask = context.method.scheme.valid(batch)

    def epoch(state, _):
        state, key = split_rng(state)
        order = minibatch_order(key, num_rows, config.num_minibatches, context.row_groups)
        return jax.lax.scan(lambda carry, index: minibatch_step(carry, index, frozen, data, context), state, order)

    state, stats = jax.lax.scan(epoch, state, None, length=config.epochs)
    return finish_update(state, stats, data, value_mask, context)


def finish_update(state: TrainState, stats: dict, data: UpdateBatch, value_mask: jax.Array,
                  context: UpdateContext) -> tuple[TrainState, dict, dict]:
    """(state with its update counter advanced, metrics, details) after the epochs' steps
    `stats [epochs, M]`: metrics are the minibatches' means and the batch's statistics;
    details hold every minibatch's statistics and the advantages and returns (what a
    harness records; `jax.jit` drops them where the caller does not return them)."""
    batch = data.batch
    metrics = finite_step_means(stats)
    metrics["skipped_minibatches"] = jnp.sum(stats["skipped"])
    metrics["nonfinite_steps"] = jnp.sum(stats["nonfinite"])
    metrics["explained_variance"] = losses.explained_variance(batch.old_values, data.returns, value_mask)
    metrics["advantage_mean"] = losses.masked_mean(data.advantages, value_mask)
    metrics["return_mean"] = losses.masked_mean(data.returns, value_mask)
    if context.config.behaviour_correction == "importance":  # how far the sampled distribution is from pi_old
        metrics.update(losses.behaviour_divergence(batch.behaviour_logprobs, batch.old_logprobs, value_mask))
    state = dataclasses.replace(state, update_step=state.update_step + 1)
    return state, metrics, {"minibatches": stats, "advantages": data.advantages, "returns": data.returns}


def minibatch_loss(params, frozen: FrozenBase, rows: WeightedRows, context: UpdateContext):
    """The minibatch's loss as weighted sums: `rows.policy_weights` (the policy, entropy
    and KL terms) and `rows.value_weights` (the value term) hold this micro-batch's
    share of the minibatch's means (`minibatch_gradients`).  Returns (loss, stats)."""
    config, mb = context.config, rows.batch
    policy_weights, value_weights = rows.policy_weights, rows.value_weights
    logprobs, entropy, entropies, values, _ = policy_and_value_terms(params, frozen, mb, context)
    if config.entropy_scope == "offered":
        entropy = entropies["entropy_offered"]
    total = lambda x, w: jnp.sum(x * w)
    surrogate = losses.clipped_surrogate(logprobs, mb.old_logprobs, rows.advantages, config.clip_eps)
    stats = {}
    if config.behaviour_correction == "importance":
        weights = losses.importance_weights(mb.old_logprobs, mb.behaviour_logprobs, config.importance_weight_clip)
        surrogate = surrogate * weights
        stats["importance_weight"] = total(weights, policy_weights)
    policy_loss = total(surrogate, policy_weights)
    value_loss = total(losses.clipped_value_error(values, mb.old_values, rows.returns, config.value_clip_eps),
                       value_weights)
    entropy_mean = total(entropy, policy_weights)
    loss = policy_loss + config.vf_coef * value_loss - config.ent_coef * entropy_mean
    if config.ref_kl_coef > 0:  # the penalty to the frozen base model, clipped as verl-agent's low_var_kl
        ref_kl = total(jnp.clip(losses.k3_kl(mb.ref_logprobs, logprobs), -10.0, 10.0), policy_weights)
        loss = loss + config.ref_kl_coef * ref_kl
        stats["ref_kl"] = ref_kl
    stats.update({
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": entropy_mean,
        "approx_kl": total(losses.k3_kl(logprobs, mb.old_logprobs), policy_weights),
        "clip_fraction": total(losses.outside_clip(logprobs, mb.old_logprobs, config.clip_eps), policy_weights),
    })
    stats.update({name: total(value, policy_weights) for name, value in entropies.items()})
    return loss, stats


def minibatch_step(state: TrainState, minibatch_index, frozen: FrozenBase, data: UpdateBatch,
                   context: UpdateContext) -> tuple[TrainState, dict]:
    """One minibatch's PPO step: its gradients (`minibatch_gradients`), then the actor's and the
    critic's Adam steps unless the KL skips them (`apply_minibatch`).  Returns (state, stats)."""
    loss, stats, grads, _ = minibatch_gradients(state, minibatch_index, frozen, data, context)
    return apply_minibatch(state, loss, stats, grads, context.config)


def minibatch_rows(data: UpdateBatch, minibatch_index: jax.Array, context: UpdateContext) -> WeightedRows:
    """The rows `minibatch_index [G, k]` of `data`, their advantages normalised (methods with a
    critic, with `normalize_advantages`; group advantages are normalised in their groups), with
    their loss weights (`losses.chunk_weights` over the valid elements)."""
    method, config = context.method, context.config
    rows = _take_fields(data, minibatch_index)
    mask = method.scheme.valid(rows.batch)
    advantages = rows.advantages
    if config.normalize_advantages and method.uses_critic:
        advantages = losses.normalized_advantages(advantages, mask, method.scheme.token_level,
                                                  config.advantage_normalization, config.loss_chunks)
    return WeightedRows(rows.batch, advantages, rows.returns, losses.chunk_weights(mask, config.loss_chunks),
                        losses.chunk_weights(mask, 1))


def minibatch_gradients(state: TrainState, minibatch_index, frozen: FrozenBase, data: UpdateBatch,
                        context: UpdateContext):
    """A minibatch's loss, statistics and gradients: its rows `minibatch_index [G, k]`
    (`minibatch_rows`), gradients accumulated over `accumulation_steps` micro-batches
    (`minibatch_loss`).  Returns (loss, stats, grads, the minibatch's normalised advantages)."""
    grad_fn = jax.value_and_grad(functools.partial(minibatch_loss, context=context), has_aux=True)
    mb = minibatch_rows(data, minibatch_index, context)
    micro = context.config.accumulation_steps
    groups, group_rows = minibatch_index.shape
    micro_rows = group_rows // micro  # micro-batch j: chunk j of every group's rows
    micro_index = jnp.broadcast_to(
        jnp.arange(group_rows).reshape(micro, 1, micro_rows), (micro, groups, micro_rows)
    )

    def accumulate(acc, index):
        (loss, stats), grads = grad_fn(state.params, frozen, _take_fields(mb, index))
        acc = jax.tree.map(jnp.add, acc, (loss, stats, grads))
        return acc, None

    shapes = jax.eval_shape(grad_fn, state.params, frozen, _take_fields(mb, micro_index[0]))  # the stats' keys
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), (shapes[0][0], shapes[0][1], shapes[1]))
    (loss, stats, grads), _ = jax.lax.scan(accumulate, zeros, micro_index)
    return loss, stats, grads, mb.advantages


def apply_minibatch(state: TrainState, loss, stats: dict, grads, config: LearnerConfig) -> tuple[TrainState, dict]:
    """The optimiser steps on a minibatch's gradients (`apply_gradients`), and its statistics
    with the loss, the gradient norms, whether the KL skipped it and whether it was not finite."""
    actor_grad_norm = optax.tree.norm(grads["actor"])
    critic_grad_norm = optax.tree.norm(critic_params(grads))
    finite = step_is_finite(loss, stats["approx_kl"], actor_grad_norm, critic_grad_norm)
    new_state, skip = apply_gradients(state, grads, stats["approx_kl"], config, finite)
    stats = dict(
        stats,
        loss=loss,
        actor_grad_norm=actor_grad_norm,
        critic_grad_norm=critic_grad_norm,
        skipped=skip.astype(jnp.float32),
        nonfinite=jnp.logical_not(finite).astype(jnp.float32),
    )
    return new_state, stats


def apply_gradients(state: TrainState, grads, approx_kl, config: LearnerConfig,
                    finite: jax.Array | bool = True) -> tuple[TrainState, jax.Array]:
    """The actor's and the critic's optimiser steps on a minibatch's gradients.

    A minibatch whose approximate KL exceeds `target_kl` keeps the actor (and with
    `kl_skip="update"` the critic too); one that is not `finite` keeps both, parameters and
    optimiser states (the guard optax's `apply_if_finite` is for one optimiser, here for the
    actor and the critic together, without a counter in their states: the checkpoints keep
    their layout).  Returns (state, skipped on the KL)."""
    actor_opt, critic_opt = make_optimizers(config)
    actor_grads = grads["actor"]
    critic_grads = critic_params(grads)
    actor_updates, actor_opt_state = actor_opt.update(actor_grads, state.actor_opt_state, state.params["actor"])
    critic_updates, critic_opt_state = critic_opt.update(
        critic_grads, state.critic_opt_state, critic_params(state.params)
    )
    finite = jnp.asarray(finite)
    skip = jnp.logical_and(approx_kl > config.target_kl, finite)
    keep_actor = jnp.logical_or(skip, jnp.logical_not(finite))
    keep_critic = keep_actor if config.kl_skip == "update" else jnp.logical_not(finite)
    keep_old = lambda keep, old, new: jax.tree.map(lambda a, b: jnp.where(keep, a, b), old, new)
    new_params = dict(state.params)
    new_params["actor"] = keep_old(keep_actor, state.params["actor"],
                                   optax.apply_updates(state.params["actor"], actor_updates))
    actor_opt_state = keep_old(keep_actor, state.actor_opt_state, actor_opt_state)
    new_params.update(keep_old(keep_critic, critic_params(state.params),
                               optax.apply_updates(critic_params(state.params), critic_updates)))
    critic_opt_state = keep_old(keep_critic, state.critic_opt_state, critic_opt_state)
    new_state = dataclasses.replace(
        state, params=new_params, actor_opt_state=actor_opt_state, critic_opt_state=critic_opt_state
    )
    return new_state, skip
