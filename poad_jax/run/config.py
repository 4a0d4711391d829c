"""The training configuration: its defaults, its validation, and its conversion.

One source for each:

- `default_config()`: every setting and its default (the paper's values,
  the paper's tables, docs/adrl_parity.md).  The task files `configs/<task>.py` start from it and set
  what differs; `--config.x=y` overrides any field on the command line.
- `validate(config)`: every range and choice check (`CHECKS`, one row per
  field, plus the checks between fields in `_check_together`).  A bad value
  raises `ConfigError` with one line naming the field; the trainer prints it
  and exits with status 2.
- `RESUMABLE_FIELDS`: the fields a run directory's re-run may change (and
  what a change affects), for the trainer and the study runner alike.
- `field_parent` / `field_value`: the one walker of dotted names
  ("ppo.actor_lr"), with the closest name when one is unknown.
- `learner_config`, `rollout_config`: the dataclasses the library runs on
  (`learner.LearnerConfig`, `rollout.RolloutConfig`), built from the
  ConfigDict at the command-line boundary (`poad_jax.run.build` builds
  everything else a run needs from it).  Their fields without a default
  come from the config by name (`ppo.<name>` for the learner, a top-level
  field for rollouts; `_SOURCES` lists the few exceptions), so they hold no
  competing defaults.

Adding a PPO setting touches one place for its default (`default_config`,
under `ppo`) and one for its check (a row of `CHECKS`), plus a field of the
same name in `LearnerConfig` where the learner uses it; `learner_config`
copies it by name.

This module imports no JAX at import time (the config files import it); the
converters and the choice lists that live in JAX modules are imported when
used.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import math
import pathlib
import typing
from typing import Any, Callable

import ml_collections

from poad_jax.core import layout  # NumPy only

# The dtypes a config may name (`poad_jax.run.build.jax_dtype` turns a name into JAX's):
DTYPES = ("float32", "bfloat16", "float16")  # model parameters and activations
MATMUL_DTYPES = ("float32", "bfloat16")  # float32: matmuls in `dtype` (exact)
# A config may also say "auto": bfloat16 where the machine multiplies it natively, else float32
# (`poad_jax.run.hardware`; a run records the resolved one).
MATMUL_DTYPE_CHOICES = (*MATMUL_DTYPES, "auto")

# Fields a re-run of a run directory may change: the checkpoints mean the same.  Each
# with what a change affects: "length" (how long the run trains), "outputs" (what
# it writes besides checkpoints), "checkpoints" (how often and how many), "label"
# (its name), "speed" (how the same numbers are computed), "layout" (devices and
# processes: the same numbers up to float rounding).  A dotted name covers its
# sub-tree ("mesh" covers "mesh.data").  The trainer refuses any other change
# in a directory with checkpoints; the study runner lets a cell's settings change
# in these fields, and reuses another study's finished cell that differs only in
# the fields whose change leaves the numbers as they are (`SAME_NUMBERS`).
RESUMABLE_FIELDS = {
    "total_env_steps": "length",
    "tensorboard": "outputs",
    "plot": "outputs",
    "checkpoint_every": "checkpoints",
    "keep_checkpoints": "checkpoints",
    "name": "label",
    "env.vector_mode": "speed",
    "remat": "speed",
    "share_prompt": "speed",
    "prompt_bucket_step": "speed",
    "mesh": "layout",
    "distributed": "layout",
}
SAME_NUMBERS = ("length", "outputs")  # a change of these kinds leaves every logged number as it was


def resumable_kind(dotted: str) -> str | None:
    """What a change of field `dotted` affects (`RESUMABLE_FIELDS`), or None if a re-run may not change it."""
    for name, kind in RESUMABLE_FIELDS.items():
        if dotted == name or dotted.startswith(name + "."):
            return kind
    return None


class ConfigError(Exception):
    """A user mistake in the run's configuration or inputs, told in one line.

    The trainer prints it as `error: <line>` and exits with status 2
    (`train.TrainError` is this class)."""


def default_config() -> ml_collections.ConfigDict:
    """Every training setting with its default.

    PPO: the paper's hyper-parameters (the paper's tables, docs/adrl_parity.md; clip 0.2, value clip
    0.2, value coefficient 0.5, max grad norm 0.5, KL threshold 0.02, λ 0.95,
    Adam ε 1e-5, LoRA r 8 α 16 on q and v).  γ, learning rates, threads x
    steps and env steps are the paper's VirtualHome row (γ 0.95, actor lr
    1e-6, critic lr 5e-5, 4 x 32, 6k env steps), which DataSciCoding shares
    except for its 8 steps; Overcooked's γ 0.99 and rates 5e-7 / 1e-5 are set
    in configs/overcooked.py.
    """
    config = ml_collections.ConfigDict()
    config.name = "default"
    config.method = "poad"  # poad | ntpo | twosome
    # A config file that holds per-method settings records the method they are for
    # ("<file>:<method>", e.g. configs/virtualhome_paper.py:twosome); validation refuses
    # a --config.method that differs from it.  "": none.
    config.preset = ""
    config.gamma_w = -1.0  # NTPO's intra-action discount; < 0 means gamma (NTPO) / 1 (POAD, TWOSOME)
    # TWOSOME: encode each state's prompt once and score every candidate action
    # as a continuation of it (exact).  False: every candidate runs the whole
    # prompt again (the per-candidate computation, kept for checks and benchmarks).
    config.share_prompt = True
    config.seed = 0
    # Model: a name (smollm2-135m-instruct, qwen2.5-coder-0.5b-instruct, tiny-random),
    # a Hugging Face directory, or a .gguf file.
    config.model = "smollm2-135m-instruct"
    config.dtype = "float32"  # float32 on CPU; bfloat16 on GPU
    # Matmul operands: "float32" (matmuls in `dtype`, exact) or "bfloat16"
    # (bfloat16 base weights and operands, float32 accumulation: 1.7x the
    # learner's and 1.3x the sampler's speed on CPUs with AMX/AVX-512-BF16, slower
    # than float32 on CPUs without), or "auto": bfloat16 where the machine multiplies
    # it natively, else float32 (`poad_jax/run/hardware.py`; the run prints and records which).
    config.matmul_dtype = "float32"
    config.remat = "full"  # full | dots | none: what the layer scan keeps for backward
    # PPO's old log-probs (token-level methods): "recompute" them in the behaviour pass with the
    # learner's own forward (the first ratio is exactly 1), or take the "sampler"'s, recorded as it
    # decoded (one forward fewer; the first ratio is 1 up to the KV-cache decode's rounding:
    # max |ratio - 1| 5.7e-6 with float32 matmuls, 0.055 with bfloat16, `bench logprob_gap`).
    # "auto": the sampler's where the matmuls are float32 and the method decodes its own tokens
    # (the first ratio is then 1 to float32 rounding), else "recompute" (`poad_jax/run/hardware.py`).
    config.behaviour_logprobs = "recompute"
    config.lora = ml_collections.ConfigDict(dict(rank=8, alpha=16.0, targets=("q_proj", "v_proj")))

    config.env = ml_collections.ConfigDict()
    config.env.name = "toy/decisive_token"
    config.env.kwargs = ml_collections.ConfigDict()
    config.env.vector_mode = "inline"  # inline | threads | processes

    config.num_threads = 4
    config.rollout_length = 32
    config.total_env_steps = 6_000

    config.prompt_format = "raw"  # chat (the tokenizer's chat template) | raw
    config.system_prompt = ""
    config.max_prompt_tokens = 1024
    # Prompts pad to the next multiple of this many tokens up to 256, then to a coarse
    # ladder (poad_jax/core/layout.py); 0: the powers of two 32, 64, 128, 256 (before issue 31).
    config.prompt_bucket_step = layout.PROMPT_BUCKET_STEP
    config.restricted_sampling = "trie"  # trie | action_scores (the paper code's way)
    # Trie sampling with exploration: > 0 draws restricted actions from the trie's offered
    # continuations at this temperature while the optimised policy stays at
    # sampling.temperature; the learner then corrects for it (needs
    # ppo.behaviour_correction="importance").  0: off (draw from the optimised policy).
    config.trie_explore_temperature = 0.0
    config.twosome_normalization = "token"  # token | word
    # The `discounted_return` metric: sum_k gamma^k r_k over an episode's env steps
    # (the paper's Appendix H reports it at 0.95), logged beside the success rate.
    config.discounted_return_gamma = 0.95

    config.sampling = ml_collections.ConfigDict(
        dict(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=128)
    )

    config.ppo = ml_collections.ConfigDict(
        dict(
            gamma=0.95,
            lam=0.95,
            clip_eps=0.2,
            value_clip_eps=0.2,
            vf_coef=0.5,
            ent_coef=0.01,
            max_grad_norm=0.5,
            target_kl=0.02,  # a minibatch whose approximate KL exceeds it is skipped
            epochs=1,
            num_minibatches=4,
            accumulation_steps=1,  # micro-batches per minibatch (bounds activation memory)
            actor_lr=1e-6,
            critic_lr=5e-5,
            adam_eps=1e-5,
            normalize_advantages=True,
            # What a minibatch over the KL threshold skips: "update" (actor and critic,
            # ours) or "actor" (the authors' code: the critic has already stepped).
            kl_skip="update",
            # "valid": mean/std over the minibatch's valid elements (ours); "adrl": the
            # authors' code (token level: the non-zero advantages of the minibatch;
            # action level: each loss chunk's actions, unbiased std). docs/adrl_parity.md.
            advantage_normalization="valid",
            # The policy loss, entropy and approximate KL as the mean of this many equal
            # row chunks' token means (the authors' gradient_cp_steps); 1: one token mean.
            loss_chunks=1,
            # Token-level methods: "token" applies lam at every token (GAE over the token stream);
            # "action" applies lam where gamma applies (an action's last token) and 1 inside an
            # action, so POAD's first-token advantage is action-level GAE (docs/backups.md).
            lambda_scope="token",
            # The entropy bonus: "policy", of the distribution the log-probs are taken under (the
            # full vocabulary for actions drawn from action scores); "offered", over the offered
            # continuations (the trie's renormalised next-token distribution; TWOSOME's is over the
            # offered actions either way).
            entropy_scope="policy",
            # "none": PPO's ratio as usual; "importance": restricted actions optimise the trie policy
            # over the offered continuations and each token's clipped surrogate is weighted by
            # min(importance_weight_clip, pi_old / mu), mu the distribution the token was drawn from
            # (action scores, or the trie at trie_explore_temperature).  docs/results.md, study B.
            behaviour_correction="none",
            importance_weight_clip=1.0,
        )
    )
    # kind: "head" (an MLP on the frozen base's features) | "lora" (a second adapter);
    # target_update_every: hard-copy a target critic every K updates (0: off).
    # bias / init: the head's layers with biases and a zero output layer (ours: V = 0 at
    # the start), or init="torch" with bias=False (the authors' head: PyTorch's default
    # random init, no biases; docs/adrl_parity.md).
    config.critic = ml_collections.ConfigDict(
        dict(kind="head", hidden_sizes=(1024, 512), target_update_every=0, bias=True, init="zero_output")
    )

    # Devices (docs/distributed.md): data (replicas; batch rows split), fsdp (the
    # frozen base and the rows split), tensor (heads, MLP columns, vocabulary
    # split); one axis may be -1 (the devices the others leave).  All 1: one
    # device, no sharding call anywhere.
    config.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=1, tensor=1))
    # Several processes (one per host; README "Several hosts"): coordinator ""
    # (one process), "host:port" (process 0's address, with this process's
    # num_processes and process_id), or "auto" (JAX detects SLURM, Open MPI,
    # Kubernetes, Cloud TPU, or reads JAX_COORDINATOR_ADDRESS).
    config.distributed = ml_collections.ConfigDict(dict(coordinator="", num_processes=1, process_id=0))

    config.checkpoint_every = 1  # updates between checkpoints
    config.keep_checkpoints = 2
    config.tensorboard = True
    config.plot = True
    return config


def set_authors_semantics(config: ml_collections.ConfigDict, preset: str, method: str | None,
                          method_settings: dict[str, dict[str, Any]]) -> ml_collections.ConfigDict:
    """`config` with the POAD authors' learner semantics (docs/adrl_parity.md) and
    `method`'s PPO settings from a preset's table `method_settings` (one place per
    preset; the preset file cites their sources).

    Sets: the method and `preset` ("<file>:<method>", checked by `validate`);
    actions sampled from the word-normalised action scores; the value head
    without biases in PyTorch's default init; a KL skip of the actor's step only;
    the authors' advantage normalisation; then `ppo.<field>` for each of the
    method's settings.
    """
    if method is None:  # `--config=<preset>` without `:<method>`: never a silent default
        raise ConfigError(f"{preset} holds one preset per method: name it, --config={preset}:<method> with "
                          f"<method> one of {', '.join(method_settings)}")
    if method not in method_settings:
        raise ValueError(f"unknown method {method!r} for {preset}; choose one of {', '.join(method_settings)}")
    config.preset = f"{preset}:{method}"
    config.method = method
    config.restricted_sampling = "action_scores"
    config.twosome_normalization = "word"
    config.ppo.kl_skip = "actor"
    config.ppo.advantage_normalization = "adrl"
    config.critic.bias = False
    config.critic.init = "torch"
    for field, value in method_settings[method].items():
        config.ppo[field] = value
    return config


def split_config_argument(spec: str | pathlib.Path) -> tuple[pathlib.Path, str | None]:
    """`("configs/x.py", "twosome")` for "configs/x.py:twosome" (ml_collections' config-file
    argument), `(path, None)` for a plain path."""
    text = str(spec)
    head, sep, tail = text.rpartition(":")
    if sep and head.endswith(".py") and "/" not in tail:
        return pathlib.Path(head), tail
    return pathlib.Path(text), None


def load_config_file(path: str | pathlib.Path) -> ml_collections.ConfigDict:
    """`get_config()` of a config file given by path (as `--config=` loads it);
    `get_config(argument)` for "path:argument"."""
    path, argument = split_config_argument(path)
    if not path.is_file():
        raise ConfigError(f"no config file at {path}")
    spec = importlib.util.spec_from_file_location(f"poad_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config() if argument is None else module.get_config(argument)


# ---------------------------------------------------------------------------
# Validation: one row per checked field.


@dataclasses.dataclass(frozen=True)
class Check:
    """One field's rule: `ok(value)` must hold; else `<field> must be <must>, got <value> (<why>)`."""

    field: str
    ok: Callable[[Any], bool]
    must: str
    why: str = ""


