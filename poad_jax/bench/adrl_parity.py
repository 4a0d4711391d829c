"""`python -m poad_jax.bench adrl_parity --cases=FILE.npz`: our PPO update against the authors' trainer.

Each case of FILE (written by `scripts/reference/adrl_update_cases.py` from
ADRL's own agent, buffer and trainer; format: docs/adrl_parity.md) holds the
weights, the batch, the minibatch order and what ADRL's update produced.  This
replays the same update with poad_jax (float32, the authors' semantics:
`ppo.kl_skip="actor"`, `ppo.advantage_normalization="adrl"`,
`ppo.loss_chunks`, a head without biases) and prints, per compared field, the
largest error over the case's minibatches:

- advantages and returns of the backup (relative, over valid elements);
- per minibatch: the normalised advantages the policy loss received (files
  that record them), the policy objective (clipped surrogate - entropy bonus,
  as ADRL's `cal_policy_loss` returns it), value loss, entropy, approximate KL
  (relative above a floor), the KL skip decision (must be equal), and the
  actor's and critic's gradient norms before clipping;
- per minibatch, the gradient of every LoRA and head tensor before clipping:
  ||ours - theirs|| / ||theirs|| per tensor;
- the weight changes of the whole update (new - old), likewise.

Where a loss chunk's advantages nearly coincide, float32 statistics are only
known to within a rounding the harness measures from both sides' data
(`authors_rounding`); the actor-side tolerances are widened by it there, and
the line says so.  Exit status 1 when any field is above its tolerance
(`TOLERANCES`) or a case cannot be replayed (one line each; the rest of the
file is still checked), 2 for a file that is not a case file.  `--semantics=ours` replays with poad_jax's
defaults instead (kl_skip "update", advantages normalised over valid
elements, one loss chunk): the differences it prints are what the authors'
semantics change.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
from typing import Any

import numpy as np

from poad_jax.run.config.errors import ArgumentParser

# Largest accepted error per field kind (relative; see `relative_error` and `scalar_error`).
TOLERANCES = {"scalar": 1e-4, "grad": 1e-4, "delta": 1e-3, "backup": 1e-5, "skip": 0.0}
# A per-minibatch scalar below its floor in magnitude is compared absolutely (relative above it).
SCALAR_FLOORS = {"policy_objective": 0.1, "value_loss": 1e-3, "entropy": 1e-3, "approx_kl": 1e-3}
# Where the authors' own float32 advantage statistics are off by rho (`authors_rounding`), the
# LoRA weight changes are compared at their tolerance + DELTA_ROUNDING * rho: Adam's first
# steps divide each gradient element by its own size, which turned gradient errors of 0.38-0.47 rho
# into weight-change errors of 0.74-3.6 rho on 9 such cases (docs/adrl_parity.md).
DELTA_ROUNDING = 10.0


class CaseFileError(Exception):
    """The file is not a parity case file (one line)."""


class CaseNotReplayable(Exception):
    """A case whose update poad_jax cannot replay as recorded (one line)."""


def relative_error(ours: np.ndarray, theirs: np.ndarray) -> float:
    """||ours - theirs|| / ||theirs|| (Frobenius norms; 0 when both are exactly 0)."""
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    difference = float(np.linalg.norm(ours - theirs))
    if difference == 0.0:
        return 0.0
    return difference / max(float(np.linalg.norm(theirs)), 1e-30)


def scalar_error(ours: float, theirs: float, floor: float) -> float:
    """|ours - theirs| / max(|theirs|, floor)."""
    return abs(float(ours) - float(theirs)) / max(abs(float(theirs)), floor)


def load_cases(path: str | pathlib.Path) -> tuple[dict[str, np.ndarray], list[str]]:
    """(arrays, case names) of a case file; CaseFileError for anything else."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise CaseFileError(f"no case file at {path}")
    try:
        with np.load(path) as data:
            arrays = {key: data[key] for key in data.files}
    except Exception as error:  # not an .npz at all
        raise CaseFileError(f"{path} is not a .npz case file ({type(error).__name__}: {error})") from None
    names = sorted({key.split("/")[0] for key in arrays if key.endswith("/meta")})
    if not names:
        raise CaseFileError(f"{path} holds no case (no '<case>/meta' entry); see docs/adrl_parity.md")
    return arrays, names


