"""FSDP as ZeRO-3: the compiled update gathers weights, not rows.

With the frozen base split over `fsdp` and nothing pinning the activations,
XLA's partitioner keeps each weight shard where it is and moves the
activations to it (all-gathers of the hidden states, all-reduces of partial
matmul outputs: traffic that grows with the batch).  The sharded update
therefore pins the residual stream's rows over ('data', 'fsdp') at the top
of every decoder layer (`Llama.__call__(constrain=...)`, set through
`PolicyGraph.constrain` by `distributed.update.constrained_graph`); then each
device runs its own rows through a layer and all-gathers that layer's
weight shards.

Like tests/test_sharding.py (whose helpers this reuses), the mesh tests run
in one subprocess with 8 host devices; the tests read what it wrote.

Audit shapes: the tiny model (hidden 40, q 40, k/v 20, MLP 80, vocabulary
119, LoRA r = 8, head 48) and a batch whose sequence (T = 21) and action
window (A = 9) divide no weight dimension, so "a collective carrying tokens"
is "an array with a dimension divisible by T or A" (rows flattened with the
sequence included).
"""

from __future__ import annotations

import json
import pathlib
import re
import sys

import numpy as np
import pytest

from test_sharding import HEAD_SIZES, HIDDEN, _dims, assert_update_close, collectives, run_on_host_devices

# One xdist worker runs every test of this module (`--dist loadgroup`, scripts/test.sh): its module
# fixture, minutes of training or of subprocesses, is then set up once per suite, not once per worker.
pytestmark = [pytest.mark.xdist_group("sharding_fsdp"), pytest.mark.long]

REPO = pathlib.Path(__file__).resolve().parents[1]
AUDIT_ROWS, AUDIT_THREADS, AUDIT_PROMPT, AUDIT_ACTION = 96, 8, 12, 9  # T = 21
FSDP = 8


@pytest.fixture(scope="module")
def fsdp_results(tmp_path_factory):
    return run_on_host_devices(__file__, tmp_path_factory.mktemp("sharding_fsdp"), devices=FSDP)


# ---------------------------------------------------------------------------
# The audit.


def typed_collectives(hlo_text: str) -> list[tuple[str, bool, list[list[int]]]]:
    """(kind, floating?, result shapes) of every collective in a compiled
    module's text (`test_sharding.collectives`, line by line).  XLA writes
    `/*index=5*/` inside tuples of six or more results; it is removed first
    (its `=` would hide the collective)."""
    found = []
    for line in re.sub(r"/\*index=\d+\*/", "", hlo_text).splitlines():
        for kind, shapes in collectives(line):
            result = line.split(f" {kind}")[0]
            found.append((kind, bool(re.search(r"\b(f16|bf16|f32|f64)\[", result)), shapes))
    return found


def carries_tokens(shape, seq_len: int, action_len: int) -> bool:
    """Whether an array holds activations: a dimension divisible by the
    sequence length or the action window (alone, or flattened with rows)."""
    return any(d % seq_len == 0 or d % action_len == 0 for d in shape if d > 1)


def zero3_violations(found, weight_shapes, trainable_shapes, seq_len, action_len, rows, hidden) -> list:
    """What keeps a compiled update from being ZeRO-3, as a list (empty: none):

    - a floating all-gather that is not of a frozen weight's shape (one
      layer's `[in, out]`, or a whole `[V, H]` / `[H, V]` table, in either
      layout);
    - an all-reduce or reduce-scatter of anything but trainable shapes
      (LoRA, value head: their gradients) and scalars;
    - tokens moved otherwise than by the embedding lookup, whose ids are
      all-gathered (one integer `[rows, T, 1]`) and whose output is
      exchanged once (an all-to-all of `rows x T x H / fsdp` elements: the
      table split on H, the rows split after it).  Gathering the `[V, H]`
      table instead would move V / (rows x T / fsdp) times more bytes.
    """
    bad = []
    for kind, floating, shapes in found:
        dims = [_dims(s) for s in shapes]
        tokens = any(carries_tokens(s, seq_len, action_len) for s in shapes)
        if kind == "all-gather" and floating and not all(d in weight_shapes for d in dims):
            bad.append((kind, shapes))
        elif kind == "all-gather" and not floating and (len(shapes) != 1 or shapes[0] != [rows, seq_len, 1]):
            bad.append((kind, shapes))
        elif kind in ("all-reduce", "reduce-scatter") and any(
                d not in trainable_shapes and np.prod(d) > 8 for d in dims):
            bad.append((kind, shapes))
        elif kind == "all-to-all" and sum(np.prod(s) for s in shapes) != rows * seq_len * hidden // FSDP:
            bad.append((kind, shapes))
        elif kind == "collective-permute" and tokens:
            bad.append((kind, shapes))
    exchanges = [k for k, _, shapes in found if k == "all-to-all"]
    if len(exchanges) > 1:
        bad.append(("all-to-all", f"{len(exchanges)} exchanges, the embedding needs one"))
    return bad


