"""Per-device memory of the compiled PPO update on a mesh, from shapes alone.

Nothing is allocated: the model, the train state and the TokenBatch are
`jax.ShapeDtypeStruct`s (`nnx.eval_shape`, `jax.eval_shape`) carrying their
shardings, the sharded update is lowered and compiled for the mesh, and
XLA's `memory_analysis()` gives one device's buffer sizes:

    arguments  the device's shards of the state, the frozen base and the batch
    outputs    the new state (aliased to the donated one) and the metrics
    temp       activations, gradients, optimiser temporaries, gathered weights

XLA:CPU's buffer assignment differs from the GPU's, so on CPU the temp
figure is an estimate; argument bytes are exact on any backend (they are
the shard shapes).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from poad_jax.agent.learner import init_train_state
from poad_jax.agent.methods import make_method
from poad_jax.agent.sharded_update import jit_sharded_update
from poad_jax.core.critic_config import CriticConfig
from poad_jax.core.policy import ValueHead, split_policy
from poad_jax.core.token_batch import TokenLevelBatch
from poad_jax.models.llama import Llama, LlamaConfig, LoraConfig
from poad_jax.parallel.sharding import BATCH_AXES, abstract_like, batch_shardings, train_rules, tree_shardings
from poad_jax.run import build as run_build
from poad_jax.run.config import learner_config


def shard_bytes(tree) -> int:
    """Bytes one device holds of `tree` (ShapeDtypeStructs or arrays with
    shardings): the largest shard of each leaf (shards are equal unless a
    dimension does not divide)."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape) if getattr(leaf, "sharding", None) is not None else leaf.shape
        total += math.prod(shape) * leaf.dtype.itemsize
    return total


def abstract_policy(*, vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads,
                    dtype="bfloat16", lora_rank=8, lora_targets=("q_proj", "v_proj"), head_sizes=(1024, 512),
                    remat="full"):
    """(graph, frozen, params) of a LLaMA of these shapes, as ShapeDtypeStructs.

    `dtype="bfloat16"`: base matrices in bfloat16 with bfloat16 matmul
    operands (`matmul_dtype`), activations, LoRA and norms float32 (the
    project's GPU set-up); `"float32"`: everything float32.
    """
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                         num_hidden_layers=num_layers, num_attention_heads=num_heads,
                         num_key_value_heads=num_kv_heads, tie_word_embeddings=False)
    matmul_dtype = run_build.matmul_dtype(dtype)
    lora = LoraConfig(rank=lora_rank, alpha=2.0 * lora_rank, targets=tuple(lora_targets))

    def build():
        model = Llama(config, lora=lora, matmul_dtype=matmul_dtype, remat=remat, rngs=nnx.Rngs(0))
        return model, ValueHead(hidden_size, CriticConfig(hidden_sizes=tuple(head_sizes)), rngs=nnx.Rngs(1))

    model, head = nnx.eval_shape(build)
    return split_policy(model, head)


def abstract_token_batch(rows: int, threads: int, prompt_len: int, action_len: int, hidden_size: int):
    """A token-level TokenBatch of ShapeDtypeStructs (free-form actions)."""
    length = prompt_len + action_len
    sds = jax.ShapeDtypeStruct
    return TokenLevelBatch(
        tokens=sds((rows, length), jnp.int32), positions=sds((rows, length), jnp.int32),
        key_mask=sds((rows, length), jnp.bool_), action_mask=sds((rows, action_len), jnp.bool_),
        rewards=sds((rows,), jnp.float32), dones=sds((rows,), jnp.bool_),
        old_logprobs=sds((rows, action_len), jnp.float32), old_values=sds((rows, action_len), jnp.float32),
        features=sds((rows, action_len, hidden_size), jnp.float32), bootstrap_value=sds((threads,), jnp.float32),
        allowed_tokens=sds((rows, action_len, 1), jnp.int32), allowed_mask=sds((rows, action_len, 1), jnp.bool_),
    )


def update_memory(mesh: Mesh, *, hidden_size: int, intermediate_size: int, num_layers: int, vocab_size: int,
                  num_heads: int, num_kv_heads: int, rows: int, prompt_len: int, action_len: int,
                  threads: int | None = None, dtype: str = "bfloat16", lora_rank: int = 8,
                  lora_targets=("q_proj", "v_proj"), lora_sharding: str = "replicated",
                  head_sizes=(1024, 512), num_minibatches: int = 1, accumulation_steps: int = 1,
                  constrain_activations: bool = True) -> dict[str, Any]:
    """One device's memory of the PPO update compiled for `mesh` (bytes):
    XLA's `argument/output/alias/temp` sizes, and the shard bytes of the
    frozen base, the train state and the batch computed from the shardings
    (`expected_argument_bytes` is their sum).  `constrain_activations=False`
    compiles the update without the per-layer activation hook (for comparison)."""
    graph, frozen, params = abstract_policy(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size, num_layers=num_layers,
        num_heads=num_heads, num_kv_heads=num_kv_heads, dtype=dtype, lora_rank=lora_rank, lora_targets=lora_targets,
        head_sizes=head_sizes)
    config = learner_config(num_minibatches=num_minibatches, accumulation_steps=accumulation_steps)
    state = jax.eval_shape(lambda p: init_train_state(p, config, jax.random.key(0)), params)
    shards = math.prod(mesh.shape[a] for a in BATCH_AXES)
    threads = threads or shards
    batch = abstract_token_batch(rows, threads, prompt_len, action_len, hidden_size)
    rules = train_rules(lora_sharding)
    state = abstract_like(state, tree_shardings(state, rules, mesh))
    frozen = abstract_like(frozen, tree_shardings(frozen, rules, mesh))
    batch = abstract_like(batch, batch_shardings(batch, mesh))
    update, _ = jit_sharded_update(graph, make_method("poad", 0.95), config, mesh, rules,
                                       constrain_activations=constrain_activations)
    analysis = update.lower(state, frozen, batch).compile().memory_analysis()
    base, state_bytes, batch_bytes = shard_bytes(frozen), shard_bytes(state), shard_bytes(batch)
    return {
        "mesh": [int(mesh.shape[a]) for a in ("data", "fsdp", "tensor")],
        "argument_bytes": int(analysis.argument_size_in_bytes),
        "output_bytes": int(analysis.output_size_in_bytes),
        "alias_bytes": int(analysis.alias_size_in_bytes),
        "temp_bytes": int(analysis.temp_size_in_bytes),
        "base_bytes": base,
        "state_bytes": state_bytes,
        "batch_bytes": batch_bytes,
        "expected_argument_bytes": base + state_bytes + batch_bytes,
        "base_total_bytes": int(sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(frozen))),
    }