def _case(arrays: dict[str, np.ndarray], name: str) -> dict[str, Any]:
    prefix = f"{name}/"
    case = {key[len(prefix):]: value for key, value in arrays.items() if key.startswith(prefix)}
    case["meta"] = json.loads(str(case["meta"]))
    return case


def build_model(arrays: dict[str, np.ndarray], meta: dict[str, Any]):
    """Our Llama with the case file's base weights (or its model directory) and LoRA placement."""
    import jax.numpy as jnp

    from poad_jax.models import hf_io
    from poad_jax.models.config import LlamaConfig, LoraConfig

    lora = LoraConfig(rank=int(meta["lora_rank"]), alpha=float(meta["lora_alpha"]), targets=tuple(meta["lora_targets"]))
    if "model/directory" in arrays:
        return hf_io.load_hf_model(str(arrays["model/directory"]), lora=lora, dtype=jnp.float32)
    config = LlamaConfig.from_hf(json.loads(str(arrays["model/config_json"])))
    get = lambda name: arrays[f"model/{name}"]
    has = lambda name: f"model/{name}" in arrays
    return hf_io.model_from_tensors(config, get, has, lora=lora, dtype=jnp.float32)


def set_weights(model, head, case: dict[str, Any]) -> None:
    """The case's initial LoRA (A `[L, in, r]`, B `[L, r, out]`) and head kernels (`[in, out]`)."""
    import jax.numpy as jnp

    for target in model.layers.lora_a.keys():
        model.layers.lora_a[target][...] = jnp.asarray(case[f"initial/lora_a/{target}"])
        model.layers.lora_b[target][...] = jnp.asarray(case[f"initial/lora_b/{target}"])
    layers = list(head.hidden_layers) + [head.out]
    for i, layer in enumerate(layers):
        layer.kernel[...] = jnp.asarray(case[f"initial/head/{i}"])


def _unpadded(row: np.ndarray) -> list[int]:
    return [int(i) for i in row if i >= 0]


def build_batch(graph, frozen, actor_lora, case: dict[str, Any], method):
    """The case's rows as our TokenBatch (features from our frozen base; old log-probs and
    values, rewards, dones and bootstrap values as ADRL's buffer held them)."""
    import jax.numpy as jnp

    from poad_jax.run.config import default_config, rollout_config
    from poad_jax.agent.rollout import StepRecord
    from poad_jax.agent.experience import make_token_batch

    meta = case["meta"]
    texts = json.loads(str(case["candidate_texts"]))
    token_level = method.scheme.token_level
    rows = []
    for n in range(len(case["rewards"])):
        candidates = [_unpadded(c) for c in case["candidates"][n]][: len(texts[n])]
        rows.append(StepRecord(
            prompt=_unpadded(case["prompts"][n]), action_tokens=_unpadded(case["actions"][n]),
            reward=float(case["rewards"][n]), done=bool(case["dones"][n]),
            candidates=None if token_level else candidates, candidate_texts=None if token_level else texts[n],
            chosen=int(case["chosen"][n]),
        ))
    config = default_config()
    config.restricted_sampling = "action_scores"
    config.twosome_normalization = meta["twosome_normalization"]
    rconfig = rollout_config(config)
    prompt_len = max(len(r.prompt) for r in rows)
    arrays = method.scheme.pack(rows, prompt_len, rconfig, pad_id=0)
    as_jax = {k: jnp.asarray(v) for k, v in arrays.items()}
    as_jax.update(rewards=jnp.asarray(case["rewards"], jnp.float32), dones=jnp.asarray(case["dones"], bool))
    view = make_token_batch(as_jax)  # the packed rows, without behaviour statistics
    features = method.scheme.critic_features(graph, frozen, actor_lora, view, use_lora=False)
    action_len = arrays["action_mask"].shape[-1]

    def fit(x):  # ADRL's [N, max_new_tokens] -> our [N, A]
        x = np.asarray(x, np.float32)
        if x.ndim == 1:
            return jnp.asarray(x)
        out = np.zeros((x.shape[0], action_len), np.float32)
        width = min(action_len, x.shape[1])
        out[:, :width] = x[:, :width]
        return jnp.asarray(out)

    stats = dict(old_logprobs=fit(case["old_logprobs"]), old_values=fit(case["old_values"]), features=features,
                 bootstrap_value=jnp.asarray(case["bootstrap_value"], jnp.float32))
    return make_token_batch(as_jax, stats), fit