def _audit(summary, name):
    return zero3_violations(
        summary["collectives"][name], {tuple(s) for s in summary["weight_shapes"]},
        {tuple(s) for s in summary["trainable_shapes"]}, AUDIT_PROMPT + AUDIT_ACTION, AUDIT_ACTION,
        summary["micro_rows"], HIDDEN)


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_fsdp_update_gathers_weights_not_rows(fsdp_results, precision):
    """On (1,8,1) with the activation hook the compiled update's floating
    all-gathers are all of frozen-weight shapes (one layer's matrices, the
    tied embedding for the logits), its reductions are of LoRA / head
    gradients and scalars, and the only token traffic is the embedding
    lookup's (ids in, one `[rows, T, H/8]` exchange out).  float32, and
    bfloat16 base weights with `mixed_einsum` (the GPU set-up)."""
    summary, _ = fsdp_results
    found = summary["collectives"][f"hook_{precision}"]
    assert any(kind == "all-gather" and floating for kind, floating, _ in found)  # weights are gathered
    assert _audit(summary, f"hook_{precision}") == []


def test_fsdp_update_without_the_hook_moves_activations(fsdp_results):
    """The tripwire: the same update with the hook off (today's behaviour
    before it) all-gathers hidden states and all-reduces partial matmul
    outputs, batch-shaped; the audit reports them."""
    summary, _ = fsdp_results
    violations = _audit(summary, "no_hook_float32")
    seq_len = AUDIT_PROMPT + AUDIT_ACTION
    assert any(kind == "all-gather" and any(carries_tokens(s, seq_len, AUDIT_ACTION) for s in shapes)
               for kind, shapes in violations), violations
    assert any(kind == "all-reduce" for kind, _ in violations), violations


def _assert_update_matches(summary, arrays, name):
    """Tolerances of tests/test_sharding.py: metrics within 1e-6 + 1e-5
    relative, parameters within 1e-5 absolute (the update moves them by
    4e-2).  Not bit-exact: the mesh's rows are summed per device and then
    all-reduced (another order of float32 additions, a few 1e-7 of the
    gradients' scale); Adam's m / sqrt(v) is scale-free, so over four steps
    at lr 1e-2 that stays far below 1e-5."""
    names = sorted(k.split("/", 1)[1] for k in arrays if k.startswith(f"{name}/"))
    assert_update_close(summary["metrics"][name], summary["metrics"][f"single_{name}"],
                        {key: (arrays[f"{name}/{key}"], arrays[f"single_{name}/{key}"]) for key in names})
    assert summary["param_change"][name] > 1e-2


def test_update_with_the_hook_matches_one_device(fsdp_results):
    """One PPO update (2 epochs x 2 minibatches x 2 micro-batches) on
    (1,8,1) with the hook equals one device with the same row groups."""
    summary, arrays = fsdp_results
    _assert_update_matches(summary, arrays, "fsdp8")


def test_remat_none_with_fsdp_trains_as_one_device_and_gathers_weights(fsdp_results):
    """`remat="none"` (every layer's activations saved for the backward
    pass) works under FSDP: the update equals one device's, and it is
    ZeRO-3 too."""
    summary, arrays = fsdp_results
    _assert_update_matches(summary, arrays, "fsdp8_remat_none")
    assert _audit(summary, "remat_none_float32") == []