def at_least(field: str, low: float, why: str = "") -> Check:
    return Check(field, lambda v: v >= low, f">= {low}", why)


def above(field: str, low: float, why: str = "") -> Check:
    return Check(field, lambda v: v > low, f"> {low}", why)


def within(field: str, low: float, high: float, open_low: bool = False, why: str = "") -> Check:
    """low <= v <= high, or low < v <= high with `open_low`."""
    if open_low:
        return Check(field, lambda v: low < v <= high, f"in ({low}, {high}]", why)
    return Check(field, lambda v: low <= v <= high, f"in [{low}, {high}]", why)


@dataclasses.dataclass(frozen=True)
class OneOf:
    """The field's value is one of `choices()` (a function: some lists live in JAX modules,
    imported only when a config is validated).  `noun` words the error as
    `unknown <noun> <value>; choose one of ...`; `many`: the value is a
    non-empty sequence of choices."""

    field: str
    choices: Callable[[], tuple[str, ...]]
    noun: str = ""
    many: bool = False


def _methods() -> tuple[str, ...]:
    from poad_jax.agent.methods import METHODS

    return tuple(METHODS)


def _remat_policies() -> tuple[str, ...]:
    from poad_jax.models.config import REMAT_POLICIES

    return tuple(REMAT_POLICIES)