def _flat_params(tree) -> dict[str, np.ndarray]:
    """{"lora_a/q_proj" | "lora_b/v_proj" | "head/0" ...: array} of our params (or gradients) tree."""
    import jax

    out = {}
    for path, value in jax.tree_util.tree_flatten_with_path(tree)[0]:
        names = [str(getattr(p, "key", getattr(p, "idx", getattr(p, "name", p)))) for p in path]
        if names[0] == "actor":
            kind = "lora_a" if "lora_a" in names else "lora_b"
            out[f"{kind}/{names[-1] if names[-1] != 'value' else names[-2]}"] = np.asarray(value)
        elif names[0] == "head" and "kernel" in names:
            if "out" in names:
                index = None
            else:
                index = int(names[names.index("hidden_layers") + 1])
            out[f"head/{'out' if index is None else index}"] = np.asarray(value)
    heads = sorted(k for k in out if k.startswith("head/") and k != "head/out")
    if "head/out" in out:
        out[f"head/{len(heads)}"] = out.pop("head/out")
    return out


def learner_config_of(meta: dict[str, Any], semantics: str):
    from poad_jax.run.config import learner_config

    adrl = semantics == "adrl"
    return learner_config(
        None, gamma=meta["gamma"], lam=meta["lam"], clip_eps=meta["clip_eps"], value_clip_eps=meta["value_clip_eps"],
        vf_coef=meta["vf_coef"], ent_coef=meta["ent_coef"], max_grad_norm=meta["max_grad_norm"],
        target_kl=meta["target_kl"], epochs=meta["epochs"], num_minibatches=meta["num_minibatches"],
        accumulation_steps=1, actor_lr=meta["actor_lr"], critic_lr=meta["critic_lr"], adam_eps=meta["adam_eps"],
        temperature=1.0, normalize_advantages=True, critic_kind="head",
        kl_skip="actor" if adrl else "update", advantage_normalization="adrl" if adrl else "valid",
        loss_chunks=int(meta["loss_chunks"]) if adrl else 1,
    )


@dataclasses.dataclass(frozen=True)
class Replay:
    """A case set up for poad_jax: its data, our method and learner settings, the batch, and the
    compiled update (the case's minibatch order, every minibatch recorded) with its initial state."""

    case: dict[str, Any]
    method: Any
    lconfig: Any
    batch: Any
    fit: Any
    update: Any
    state: Any
    frozen: Any


def replayed_update(context, orders, step=None):
    """Our update (`learner.ppo_update`'s parts, before `jax.jit`) in `context`
    (`learner.UpdateContext`, one row group), with another trainer's minibatch rows
    `orders [epochs, M, N / M]` instead of fresh random ones: `(state, frozen, batch) ->
    (state, metrics, details)`.  Each minibatch is `step` (default `learner.minibatch_step`);
    the state's RNG advances as in the update, so both leave the same state."""
    import chex
    import jax
    import jax.numpy as jnp

    from poad_jax.agent import learner

    step = learner.minibatch_step if step is None else step
    orders = jnp.asarray(orders, jnp.int32)
    chex.assert_shape(orders, (context.config.epochs, context.config.num_minibatches, None))

    def update(state, frozen, batch):
        learner.check_batch_rows(batch.num_rows, context.config)
        data = learner.update_batch(batch, context)
        value_mask = context.method.scheme.valid(batch)

        def epoch(state, order):
            state, _ = learner.split_rng(state)  # the key the update draws its order with
            return jax.lax.scan(lambda carry, index: step(carry, index, frozen, data, context), state,
                                order[:, None, :])

        state, stats = jax.lax.scan(epoch, state, orders)
        return learner.finish_update(state, stats, data, value_mask, context)

    return update