def test_first_ratio_is_one_when_behaviour_statistics_use_the_hook(fsdp_results):
    """Behaviour statistics computed with the constrained graph and the
    learner's log-probs (same graph, same mesh) agree bit for bit: the first
    PPO ratio is exactly 1.  Statistics from the unconstrained graph differ
    from the learner's in float32 rounding only (measured 7.6e-6, bound 5e-5), so a
    trainer on an fsdp mesh should give both the constrained graph."""
    summary, _ = fsdp_results
    ratio = summary["first_ratio"]
    assert ratio["hook"]["count"] > 0 and ratio["hook"]["min"] == ratio["hook"]["max"] == 1.0
    assert ratio["no_hook_stats"]["count"] == ratio["hook"]["count"]
    assert max(abs(ratio["no_hook_stats"]["min"] - 1), abs(ratio["no_hook_stats"]["max"] - 1)) < 5e-5


def test_hook_passes_arrays_it_cannot_split(fsdp_results):
    """`activation_constraint` leaves an array whose rows do not divide by
    data x fsdp unconstrained (pinning it would replicate it: an all-gather
    of activations), and pins one that divides."""
    summary, _ = fsdp_results
    assert summary["hook_on_odd_rows"] == {"rows_6": "unconstrained", "rows_16": "constrained"}


def test_tensor_axis_must_divide_the_heads():
    """`check_tensor_split`: one line naming the tensor size and both head
    counts; None (one device) and sizes dividing both heads pass."""
    from types import SimpleNamespace

    from jax.sharding import AbstractMesh

    from poad_jax.parallel.sharding import MESH_AXES, check_tensor_split

    gqa = SimpleNamespace(num_attention_heads=32, num_key_value_heads=8)
    check_tensor_split(gqa, None)
    check_tensor_split(gqa, AbstractMesh((1, 1, 8), MESH_AXES))
    with pytest.raises(ValueError, match=r"^mesh.tensor = 16 must divide the model's attention heads \(32\) and "
                                         r"KV heads \(8\): tensor parallelism splits whole heads$"):
        check_tensor_split(gqa, AbstractMesh((1, 1, 16), MESH_AXES))
    with pytest.raises(ValueError, match=r"attention heads \(12\)"):
        check_tensor_split(SimpleNamespace(num_attention_heads=12, num_key_value_heads=4),
                           AbstractMesh((1, 1, 8), MESH_AXES))


def test_sharded_update_refuses_a_tensor_axis_splitting_heads(fsdp_results):
    """The sharded update of the tiny model (4 heads, 2 KV heads) on
    (1,2,4) is refused with that line before anything compiles."""
    summary, _ = fsdp_results
    assert summary["tensor_error"] == ("mesh.tensor = 4 must divide the model's attention heads (4) and KV heads (2): "
                                       "tensor parallelism splits whole heads")


# ---------------------------------------------------------------------------
# The worker (runs with 8 host devices).


def _policy(matmul_dtype=None, remat="full"):
    """The tiny policy (graph, frozen, params), LoRA B and the head's output away from zero."""
    import jax
    from flax import nnx

    from poad_jax.core.critic_config import CriticConfig
    from poad_jax.core.policy import ValueHead, split_policy
    from poad_jax.models.tiny import tiny_random_model

    model, _ = tiny_random_model(hidden_size=HIDDEN, matmul_dtype=matmul_dtype, remat=remat)
    head = ValueHead(HIDDEN, CriticConfig(hidden_sizes=HEAD_SIZES), rngs=nnx.Rngs(1))
    graph, frozen, params = split_policy(model, head)
    leaves, treedef = jax.tree.flatten(params)  # LoRA B and the head's output away from zero
    keys = jax.random.split(jax.random.key(7), len(leaves))
    params = jax.tree.unflatten(treedef, [x + 0.05 * jax.random.normal(k, x.shape, x.dtype)
                                          for x, k in zip(leaves, keys)])
    return graph, frozen, params


def _copy(tree):
    """A copy of every array (updates donate their state)."""
    import jax
    import jax.numpy as jnp

    return jax.tree.map(jnp.copy, tree)


