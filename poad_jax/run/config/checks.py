"""The one validation of a training config: each declared field's check (`CHECKS`, derived
from `settings.py`), then the checks between fields.  A bad value raises `ConfigError` with one
line naming the field; the trainer prints it and exits with status 2."""

from __future__ import annotations

import math
from typing import Any

import ml_collections

from poad_jax.core.group_advantages import GroupConfig  # NumPy only
from poad_jax.declare import Check, OneOf, declared_leaves, refusal
from poad_jax.run.config.errors import ConfigError
from poad_jax.run.config.fields import field_value
from poad_jax.run.config.settings import Run

# One check per declared field, by dotted name, in declaration order.
CHECKS: tuple[Check | OneOf, ...] = tuple(leaf.check for leaf in declared_leaves(Run))


def check_field(config: ml_collections.ConfigDict, check: Check | OneOf) -> None:
    """Raises ConfigError (one line naming the field) if `config` breaks `check`."""
    problem = refusal(check, field_value(config, check.field))
    if problem:
        raise ConfigError(problem)


def _check_preset(config: ml_collections.ConfigDict) -> None:
    """A preset's per-method settings are for the method it names (`<file>:<method>`)."""
    preset = config.preset
    if not preset:
        return
    path, _, method = preset.rpartition(":")
    if method and method != config.method:
        raise ConfigError(
            f"method is {config.method!r} but the preset {path} holds the settings of {method!r}: choose the method "
            f"with --config={path}:{config.method} (not --config.method)"
        )


def _check_sampler_logprobs(config: ml_collections.ConfigDict) -> None:
    """`behaviour_logprobs="sampler"` needs actions decoded token by token: a token-level method,
    restricted actions sampled through the trie.  (With top-k / top-p the sampler records the
    untruncated policy's log-probs, `SamplingConfig.logprobs_of`.)"""
    refusal = sampler_logprobs_refusal(config)
    if refusal:
        raise ConfigError(refusal)


def sampler_logprobs_refusal(config: ml_collections.ConfigDict) -> str | None:
    """Why `behaviour_logprobs="sampler"` cannot serve `config` (one line), or None when it can."""
    if config.method == "twosome":
        return ("behaviour_logprobs='sampler' needs a token-level method (poad, ntpo, grpo or gigpo): "
                "TWOSOME scores candidates and decodes nothing")
    if config.restricted_sampling != "trie":
        return ("behaviour_logprobs='sampler' needs restricted_sampling='trie': "
                "'action_scores' picks whole actions and decodes nothing")
    if config.ppo.behaviour_correction == "importance":
        return ("behaviour_logprobs='sampler' cannot serve ppo.behaviour_correction='importance', which "
                "needs behaviour_logprobs='recompute': the sampler's log-probs are the behaviour's, "
                "not the optimised policy's")
    return None


def _check_behaviour_policy(config: ml_collections.ConfigDict) -> None:
    """The behaviour-policy options: the importance correction is for token-level methods
    whose old log-probs are the learner's own; trie exploration needs the correction."""
    correction = config.ppo.behaviour_correction
    explore = config.trie_explore_temperature
    if correction == "importance":
        if config.method == "twosome":
            raise ConfigError("ppo.behaviour_correction='importance' is for poad or ntpo: TWOSOME samples "
                              "from the action distribution it optimises")
    if explore > 0:
        if config.restricted_sampling != "trie" or config.method == "twosome":
            raise ConfigError("trie_explore_temperature > 0 needs poad or ntpo with restricted_sampling='trie'")
        if correction != "importance":
            raise ConfigError("trie_explore_temperature > 0 needs ppo.behaviour_correction='importance': "
                              "the actions are then drawn from another distribution than the optimised one")


