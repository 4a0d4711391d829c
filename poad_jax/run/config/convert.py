"""The library's typed objects for one part of the config (`learner.LearnerConfig`,
`rollout.RolloutConfig`, `sampling.SamplingConfig`), each a part of `typed(config)`, with the
run's own values (the tokenizer's end tokens) and a caller's replacements; `stopping_at` gives a
typed `RolloutConfig` the tokenizer's end tokens (the run's, from its typed settings).  JAX modules are
imported when a converter is called."""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from poad_jax.run.config.settings import default_config
from poad_jax.run.config.boundary import typed


def _typed(config: ml_collections.ConfigDict | None):
    return typed(default_config() if config is None else config)


def learner_config(config: ml_collections.ConfigDict | None = None, **fields: Any):
    """`typed(config).ppo` (default: `default_config()`), `fields` replacing any (tests and
    benchmarks: `learner_config(gamma=0.9)`)."""
    return dataclasses.replace(_typed(config).ppo, **fields)


def sampling_config(config: ml_collections.ConfigDict | None = None, eos_ids: tuple[int, ...] = ()):
    """`typed(config).sampling`, stopping at `eos_ids`."""
    return dataclasses.replace(_typed(config).sampling, stop_token_ids=tuple(eos_ids))


def stopping_at(rollout, eos_ids: tuple[int, ...]):
    """The typed `rollout` (a `RolloutConfig`), its sampler stopping at `eos_ids` (the tokenizer's)."""
    return dataclasses.replace(rollout, sampling=dataclasses.replace(rollout.sampling, stop_token_ids=tuple(eos_ids)))


def rollout_config(config: ml_collections.ConfigDict | None = None, eos_ids: tuple[int, ...] = (), **fields: Any):
    """`typed(config).rollout`, its sampler stopping at `eos_ids`, `fields` replacing any."""
    rollout = stopping_at(_typed(config).rollout, eos_ids)
    return dataclasses.replace(rollout, **fields)


def group_size(config: ml_collections.ConfigDict) -> int:
    """The group-relative methods' trajectories per group (`typed(config).rollout.group_size`)."""
    return typed(config).rollout.group_size
