"""The training config's tree: the layers' declarations composed, and the run's own settings.

Each setting is declared once, beside the code that reads it, in the object
that code runs on (`poad_jax/declare.py` says how): `config.ppo` is
`agent.learner_config.LearnerConfig`, `config.sampling`
`sampling.config.SamplingConfig`, `config.group`
`core.group_advantages.GroupConfig`, `config.critic` `core.critic_config.CriticConfig`, `config.lora`
`models.config.LoraConfig`, and the top-level fields of the rollouts,
`agent.rollout_config.RolloutConfig`, and of the credit schemes (`gamma_w`,
`share_prompt`), `agent.method_config.MethodConfig` (both spliced in with `inline`).  The settings
only the run reads are declared here (`Run`'s own fields and the sections
`Env`, `Mesh`, `Distributed`).  `default_config()`, the
checks `validate` runs and `typed(config)` are derived from this tree.  A mode
string is a `Literal[...]` type: its values are its check.

The defaults are the paper's (its tables, docs/adrl_parity.md): LoRA r 8 α 16
on q and v in `LoraConfig`, the PPO constants in `LearnerConfig`.  γ, learning rates, threads x
steps and env steps are the paper's VirtualHome row (γ 0.95, actor lr 1e-6,
critic lr 5e-5, 4 x 32, 6k env steps), which DataSciCoding shares except for
its 8 steps; Overcooked's γ 0.99 and rates 5e-7 / 1e-5 are set in
configs/overcooked.py.

This module imports no JAX (the config files import it); the choice lists
that live in JAX modules are imported when a config is validated.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Literal

import ml_collections

from poad_jax.agent.learner_config import LearnerConfig
from poad_jax.agent.method_config import MethodConfig
from poad_jax.agent.rollout_config import RolloutConfig
from poad_jax.core import layout  # NumPy only
from poad_jax.core.critic_config import CriticConfig
from poad_jax.core.group_advantages import GroupConfig
from poad_jax.declare import (INLINE, SECTION, Check, OneOf, above, at_least, default_of, inline, is_setting,
                              section, setting, within)
from poad_jax.models.config import LoraConfig
from poad_jax.sampling.config import SamplingConfig

# The dtypes a config may name (`poad_jax.run.build.jax_dtype` turns a name into JAX's).
Dtype = Literal["float32", "bfloat16", "float16"]  # model parameters and activations
# Matmul operands: float32 (matmuls in `dtype`, exact), bfloat16, or "auto": bfloat16 where the
# machine multiplies it natively, else float32 (`poad_jax.run.hardware`; a run records the resolved one).
MatmulDtype = Literal["float32", "bfloat16", "auto"]
DTYPES = typing.get_args(Dtype)
MATMUL_DTYPE_CHOICES = typing.get_args(MatmulDtype)
MATMUL_DTYPES = tuple(d for d in MATMUL_DTYPE_CHOICES if d != "auto")


def _methods() -> tuple[str, ...]:
    from poad_jax.agent.methods import METHODS

    return tuple(METHODS)


def _remat_policies() -> tuple[str, ...]:
    from poad_jax.models.config import REMAT_POLICIES

    return tuple(REMAT_POLICIES)


def _environments() -> tuple[str, ...]:
    import envs_py

    return tuple(envs_py.registry())


def _is_address(value: str) -> bool:
    """host:port with a port number (the host may be a name, IPv4 or [IPv6])."""
    host, _, port = value.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


@dataclasses.dataclass(frozen=True)
class Env:
    """The environment (`config.env`)."""

    name: str = setting("toy/decisive_token", "a registered environment (envs_py.registry())",
                        OneOf(_environments, noun="environment"))
    kwargs: dict = setting({}, "the environment's own keyword arguments")
    vector_mode: Literal["inline", "threads", "processes"] = setting(
        "inline", "how the rollout threads' environments step: in this process, threads or processes",
        resumable="speed")


_AXIS = Check(lambda v: isinstance(v, int) and (v >= 1 or v == -1), "a positive integer or -1",
              "-1: the devices the other axes leave")


@dataclasses.dataclass(frozen=True)
class Mesh:
    """The devices (`config.mesh`, docs/distributed.md); one axis may be -1 (the devices the others
    leave).  All 1: one device, no sharding call anywhere."""

    data: int = setting(1, "replicas: the batch rows split", _AXIS)
    fsdp: int = setting(1, "the frozen base and the rows split", _AXIS)
    tensor: int = setting(1, "heads, MLP columns and the vocabulary split", _AXIS)


@dataclasses.dataclass(frozen=True)
class Distributed:
    """Several processes, one per host (`config.distributed`; docs/distributed.md, "Several hosts")."""

    coordinator: str = setting(
        "", "process 0's host:port (with num_processes and process_id), 'auto' (JAX detects SLURM, Open MPI, "
        "Kubernetes, Cloud TPU or reads JAX_COORDINATOR_ADDRESS), or '' for one process",
        Check(lambda v: isinstance(v, str) and (v in ("", "auto") or _is_address(v)), "'', 'auto' or host:port",
              "process 0's address; '' runs one process"))
    num_processes: int = setting(1, "the run's processes",
                                 Check(lambda v: isinstance(v, int) and v >= 1, "a positive integer"))
    process_id: int = setting(0, "this process's number",
                              Check(lambda v: isinstance(v, int) and v >= 0, "a non-negative integer",
                                    "0 for the process at the coordinator's address"))


@dataclasses.dataclass(frozen=True)
class Run:
    """The whole training config: the top-level settings and the sections, in `config.json`'s order."""

    name: str = setting("default", "the run's label (the default run directory's name starts with it)",
                        resumable="label")
    method: str = setting("poad", "poad | ntpo | twosome | grpo | gigpo (`agent.methods.METHODS`)",
                          OneOf(_methods, noun="method"))
    preset: str = setting(
        "", "the method a config file's per-method settings are for (\"<file>:<method>\"; validation refuses "
        "a --config.method that differs); '' for none")
    scheme: MethodConfig = inline(MethodConfig, "the credit schemes' settings (agent/method_config.py)")
    prefix_packing: bool = setting(
        False, "poad/ntpo: the behaviour pass and the learner run the rows packed with their common prompt "
        "prefix once and no padding (the same numbers to float rounding, `core/shared_prefix.py`); one device",
        resumable="speed")
    seed: int = setting(0, "the seed every random stream of the run derives from")
    model: str = setting("smollm2-135m-instruct", "a model name (smollm2-135m-instruct, "
                         "qwen2.5-coder-0.5b-instruct, tiny-random), a Hugging Face directory or a .gguf file")
    dtype: Dtype = setting("float32", "the model's parameters and activations (float32 on CPU, bfloat16 on GPU)")
    matmul_dtype: MatmulDtype = setting(
        "float32", "matmul operands: float32 (exact), bfloat16 (float32 accumulation; faster only where the "
        "machine multiplies bfloat16 natively), or auto (bfloat16 where it does, `run/hardware.py`)")
    remat: str = setting("full", "what the layer scan keeps for backward: full | dots | none",
                         OneOf(_remat_policies), resumable="speed")
    lora: LoraConfig = section(LoraConfig, "the actor's adapters (models/config.py)")
    env: Env = section(Env, "the environment")
    rollout: RolloutConfig = inline(RolloutConfig, "how rollouts are collected (agent/rollout_config.py)")
    total_env_steps: int = setting(6_000, "env steps the run trains for", at_least(1), resumable="length")
    learn: bool = setting(
        True, "False: the run samples and steps its envs as training does but never updates, so every action "
        "is the initial policy's (a baseline to set a trained run beside; no behaviour pass, no learner)")
    prompt_bucket_step: int = setting(
        layout.PROMPT_BUCKET_STEP, "prompts pad to the next multiple of it up to 256, then to a coarse ladder "
        "(core/layout.py); 0: the powers of two 32 to 256",
        Check(layout.is_prompt_bucket_step, f"0 or a divisor of {layout.FINE_PROMPT_LIMIT}",
              "prompts pad to a multiple of it; 0: powers of two"), resumable="speed")
    sampling: SamplingConfig = section(SamplingConfig, "how actions are decoded (sampling/config.py)")
    ppo: LearnerConfig = section(LearnerConfig, "the learner's hyper-parameters (agent/learner_config.py)")
    group: GroupConfig = section(GroupConfig, "grpo and gigpo's groups (core/group_advantages.py)")
    critic: CriticConfig = section(CriticConfig, "the critic (core/critic_config.py)")
    mesh: Mesh = section(Mesh, "the devices", resumable="layout")
    distributed: Distributed = section(Distributed, "several processes", resumable="layout")
    checkpoint_every: int = setting(1, "updates between checkpoints", at_least(1, "updates between checkpoints"),
                                    resumable="checkpoints")
    keep_checkpoints: int = setting(
        2, "the newest checkpoints kept",
        at_least(1, "a run without a checkpoint can be neither resumed nor exported"), resumable="checkpoints")
    max_nonfinite_updates: int = setting(
        3, "the run stops after this many updates in a row with minibatch steps whose loss or gradient was not "
        "finite (each such step is skipped; the checkpoints stay finite)",
        at_least(1, "updates in a row with skipped non-finite steps before the run stops"), resumable="length")
    tensorboard: bool = setting(True, "write TensorBoard event files", resumable="outputs")
    plot: bool = setting(True, "plot the learning curves at the end", resumable="outputs")
    log_actions: bool = setting(
        False, "write every env step's action text, reward and env info to actions.jsonl (e.g. the programs)",
        resumable="outputs")


def as_config_dict(cls: type) -> ml_collections.ConfigDict:
    """The ConfigDict of `cls`'s declared defaults, in declaration order: sub-sections as sub-trees,
    an inline class's settings at this level; derived fields are not settings and are left out."""
    config = ml_collections.ConfigDict()
    for field in dataclasses.fields(cls):
        if SECTION in field.metadata:
            config[field.name] = as_config_dict(field.metadata[SECTION])
        elif INLINE in field.metadata:
            for key, value in as_config_dict(field.metadata[INLINE]).items():
                config[key] = value
        elif is_setting(field):
            value = default_of(field)
            config[field.name] = ml_collections.ConfigDict(value) if isinstance(value, dict) else value
    return config


def default_config() -> ml_collections.ConfigDict:
    """Every training setting with its default (the declarations above).  The task files
    `configs/<task>.py` start from it and set what differs; `--config.x=y` overrides any field."""
    return as_config_dict(Run)