def _check_together(config: ml_collections.ConfigDict) -> None:
    """Checks between fields: the rollout's rows split evenly into minibatches and
    micro-batches (and loss chunks), and whole rollout threads onto each device of
    the rows' mesh axes."""
    rows = config.num_threads * config.rollout_length
    chunks = config.ppo.num_minibatches * config.ppo.accumulation_steps
    if rows % chunks:
        raise ConfigError(
            f"num_threads x rollout_length ({rows}) must be divisible by ppo.num_minibatches x "
            f"ppo.accumulation_steps ({config.ppo.num_minibatches} x {config.ppo.accumulation_steps})"
        )
    loss_chunks = config.ppo.loss_chunks
    if (rows // config.ppo.num_minibatches) % loss_chunks:
        raise ConfigError(
            f"a minibatch's rows ({rows // config.ppo.num_minibatches}) must be divisible by ppo.loss_chunks "
            f"({loss_chunks})"
        )
    if config.behaviour_logprobs == "sampler":
        _check_sampler_logprobs(config)
    if config.prefix_packing and config.method == "twosome":
        raise ConfigError("prefix_packing is for poad and ntpo: TWOSOME encodes each state's prompt once "
                          "already (share_prompt; and TWOSOME needs an environment that offers its actions, "
                          "which DataSciCoding does not)")
    _check_behaviour_policy(config)
    # a -1 axis is checked once the devices are known (`run.build.placement_of`)
    check_row_devices(config.num_threads, config.rollout_length, chunks, config.mesh.data, config.mesh.fsdp)


def check_row_devices(num_threads: int, rollout_length: int, chunks: int, data: int, fsdp: int) -> None:
    """Whole rollout threads onto each device of the rows' mesh axes (`data` x `fsdp`), and every
    device's rows split into the `chunks` (minibatches x micro-batches)."""
    row_devices, rows = data * fsdp, num_threads * rollout_length
    if row_devices > 1 and num_threads % row_devices:
        raise ConfigError(
            f"num_threads ({num_threads}) must be divisible by mesh.data x mesh.fsdp "
            f"({data} x {fsdp}): each device holds whole rollout threads"
        )
    if row_devices > 1 and rows % (chunks * row_devices):
        raise ConfigError(
            f"num_threads x rollout_length ({rows}) must be divisible by ppo.num_minibatches x "
            f"ppo.accumulation_steps x mesh.data x mesh.fsdp ({chunks} x {row_devices}): "
            f"every device's rows split into the minibatches"
        )


def _check_group(config: ml_collections.ConfigDict) -> None:
    """The group-relative methods: whole groups of threads, one process, the optimised token policy
    sampled; their KL penalty is theirs alone."""
    from poad_jax.agent.methods import GROUP_METHODS  # imported when a config is validated, as the method list

    if config.method not in GROUP_METHODS:
        if config.ppo.ref_kl_coef > 0:
            raise ConfigError(f"ppo.ref_kl_coef > 0 is for grpo and gigpo, not {config.method}")
        return
    size = GroupConfig(**config.group).group_size(config.num_threads)  # checked above: its declared checks pass
    if config.num_threads % size:
        raise ConfigError(f"num_threads ({config.num_threads}) must be divisible by group.size ({size}): "
                          f"{config.method}'s groups are whole groups of threads (0: all threads, one group)")
    if config.restricted_sampling != "trie":
        raise ConfigError(f"{config.method} samples the token policy it optimises: restricted_sampling must be "
                          "'trie', not 'action_scores'")
    if config.ppo.behaviour_correction != "none" or config.trie_explore_temperature > 0:
        raise ConfigError(f"{config.method} samples the token policy it optimises: it needs no "
                          "ppo.behaviour_correction and no trie_explore_temperature")
    if config.distributed.num_processes > 1:
        raise ConfigError(f"{config.method} runs in one process (its groups are counted on one host)")


def _check_processes(config: ml_collections.ConfigDict) -> None:
    """A coordinator address names the run's processes: this one's id is below their count,
    and without one (and without "auto") the run is one process."""
    block = config.distributed
    if block.coordinator not in ("", "auto") and block.process_id >= block.num_processes:
        raise ConfigError(f"distributed.process_id ({block.process_id}) must be below distributed.num_processes "
                          f"({block.num_processes}): processes are numbered from 0")
    if block.coordinator == "" and block.num_processes > 1:
        raise ConfigError(f"distributed.num_processes is {block.num_processes} but distributed.coordinator is "
                          "empty: set it to process 0's host:port (or 'auto' on SLURM / Open MPI)")
    if block.coordinator not in ("", "auto") and block.num_processes > 1 and \
            config.num_threads % block.num_processes:
        raise ConfigError(f"num_threads ({config.num_threads}) must be divisible by distributed.num_processes "
                          f"({block.num_processes}): each process steps an equal share of the rollout threads")


def config_warnings(config: ml_collections.ConfigDict) -> list[str]:
    """Settings that are valid but make the run learn nothing, one line each (the trainer prints them).

    TWOSOME with `ppo.advantage_normalization='adrl'` normalises the advantages within
    each of a minibatch's `ppo.loss_chunks` row chunks: with k = rows / (num_minibatches x
    loss_chunks) rows per chunk, A_i <- (A_i - mean_chunk) / (std_chunk + eps), and k = 1
    gives A_i - mean_chunk = 0 for every row: the policy loss and its gradient are exactly 0
    (the authors' torch.std of one element would give NaN).  The authors' VirtualHome
    preset has k = 4 at 4 threads x 32 steps; `rollout_length=8` makes it 1.
    """
    warnings = []
    rows_per_chunk = (config.num_threads * config.rollout_length // config.ppo.num_minibatches
                      // max(config.ppo.loss_chunks, 1))
    if config.method == "twosome" and config.ppo.advantage_normalization == "adrl" and rows_per_chunk < 2:
        warnings.append(
            f"warning: every TWOSOME advantage will be 0 and the policy will not learn: "
            f"ppo.advantage_normalization='adrl' normalises each loss chunk's advantages on their own, and "
            f"num_threads x rollout_length / (ppo.num_minibatches x ppo.loss_chunks) = "
            f"{config.num_threads} x {config.rollout_length} / ({config.ppo.num_minibatches} x "
            f"{config.ppo.loss_chunks}) leaves {rows_per_chunk} row per chunk; use fewer ppo.loss_chunks, "
            f"more rows per update, or ppo.advantage_normalization='valid'")
    return warnings


def _check_training_sampling(config: ml_collections.ConfigDict) -> None:
    """Training samples its actions: the sampler's temperature 0 (greedy, allowed to the sampler) is refused."""
    if not config.sampling.temperature > 0:
        raise ConfigError(f"sampling.temperature must be > 0, got {config.sampling.temperature} "
                          "(training samples its actions; 0 would be greedy)")


def validate(config: ml_collections.ConfigDict) -> None:
    """The one validation of a training config: every declared field's check (`CHECKS`), then the
    checks between fields.  Raises ConfigError with one line naming the field."""
    for check in CHECKS:
        check_field(config, check)
    _check_preset(config)
    _check_training_sampling(config)
    _check_together(config)
    _check_group(config)
    _check_processes(config)