def _audits(summary: dict, mesh, method, config) -> None:
    """The update's collectives compiled from shapes alone (hook on and off, bfloat16, remat none); the
    refusal of a tensor axis that splits heads; the weight and trainable shapes the audit tells apart."""
    import jax
    import jax.numpy as jnp

    from poad_jax import parallel as dist
    from poad_jax.agent import sharded_update as sharded
    from poad_jax.agent.learner import init_train_state
    from poad_jax.bench._update_memory import abstract_token_batch

    def audit(name, graph, frozen, params, hook):
        state = jax.eval_shape(lambda p: init_train_state(p, config, jax.random.key(0)), params)
        batch = abstract_token_batch(AUDIT_ROWS, AUDIT_THREADS, AUDIT_PROMPT, AUDIT_ACTION, HIDDEN)
        rules = dist.train_rules()
        args = (dist.abstract_like(state, dist.tree_shardings(state, rules, mesh)),
                dist.abstract_like(frozen, dist.tree_shardings(frozen, rules, mesh)),
                dist.abstract_like(batch, dist.batch_shardings(batch, mesh)))
        update, _ = sharded.jit_sharded_update(graph, method, config, mesh, constrain_activations=hook)
        summary["collectives"][name] = typed_collectives(update.lower(*args).compile().as_text())

    graph, frozen, params = _policy()
    audit("hook_float32", graph, frozen, params, True)
    audit("no_hook_float32", graph, frozen, params, False)
    audit("hook_bfloat16", *_policy(jnp.bfloat16), True)
    audit("remat_none_float32", *_policy(remat="none"), True)
    try:
        graph, frozen, params = _policy()
        state = jax.eval_shape(lambda p: init_train_state(p, config, jax.random.key(0)), params)
        batch = abstract_token_batch(AUDIT_ROWS, AUDIT_THREADS, AUDIT_PROMPT, AUDIT_ACTION, HIDDEN)
        sharded.jit_sharded_update(graph, method, config, dist.make_mesh(1, 2, 4))[0].lower(state, frozen, batch)
        summary["tensor_error"] = None
    except ValueError as error:
        summary["tensor_error"] = str(error)
    summary["micro_rows"] = AUDIT_ROWS // (config.num_minibatches * config.accumulation_steps)
    weights = set()
    for x in jax.tree.leaves(frozen.base):
        shape = tuple(np.shape(x))
        weights.add(_dims(shape[1:] if len(shape) == 3 else shape))
    summary["weight_shapes"] = sorted(weights)
    trainable = [np.shape(x) for x in jax.tree.leaves(params)]
    summary["trainable_shapes"] = sorted({_dims(s) for s in trainable} | {_dims(s[1:]) for s in trainable})


def _stats_of(graph, frozen, params, rows, next_rows, method):
    from poad_jax.agent.experience import behaviour_statistics

    return behaviour_statistics(graph, frozen, params, params["head"], rows, next_rows, method=method,
                                temperature=1.0, critic_kind="head")


def _updates(summary: dict, saved: dict, mesh, method, config, arrays, next_arrays) -> None:
    """One update on the mesh (hook on; remat full and none) against one device with the same row groups."""
    import jax

    from poad_jax import parallel as dist
    from poad_jax.agent import sharded_update as sharded
    from poad_jax.agent.experience import make_token_batch
    from poad_jax.agent.learner import build_update, init_train_state

    def record(name, state, metrics, params):
        summary["metrics"][name] = {k: float(v) for k, v in metrics.items()}
        for path, leaf in jax.tree_util.tree_flatten_with_path(state.params)[0]:
            saved[f"{name}/{dist.sharding.path_string(path)}"] = np.asarray(leaf)
        summary["param_change"][name] = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                                            for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(params)))

    for name, remat in (("fsdp8", "full"), ("fsdp8_remat_none", "none")):
        graph, frozen, params = _policy(remat=remat)
        batch = make_token_batch(arrays, _stats_of(graph, frozen, params, arrays, next_arrays, method))
        single, _ = build_update(graph, method, config, row_groups=FSDP)
        state = init_train_state(_copy(params), config, jax.random.key(0))
        record(f"single_{name}", *jax.jit(single, donate_argnums=(0,))(state, frozen, batch), params)
        fr, pr = sharded.shard_policy(frozen, _copy(params), mesh)
        update, _ = sharded.jit_sharded_update(graph, method, config, mesh)
        state = sharded.shard_train_state(init_train_state(_copy(pr), config, jax.random.key(0)), mesh)
        record(name, *update(state, fr, dist.shard_batch(batch, mesh)), params)


