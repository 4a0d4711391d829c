"""The learner's compiled PPO update on a device mesh.

`jit_sharded_update` is `learner.jit_update` with shardings: the
same update function (`learner.build_update`), compiled by `jax.jit` with

- in/out shardings of the train state by rule (LoRA, value head, critic
  LoRA and their Adam states: `sharding.train_rules`), the state donated so
  the update runs in place on every device;
- the frozen base by rule (split over fsdp and tensor; never differentiated,
  so no gradient of it is ever formed);
- the TokenBatch's rows split over ('data', 'fsdp'): whole rollout threads
  per device, so the GAE scans stay local; minibatches and micro-batches take
  the same number of rows from every device (`learner.minibatch_order` with
  one row group per batch shard);
- metrics replicated.

XLA's SPMD partitioner inserts the collectives: an all-reduce of the
gradients (and of the loss statistics) over the batch axes, per-layer
all-gathers of the fsdp-split base weights inside the layer scan.  The
latter needs the model's activation hook (`constrained_graph`): left free,
the partitioner keeps the weights in place and moves activations instead.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import Mesh

from poad_jax.parallel.sharding import (
    Rules,
    activation_constraint,
    batch_shardings,
    batch_shards,
    check_tensor_split,
    replicated,
    train_rules,
    tree_shardings,
)
from poad_jax.agent.learner import LearnerConfig, build_update, init_train_state
from poad_jax.agent.methods import Method
from poad_jax.core.policy import FrozenBase, PolicyGraph, merge_model


def constrained_graph(graph: PolicyGraph, mesh: Mesh) -> PolicyGraph:
    """`graph` whose forward passes pin the residual stream's rows over
    ('data', 'fsdp') at the top of every decoder layer
    (`sharding.activation_constraint`): FSDP as ZeRO-3, each device runs its
    own rows through every layer and all-gathers that layer's fsdp-split
    weights.  The sampler ignores it (it calls the model without the hook)."""
    return dataclasses.replace(graph, constrain=activation_constraint(mesh))


def shard_policy(frozen: FrozenBase, params: dict[str, Any], mesh: Mesh, rules: Rules | None = None):
    """(frozen, params) placed on `mesh` by `rules` (default: the training layout)."""
    rules = train_rules() if rules is None else rules
    return (jax.device_put(frozen, tree_shardings(frozen, rules, mesh)),
            jax.device_put(params, tree_shardings(params, rules, mesh)))


def shard_train_state(state, mesh: Mesh, rules: Rules | None = None):
    """A TrainState placed on `mesh` by `rules`: optimiser states follow
    their parameter (their paths contain the parameter's), RNG and counters
    are replicated."""
    rules = train_rules() if rules is None else rules
    return jax.device_put(state, tree_shardings(state, rules, mesh))


def init_sharded_train_state(params: dict[str, Any], config: LearnerConfig, rng: jax.Array, mesh: Mesh,
                             rules: Rules | None = None):
    """`learner.init_train_state` compiled with the state's shardings as
    outputs: the Adam states are made on the devices (and in the layout)
    they live in.  Works across processes, where an array made on one
    process's device cannot be `device_put` onto a global mesh; `rng` goes
    in as host key data."""
    rules = train_rules() if rules is None else rules
    key_data = np.asarray(jax.random.key_data(rng))

    def init(params, key_data):
        return init_train_state(params, config, jax.random.wrap_key_data(key_data))

    shardings = tree_shardings(jax.eval_shape(init, params, key_data), rules, mesh)
    return jax.jit(init, out_shardings=shardings)(params, key_data)


def jit_sharded_update(
    graph: PolicyGraph, method: Method, config: LearnerConfig, mesh: Mesh, rules: Rules | None = None,
    constrain_activations: bool = True,
) -> tuple[Callable, Callable[[], int]]:
    """The update `(state, frozen, batch) -> (state, metrics)` compiled for `mesh`.

    Arguments may live anywhere (host, one device, or already on the mesh):
    each is placed on its sharding first (a no-op when it is there).  The
    compiled function is built once per argument structure; the returned
    count says how often the update was traced (one per batch shape).
    `constrain_activations=False` leaves the layers' activations to the
    partitioner (`constrained_graph`; kept for the audit's tripwire).  A
    tensor axis that does not divide the model's heads is refused when the
    update is first traced (`sharding.check_tensor_split`, one line).
    """
    rules = train_rules() if rules is None else rules
    if constrain_activations:
        graph = constrained_graph(graph, mesh)
    learner_update, compiles = build_update(graph, method, config, row_groups=batch_shards(mesh))
    built: dict[Any, tuple] = {}

    def update(state, frozen, batch):  # the model's head counts are known once it is merged (at trace time)
        check_tensor_split(merge_model(graph, frozen, state.params["actor"]).config, mesh)
        return learner_update(state, frozen, batch)

    def shardings_and_fn(state, frozen, batch):
        key = jax.tree.structure((state, frozen, batch))
        if key not in built:
            state_shardings = tree_shardings(state, rules, mesh)
            frozen_shardings = tree_shardings(frozen, rules, mesh)
            in_shardings = (state_shardings, frozen_shardings, batch_shardings(batch, mesh))
            fn = jax.jit(update, in_shardings=in_shardings, out_shardings=(state_shardings, replicated(mesh)),
                         donate_argnums=(0,))
            built[key] = (in_shardings, fn)
        return built[key]

    def sharded_update(state, frozen, batch):
        in_shardings, fn = shardings_and_fn(state, frozen, batch)
        return fn(*jax.device_put((state, frozen, batch), in_shardings))

    def lower(state, frozen, batch):
        """`jax.jit(...).lower` on (abstract or concrete) arguments: for the
        HLO audit and `memory_analysis()`."""
        _, fn = shardings_and_fn(state, frozen, batch)
        return fn.lower(state, frozen, batch)

    sharded_update.lower = lower
    return sharded_update, compiles
