"""poad_jax on many devices: meshes, partition rules as data, the sampler's
layout and several processes (docs/distributed.md).  It knows no RL: the
sharded learner update that uses these rules is `poad_jax.agent.sharded_update`.

With the default config block `mesh` (data = fsdp = tensor = 1)
`mesh_from_config` returns None and no sharding call is made anywhere.
"""

from poad_jax.parallel.sharding import (  # noqa: F401
    BASE_SAMPLE_RULES,
    BASE_TRAIN_RULES,
    BATCH_AXES,
    LORA_FOLLOW_BASE_RULES,
    LORA_REPLICATED_RULES,
    MESH_AXES,
    abstract_like,
    batch_shardings,
    batch_shards,
    make_mesh,
    mesh_from_config,
    mesh_shape,
    partition_specs,
    replicated,
    sample_rules,
    shard_batch,
    shard_by_rules,
    spec_for,
    train_rules,
    tree_shardings,
)
from poad_jax.parallel.sampling_layout import (  # noqa: F401
    CARRY_RULES,
    UNSTACKED_SAMPLE_RULES,
    SamplingLayout,
    padded_rows,
)