def _lora_targets() -> tuple[str, ...]:
    from poad_jax.models.config import LORA_TARGETS

    return tuple(LORA_TARGETS)


def _environments() -> tuple[str, ...]:
    import envs_py

    return tuple(envs_py.registry())


def _is_address(value: str) -> bool:
    """host:port with a port number (the host may be a name, IPv4 or [IPv6])."""
    host, _, port = value.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


CHECKS: tuple[Check | OneOf, ...] = (
    OneOf("method", _methods, noun="method"),
    OneOf("env.name", _environments, noun="environment"),
    OneOf("dtype", lambda: DTYPES),
    OneOf("matmul_dtype", lambda: MATMUL_DTYPE_CHOICES),
    OneOf("remat", _remat_policies),
    OneOf("behaviour_logprobs", lambda: ("recompute", "sampler", "auto")),
    OneOf("prompt_format", lambda: ("chat", "raw")),
    OneOf("restricted_sampling", lambda: ("trie", "action_scores")),
    OneOf("twosome_normalization", lambda: ("token", "word")),
    OneOf("critic.kind", lambda: ("head", "lora")),
    OneOf("critic.init", lambda: ("zero_output", "torch")),
    Check("critic.bias", lambda v: isinstance(v, bool), "True or False"),
    OneOf("ppo.kl_skip", lambda: ("update", "actor")),
    OneOf("ppo.advantage_normalization", lambda: ("valid", "adrl")),
    at_least("ppo.loss_chunks", 1, "1: one token mean over the minibatch"),
    OneOf("ppo.lambda_scope", lambda: ("token", "action")),
    OneOf("ppo.entropy_scope", lambda: ("policy", "offered")),
    OneOf("ppo.behaviour_correction", lambda: ("none", "importance")),
    above("ppo.importance_weight_clip", 0, "the largest weight a token's surrogate gets"),
    at_least("trie_explore_temperature", 0, "0 turns exploration off"),
    OneOf("env.vector_mode", lambda: ("inline", "threads", "processes")),
    Check("share_prompt", lambda v: isinstance(v, bool), "True or False"),
    Check("gamma_w", lambda v: v < 0 or 0 < v <= 1, "in (0, 1], or negative for the method's default"),
    at_least("num_threads", 1),
    at_least("rollout_length", 1),
    at_least("total_env_steps", 1),
    at_least("max_prompt_tokens", 1),
    Check("prompt_bucket_step", layout.is_prompt_bucket_step, f"0 or a divisor of {layout.FINE_PROMPT_LIMIT}",
          "prompts pad to a multiple of it; 0: powers of two"),
    within("discounted_return_gamma", 0, 1, open_low=True),
    above("sampling.temperature", 0, "training samples its actions; 0 would be greedy"),
    at_least("sampling.top_k", 0, "0 turns top-k off"),
    within("sampling.top_p", 0, 1, open_low=True, why="1 turns top-p off"),
    at_least("sampling.max_new_tokens", 1, "an action needs at least one token"),
    at_least("lora.rank", 1, "the adapter is what training changes"),
    above("lora.alpha", 0),
    OneOf("lora.targets", _lora_targets, many=True),
    within("ppo.gamma", 0, 1, open_low=True),
    within("ppo.lam", 0, 1),
    above("ppo.clip_eps", 0, "PPO's ratio clip; 0 would stop all learning"),
    above("ppo.value_clip_eps", 0),
    at_least("ppo.vf_coef", 0),
    at_least("ppo.ent_coef", 0, "a negative coefficient would reward collapsing the policy"),
    above("ppo.max_grad_norm", 0),
    above("ppo.target_kl", 0),
    at_least("ppo.epochs", 1, "0 epochs would train nothing"),
    at_least("ppo.num_minibatches", 1),
    at_least("ppo.accumulation_steps", 1),
    at_least("ppo.actor_lr", 0, "a negative rate would ascend the loss"),
    at_least("ppo.critic_lr", 0, "a negative rate would ascend the loss"),
    above("ppo.adam_eps", 0),
    Check("critic.hidden_sizes", lambda v: all(int(h) >= 1 for h in v), "positive layer widths"),
    at_least("critic.target_update_every", 0, "0 turns the target critic off"),
    *(Check(f"mesh.{axis}", lambda v: isinstance(v, int) and (v >= 1 or v == -1), "a positive integer or -1",
            "-1: the devices the other axes leave") for axis in ("data", "fsdp", "tensor")),
    Check("distributed.coordinator", lambda v: isinstance(v, str) and (v in ("", "auto") or _is_address(v)),
          "'', 'auto' or host:port", "process 0's address; '' runs one process"),
    Check("distributed.num_processes", lambda v: isinstance(v, int) and v >= 1, "a positive integer"),
    Check("distributed.process_id", lambda v: isinstance(v, int) and v >= 0, "a non-negative integer",
          "0 for the process at the coordinator's address"),
    at_least("checkpoint_every", 1, "updates between checkpoints"),
    at_least("keep_checkpoints", 1, "a run without a checkpoint can be neither resumed nor exported"),
)