def _first_ratios(summary: dict, mesh, method, config, arrays, next_arrays) -> None:
    """The first ratio: behaviour statistics (with and without the hook) against the learner's log-probs."""
    import jax

    from poad_jax import parallel as dist
    from poad_jax.agent import sharded_update as sharded
    from poad_jax.agent.experience import make_token_batch
    from poad_jax.agent.learner import policy_outputs
    from poad_jax.agent.sharded_update import constrained_graph

    graph, frozen, params = _policy()
    fr, pr = sharded.shard_policy(frozen, _copy(params), mesh)
    hooked = constrained_graph(graph, mesh)
    rows, next_rows = dist.shard_batch(arrays, mesh), dist.shard_batch(next_arrays, mesh)
    learner_logprobs = jax.jit(lambda fr, pr, batch: policy_outputs(hooked, fr, pr, batch, method, config))
    for name, stats_graph in (("hook", hooked), ("no_hook_stats", graph)):
        batch = dist.shard_batch(make_token_batch(arrays, _stats_of(stats_graph, fr, pr, rows, next_rows, method)),
                                 mesh)
        logprobs, _, _, mask = learner_logprobs(fr, pr, batch)
        ratio = np.exp(np.asarray(logprobs) - np.asarray(batch.old_logprobs))[np.asarray(mask)]
        summary["first_ratio"][name] = {"min": float(ratio.min()), "max": float(ratio.max()), "count": int(ratio.size)}


def _hook_on_odd_rows(mesh) -> dict:
    """Whether the hook pins rows it can split (16) and passes those it cannot (6)."""
    import jax
    import jax.numpy as jnp

    from poad_jax.parallel.sharding import activation_constraint

    constrain = activation_constraint(mesh)
    found = {}
    for rows_count in (6, 16):
        text = jax.jit(lambda x: constrain(x) * 2).lower(jnp.zeros((rows_count, 3, HIDDEN))).as_text()
        pinned = "sharding_constraint" in text or "mhlo.sharding" in text or "sdy.sharding_constraint" in text
        found[f"rows_{rows_count}"] = "constrained" if pinned else "unconstrained"
    return found


def _worker(out: pathlib.Path) -> None:
    import jax

    from poad_jax import parallel as dist
    from poad_jax.agent.methods import make_method
    from poad_jax.models.tiny import WordTokenizer
    from poad_jax.run.config import learner_config
    from test_sharding import _synthetic_rollout

    jax.config.update("jax_default_matmul_precision", "highest")
    assert jax.device_count() == FSDP, jax.devices()
    mesh = dist.make_mesh(1, FSDP, 1)
    method = make_method("poad", 0.95)
    config = learner_config(gamma=0.95, temperature=1.0, num_minibatches=2, accumulation_steps=2, epochs=2,
                            actor_lr=1e-2, critic_lr=1e-2, target_kl=float("inf"))
    summary: dict = {"collectives": {}, "metrics": {}, "param_change": {}, "first_ratio": {}}
    saved: dict[str, np.ndarray] = {}
    _audits(summary, mesh, method, config)
    arrays, next_arrays = _synthetic_rollout(WordTokenizer().vocab_size)
    _updates(summary, saved, mesh, method, config, arrays, next_arrays)
    _first_ratios(summary, mesh, method, config, arrays, next_arrays)
    summary["hook_on_odd_rows"] = _hook_on_odd_rows(mesh)
    (out / "summary.json").write_text(json.dumps(summary))
    np.savez(out / "arrays.npz", **saved)


if __name__ == "__main__":
    _worker(pathlib.Path(sys.argv[1]))