def recording_update(graph, method, lconfig, orders):
    """`replayed_update` of another trainer's minibatch rows `orders [epochs, M, N / M]`
    whose metrics also hold every minibatch's statistics (`"minibatches"`, `[epochs, M]`, with
    its gradients before clipping, `"grads"`, and its normalised advantages) and the batch's
    advantages and returns, which the harness compares."""
    from poad_jax.agent.learner import UpdateContext, apply_minibatch, minibatch_gradients

    def recording_step(state, index, frozen, data, context):
        loss, stats, grads, normalised = minibatch_gradients(state, index, frozen, data, context)
        state, stats = apply_minibatch(state, loss, stats, grads, context.config)
        return state, {**stats, "grads": grads, "advantages": normalised}

    replayed = replayed_update(UpdateContext(graph, method, lconfig), orders, recording_step)

    def update(state, frozen, batch):
        state, metrics, details = replayed(state, frozen, batch)
        return state, {**metrics, **details}

    return update


def replay(arrays: dict[str, np.ndarray], name: str, semantics: str = "adrl") -> Replay:
    """Case `name` with our model holding its weights, its batch, and our jitted update."""
    import jax
    from flax import nnx

    from poad_jax.agent.learner import init_train_state
    from poad_jax.agent.methods import make_method
    from poad_jax.core.critic_config import CriticConfig
    from poad_jax.core.policy import ValueHead, split_policy

    case = _case(arrays, name)
    meta = case["meta"]
    model = build_model(arrays, meta)
    authors_head = CriticConfig(hidden_sizes=tuple(meta["head_sizes"]), bias=False, init="torch")
    head = ValueHead(model.config.hidden_size, authors_head, rngs=nnx.Rngs(0))
    set_weights(model, head, case)
    graph, frozen, params = split_policy(model, head)
    method = make_method(meta["method"], float(meta["gamma"]), float(meta["gamma_w"]))
    lconfig = learner_config_of(meta, semantics)
    batch, fit = build_batch(graph, frozen, params["actor"], case, method)
    update = recording_update(graph, method, lconfig, case["orders"])
    state = init_train_state(params, lconfig, jax.random.key(0))
    return Replay(case, method, lconfig, batch, fit, jax.jit(update), state, frozen)


def time_update(arrays: dict[str, np.ndarray], name: str, repeats: int = 3, semantics: str = "adrl") -> dict:
    """Seconds of our whole update on the case's rows (best of `repeats` after one compiling call) and
    the authors' `trainer.train` on the same rows, as the case script recorded it (None if it did not)."""
    import time

    import jax

    run = replay(arrays, name, semantics)
    jax.block_until_ready(run.update(run.state, run.frozen, run.batch))  # compiles
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(run.update(run.state, run.frozen, run.batch))
        seconds.append(time.perf_counter() - start)
    theirs = run.case.get("seconds_update")
    threads = run.case.get("torch_threads")
    return {"ours": min(seconds), "theirs": None if theirs is None else float(theirs),
            "torch_threads": None if threads is None else int(threads), "rows": int(run.batch.tokens.shape[0])}