class UnknownFieldError(ConfigError):
    """A dotted name that names no field: `missing` is the first part not found under
    `parent` ("" for the top level); `suggestion` the closest existing dotted name, or None."""

    def __init__(self, dotted: str, parent: str, missing: str, suggestion: str | None):
        hint = f"; did you mean {suggestion}?" if suggestion else ""
        super().__init__(f"unknown config field {dotted}{hint}")
        self.dotted, self.parent, self.missing, self.suggestion = dotted, parent, missing, suggestion


def field_parent(config: Any, dotted: str) -> tuple[Any, str]:
    """(the node holding field `dotted`, its last part): `(config.a, "b")` for "a.b".
    UnknownFieldError (with the closest name) if a part names nothing."""
    parts = dotted.split(".")
    node: Any = config
    for depth, part in enumerate(parts):
        keys = list(node.keys()) if isinstance(node, (ml_collections.ConfigDict, dict)) else []
        if part not in keys:
            parent = ".".join(parts[:depth])
            close = difflib.get_close_matches(part, keys, n=1)
            suggestion = ".".join(parts[:depth] + close) if close else None
            raise UnknownFieldError(dotted, parent, part, suggestion)
        if depth < len(parts) - 1:
            node = node[part]
    return node, parts[-1]


def field_value(config: ml_collections.ConfigDict, dotted: str) -> Any:
    """`config.a.b` for "a.b"; ConfigError if the config has no such field."""
    try:
        node, last = field_parent(config, dotted)
    except UnknownFieldError:
        raise ConfigError(f"the config has no field {dotted} (start config files from "
                          "poad_jax.run.config.default_config())") from None
    return node[last]


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def check_field(config: ml_collections.ConfigDict, check: Check | OneOf) -> None:
    """Raises ConfigError (one line naming the field) if `config` breaks `check`."""
    value = field_value(config, check.field)
    if isinstance(check, OneOf):
        choices = check.choices()
        listed = ", ".join(str(c) for c in choices)
        if check.many:
            if len(value) and all(v in choices for v in value):
                return
            raise ConfigError(f"{check.field} must be one or more of {listed}, got {tuple(value)}")
        if value in choices:
            return
        if check.noun:
            raise ConfigError(f"unknown {check.noun} {value!r} ({check.field}); choose one of {listed}")
        raise ConfigError(f"{check.field} must be one of {listed}, got {_shown(value)}")
    try:
        ok = bool(check.ok(value))
    except (TypeError, ValueError):  # e.g. a string where a number belongs
        ok = False
    if isinstance(value, float) and math.isnan(value):
        ok = False
    if not ok:
        why = f" ({check.why})" if check.why else ""
        raise ConfigError(f"{check.field} must be {check.must}, got {_shown(value)}{why}")


def _check_preset(config: ml_collections.ConfigDict) -> None:
    """A preset's per-method settings are for the method it names (`<file>:<method>`)."""
    preset = str(value_or_default(config, "preset", default_config()))
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
        return ("behaviour_logprobs='sampler' needs a token-level method (poad or ntpo): "
                "TWOSOME scores candidates and decodes nothing")
    if config.restricted_sampling != "trie":
        return ("behaviour_logprobs='sampler' needs restricted_sampling='trie': "
                "'action_scores' picks whole actions and decodes nothing")
    if value_or_default(config, "ppo.behaviour_correction", default_config()) == "importance":
        return ("behaviour_logprobs='sampler' cannot serve ppo.behaviour_correction='importance', which "
                "needs behaviour_logprobs='recompute': the sampler's log-probs are the behaviour's, "
                "not the optimised policy's")
    return None


def _check_behaviour_policy(config: ml_collections.ConfigDict) -> None:
    """The behaviour-policy options: the importance correction is for token-level methods
    whose old log-probs are the learner's own; trie exploration needs the correction."""
    defaults = default_config()
    correction = value_or_default(config, "ppo.behaviour_correction", defaults)
    explore = float(value_or_default(config, "trie_explore_temperature", defaults))
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
    loss_chunks = int(value_or_default(config, "ppo.loss_chunks", default_config()))
    if (rows // config.ppo.num_minibatches) % loss_chunks:
        raise ConfigError(
            f"a minibatch's rows ({rows // config.ppo.num_minibatches}) must be divisible by ppo.loss_chunks "
            f"({loss_chunks})"
        )
    if value_or_default(config, "behaviour_logprobs", default_config()) == "sampler":
        _check_sampler_logprobs(config)
    _check_behaviour_policy(config)
    row_devices = config.mesh.data * config.mesh.fsdp  # a -1 axis is checked once the devices are known
    if row_devices > 1 and config.num_threads % row_devices:
        raise ConfigError(
            f"num_threads ({config.num_threads}) must be divisible by mesh.data x mesh.fsdp "
            f"({config.mesh.data} x {config.mesh.fsdp}): each device holds whole rollout threads"
        )
    if row_devices > 1 and rows % (chunks * row_devices):
        raise ConfigError(
            f"num_threads x rollout_length ({rows}) must be divisible by ppo.num_minibatches x "
            f"ppo.accumulation_steps x mesh.data x mesh.fsdp ({chunks} x {row_devices}): "
            f"every device's rows split into the minibatches"
        )


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


def validate(config: ml_collections.ConfigDict) -> None:
    """The one validation of a training config: every row of `CHECKS`, then the
    checks between fields.  Raises ConfigError with one line naming the field."""
    for check in CHECKS:
        check_field(config, check)
    _check_preset(config)
    _check_together(config)
    _check_processes(config)


# ---------------------------------------------------------------------------
# Conversion to the library's dataclasses (at the command-line boundary).

# Learner fields read from somewhere other than `ppo.<name>`.
_SOURCES = {"temperature": "sampling.temperature", "critic_kind": "critic.kind"}


def value_or_default(config: ml_collections.ConfigDict, dotted: str, defaults: ml_collections.ConfigDict) -> Any:
    """The config's value; the default for a field absent from it (a run directory's
    `config.json` written before the field existed)."""
    try:
        return field_value(config, dotted)
    except ConfigError:
        return field_value(defaults, dotted)


def _cast(kind: Any, value: Any) -> Any:
    """A config value as the dataclass field's type (JSON-stored configs hold lists for tuples)."""
    if kind in (int, float, bool, str):
        return kind(value)
    return value


def _from_config(cls: type, config: ml_collections.ConfigDict, source: Callable[[str], str],
                 fields: dict[str, Any]) -> Any:
    """`cls` with each field that has no default read from `config` at `source(name)`, and `fields` replacing any."""
    defaults = default_config()
    hints = typing.get_type_hints(cls)
    values = {}
    for field in dataclasses.fields(cls):
        required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        if required and field.name not in fields:
            values[field.name] = _cast(hints[field.name], value_or_default(config, source(field.name), defaults))
    return cls(**values, **fields)


def learner_config(config: ml_collections.ConfigDict | None = None, **fields: Any):
    """`learner.LearnerConfig` from `config` (default: `default_config()`).

    Each field is `config.ppo.<name>`, except `temperature`
    (`sampling.temperature`) and `critic_kind` (`critic.kind`); `fields`
    replace any (tests and benchmarks: `learner_config(gamma=0.9)`).
    """
    from poad_jax.agent.learner import LearnerConfig

    config = default_config() if config is None else config
    return _from_config(LearnerConfig, config, lambda name: _SOURCES.get(name, f"ppo.{name}"), fields)


def sampling_config(config: ml_collections.ConfigDict | None = None, eos_ids: tuple[int, ...] = ()):
    """`sampling.SamplingConfig` from `config.sampling` (each field by name), stopping at `eos_ids`;
    it records the policy's log-probs where they become PPO's old ones (`behaviour_logprobs="sampler"`)."""
    from poad_jax.sampling import SamplingConfig

    config = default_config() if config is None else config
    sampling = dict(value_or_default(config, "sampling", default_config()).items())
    hints = typing.get_type_hints(SamplingConfig)
    from_sampler = value_or_default(config, "behaviour_logprobs", default_config()) == "sampler"
    return SamplingConfig(**{k: _cast(hints[k], v) for k, v in sampling.items()},
                          stop_token_ids=tuple(int(i) for i in eos_ids),
                          logprobs_of="policy" if from_sampler else "sampled")


def rollout_config(config: ml_collections.ConfigDict | None = None, eos_ids: tuple[int, ...] = (), **fields: Any):
    """`rollout.RolloutConfig` from `config` (default: `default_config()`).

    Each field without a default is the top-level config field of its name;
    `sampling` is `sampling_config(config, eos_ids)`, `pack_behaviour` whether
    `ppo.behaviour_correction` is on, and `prompt_buckets`
    `layout.prompt_buckets(config.prompt_bucket_step)`; `fields` replace any.
    """
    from poad_jax.agent.rollout import RolloutConfig

    config = default_config() if config is None else config
    if "sampling" not in fields:
        fields["sampling"] = sampling_config(config, eos_ids)
    if "pack_behaviour" not in fields:
        fields["pack_behaviour"] = value_or_default(config, "ppo.behaviour_correction", default_config()) != "none"
    if "prompt_buckets" not in fields:
        step = value_or_default(config, "prompt_bucket_step", default_config())
        fields["prompt_buckets"] = layout.prompt_buckets(int(step))
    return _from_config(RolloutConfig, config, lambda name: name, fields)