def replayability(case: dict[str, Any], semantics: str = "adrl") -> str | None:
    """Why poad_jax cannot replay the case's update as recorded (one line), or None when it can."""
    meta = case["meta"]
    rows, minibatches = len(case["rewards"]), int(meta["num_minibatches"])
    if rows % minibatches:
        return (f"{rows} rows do not divide into {minibatches} minibatches: ADRL's sampler leaves the last "
                f"{rows % minibatches} rows of every epoch's permutation out, poad_jax's update puts every row "
                f"in a minibatch")
    chunks = int(meta["loss_chunks"]) if semantics == "adrl" else 1
    if (rows // minibatches) % chunks:
        return (f"minibatches of {rows // minibatches} rows do not divide into {chunks} loss chunks: ADRL then "
                f"adds a shorter last chunk, poad_jax's chunks are equal")
    return None


def authors_rounding(case: dict[str, Any], backup: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """(relative, shift), each [E, M]: how far the normalised advantages ADRL's policy loss
    received (`policy_advantages`, float32) are from the exact (float64) statistics of `backup`
    (default: their own backup, `advantages`); None for a file without them.

    Their rule: TWOSOME, each loss chunk's mean and unbiased std; token level, the mean and std
    (ddof 0) of the minibatch's non-zero advantages; then (A - mean) / (std + 1e-8).  relative:
    ||theirs - exact|| / ||exact|| over valid elements.  Where a chunk's advantages nearly
    coincide, a float32 mean's rounding (half an ulp of the mean) is a large part of the std,
    and so is one ulp of difference between two backups: with their own backup this measures
    their rounding; with ours (`check_case` passes it) also what our backup's last-bit
    differences must change in exact statistics.  shift: the same |theirs - exact| averaged as
    the objective averages its terms (each loss chunk's mean over its valid elements, then the
    mean over chunks): a rounded mean moves a chunk's advantages all one way, and the objective
    with them."""
    if "policy_advantages" not in case:
        return None
    meta = case["meta"]
    orders, seen = case["orders"], case["policy_advantages"]
    backup = case["advantages"] if backup is None else backup
    epochs, minibatches, rows = orders.shape
    token_level = meta["method"] != "twosome"
    chunks = int(meta["loss_chunks"])
    lengths = np.sum(case["actions"] >= 0, axis=1)
    out, shift = np.zeros((epochs, minibatches)), np.zeros((epochs, minibatches))
    for e in range(epochs):
        for m in range(minibatches):
            values = np.asarray(backup, np.float64)[orders[e, m]]
            if token_level:
                valid = np.arange(values.shape[1])[None, :] < lengths[orders[e, m]][:, None]
                values = np.where(valid, values, 0.0)
                nonzero = values[values != 0]
                exact = (values - nonzero.mean()) / (nonzero.std() + 1e-8) if nonzero.size else np.zeros_like(values)
            else:
                valid = np.ones(values.shape, bool)
                split = values.reshape(chunks, -1)
                exact = ((split - split.mean(1, keepdims=True))
                         / (split.std(1, ddof=1, keepdims=True) + 1e-8)).reshape(values.shape)
            out[e, m] = relative_error(np.where(valid, seen[e, m], 0.0), np.where(valid, exact, 0.0))
            moved = np.where(valid, np.abs(seen[e, m] - exact), 0.0).reshape(chunks, -1)
            counted = np.broadcast_to(valid, values.shape).astype(np.float64).reshape(chunks, -1)
            shift[e, m] = np.mean(moved.sum(1) / np.maximum(counted.sum(1), 1.0))
    return out, shift


def check_case(arrays: dict[str, np.ndarray], name: str, semantics: str = "adrl") -> list[dict[str, Any]]:
    """Replays case `name` with poad_jax; one row per compared field:
    {"field", "kind", "error", "tolerance", "ok", "widened"}: the error of the minibatch with the
    largest error / tolerance and that tolerance; `widened`, where a tolerance was raised by the
    authors' float32 rounding of the advantage statistics and our backup's last bits where a
    chunk's advantages nearly coincide (`authors_rounding` against our backup, its running
    largest over the minibatches so far): the actor-side per-minibatch fields (normalised
    advantages, objective, entropy, KL, LoRA gradients and their norm) accept tolerance + that
    rounding, the LoRA weight changes tolerance + DELTA_ROUNDING x its largest.
    CaseNotReplayable (one line) for a case poad_jax cannot replay as recorded."""
    reason = replayability(_case(arrays, name), semantics)
    if reason is not None:
        raise CaseNotReplayable(reason)
    run = replay(arrays, name, semantics)
    case, method, lconfig, batch, fit = run.case, run.method, run.lconfig, run.batch, run.fit
    initial = _flat_params(run.state.params)
    state, metrics = run.update(run.state, run.frozen, batch)
    final = _flat_params(state.params)
    recorded = metrics["minibatches"]
    valid = np.asarray(method.scheme.valid(batch))
    ours_backup = np.where(valid, np.asarray(metrics["advantages"]), 0.0)
    if ours_backup.ndim == 2:  # ours [N, A] -> their [N, max_new_tokens]
        width = case["advantages"].shape[1]
        ours_backup = np.pad(ours_backup, ((0, 0), (0, max(0, width - ours_backup.shape[1]))))[:, :width]
    rounding = authors_rounding(case, ours_backup) if semantics == "adrl" else None
    epochs, minibatches = case["skipped"].shape
    # A minibatch starts from the weights every earlier one moved: its actor-side fields are as
    # uncertain as the largest rounding of any minibatch up to it (in update order).
    running = lambda x: np.maximum.accumulate(x.ravel()).reshape(epochs, minibatches)
    extra, shift = (np.zeros((epochs, minibatches)),) * 2 if rounding is None else map(running, rounding)
    rows = []

    def add(field, kind, errors, widen=None):
        errors = np.atleast_1d(np.asarray(errors, np.float64)).ravel()
        tolerances = np.full(errors.shape, TOLERANCES[kind])
        if widen is not None:
            tolerances = tolerances + np.ravel(widen)
        worst = int(np.argmax(errors / np.maximum(tolerances, 1e-30))) if tolerances.any() else int(np.argmax(errors))
        widened = widen is not None and float(np.ravel(widen)[worst]) > 0.5 * TOLERANCES[kind]
        rows.append({"field": field, "kind": kind, "error": float(errors[worst]),
                     "tolerance": float(tolerances[worst]), "ok": bool(np.all(errors <= tolerances)),
                     "widened": bool(widened)})

    for field in ("advantages", "returns"):
        ours = np.where(valid, np.asarray(metrics[field]), 0.0)
        add(field, "backup", relative_error(ours, np.where(valid, fit(case[field]), 0.0)))
    if "policy_advantages" in case and semantics == "adrl":
        ours_seen = np.asarray(recorded["advantages"])
        theirs_seen = case["policy_advantages"]
        errors = np.zeros((epochs, minibatches))
        for e in range(epochs):
            for m in range(minibatches):
                mask = valid[case["orders"][e, m]]
                errors[e, m] = relative_error(np.where(mask, ours_seen[e, m], 0.0),
                                              np.where(mask, fit(theirs_seen[e, m]), 0.0))
        add("normalised advantages", "grad", errors, extra)
    objective = np.asarray(recorded["policy_loss"]) - lconfig.ent_coef * np.asarray(recorded["entropy"])
    for field, ours in (("policy_objective", objective), ("value_loss", recorded["value_loss"]),
                        ("entropy", recorded["entropy"]), ("approx_kl", recorded["approx_kl"])):
        ours, theirs = np.asarray(ours), case[field]
        floor = SCALAR_FLOORS[field]
        errors = [scalar_error(o, t, floor) for o, t in zip(ours.ravel(), theirs.ravel())]
        widen = extra
        if field == "policy_objective":  # a term whose advantage moved by d moves by ratio * d (ratios < 1 + clip)
            widen = extra + (1.0 + lconfig.clip_eps) * shift / np.maximum(np.abs(theirs), floor)
        add(field, "scalar", errors, None if field == "value_loss" else widen)
    skips = np.asarray(recorded["skipped"]) > 0.5
    add("skipped", "skip", float(np.sum(skips != case["skipped"])))
    for field in ("actor_grad_norm", "critic_grad_norm"):
        if field in case:
            ours, theirs = np.asarray(recorded[field], np.float64), np.asarray(case[field], np.float64)
            add(field.replace("_", " "), "grad", np.abs(ours - theirs) / np.maximum(np.abs(theirs), 1e-30),
                extra if field == "actor_grad_norm" else None)
    grads = {key: np.asarray(value) for key, value in _flat_params(recorded["grads"]).items()}
    for key in sorted(grads):
        theirs = case[f"grads/{key}"]
        errors = [[relative_error(grads[key][e, m], theirs[e, m]) for m in range(minibatches)] for e in range(epochs)]
        add(f"grad {key}", "grad", errors, extra if key.startswith("lora") else None)
    for key in sorted(final):
        add(f"delta {key}", "delta", relative_error(final[key] - initial[key], case[f"delta/{key}"]),
            DELTA_ROUNDING * np.max(extra) if key.startswith("lora") else None)
    return rows


def coverage(arrays: dict[str, np.ndarray], name: str) -> dict[str, bool]:
    """Which of the conditions the parity cases must include this case exercises (from its data)."""
    case = _case(arrays, name)
    meta = case["meta"]
    actions = case["actions"]
    lengths = np.sum(actions >= 0, axis=1)
    token_level = meta["method"] != "twosome"
    advantages = case["advantages"]
    if token_level:
        valid = np.arange(advantages.shape[1])[None, :] < lengths[:, None]
        zero = bool(np.any((advantages == 0) & valid))
    else:
        zero = bool(np.any(advantages == 0))
    norms = np.concatenate([case["actor_grad_norm"].ravel(), case["critic_grad_norm"].ravel()])
    returns_differ = np.abs(case["returns"] - case["old_values"])
    return {
        "kl_skip": bool(np.any(case["skipped"])) and not bool(np.all(case["skipped"])),
        "zero_advantages": zero,
        "value_clipping": bool(np.any(returns_differ > meta["value_clip_eps"])),
        "grad_clipping": bool(np.any(norms > meta["max_grad_norm"])),
        "several_epochs": int(meta["epochs"]) > 1,
        "multi_token_action": bool(np.any(lengths > 1)),
        "episode_end_inside": bool(np.any(case["dones"])),
        "loss_chunks": int(meta["loss_chunks"]) > 1,
    }


def timing_line(name: str, timed: dict) -> str:
    """One line: our update's seconds on the case's rows beside the authors' (when recorded) and their ratio."""
    line = (f"update on the same {timed['rows']} rows, case {name}: "
            f"ours {timed['ours']:.3f} s (jit, best after compiling)")
    if timed["theirs"] is None:
        return line + "; the authors' time is not in this case file (make it again with scripts/reference/" \
                      "adrl_update_cases.py)"
    return (line + f"; the authors' trainer.train {timed['theirs']:.3f} s ({timed['torch_threads']} torch "
            f"threads): {timed['theirs'] / timed['ours']:.2f}x")


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="python -m poad_jax.bench adrl_parity", description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="tests/fixtures/adrl_update_cases.npz", help="case file (.npz)")
    parser.add_argument("--semantics", default="adrl", choices=("adrl", "ours"),
                        help="adrl: replay with the authors' semantics; ours: with poad_jax's defaults")
    parser.add_argument("--time", type=int, default=0, metavar="REPEATS",
                        help="also time our update on each case's rows (best of REPEATS after compiling) beside "
                             "the authors' trainer.train as the case script recorded it")
    args = parser.parse_args(argv)
    import jax

    jax.config.update("jax_enable_x64", False)
    try:
        arrays, names = load_cases(args.cases)
    except CaseFileError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    worst: dict[str, Any] = {}
    timed: dict[str, dict] = {}
    failed = False
    not_replayed: dict[str, str] = {}
    for name in names:
        try:
            rows = check_case(arrays, name, args.semantics)
        except CaseNotReplayable as error:
            print(f"\ncase {name}: not replayed: {error}")
            not_replayed[name] = str(error)
            failed = True
            continue
        except Exception as error:  # one case's failure must not stop the rest of the file
            line = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            print(f"\ncase {name}: error: {line}")
            not_replayed[name] = line
            failed = True
            continue
        print(f"\ncase {name} ({args.semantics} semantics)")
        print(f"{'field':<28}{'largest error':>16}{'tolerance':>12}  ok")
        for row in rows:
            note = "  (widened: float32 rounding of nearly equal advantages)" if row.get("widened") else ""
            print(f"{row['field']:<28}{row['error']:>16.3e}{row['tolerance']:>12.1e}  "
                  f"{'yes' if row['ok'] else 'NO'}{note}")
            failed |= not row["ok"]
        worst[name] = max(rows, key=lambda r: r["error"] / max(r["tolerance"], 1e-12) if r["tolerance"] else
                          (np.inf if r["error"] else 0.0))["field"]
        if args.time > 0:
            timed[name] = time_update(arrays, name, args.time, args.semantics)
            print(timing_line(name, timed[name]))
    print(json.dumps({"bench": "adrl_parity", "cases": names, "semantics": args.semantics, "ok": not failed,
                      "worst_field": worst, **({"not_replayed": not_replayed} if not_replayed else {}),
                      **({"seconds_update": timed} if timed else {})}))
    return 1 if failed else 0
