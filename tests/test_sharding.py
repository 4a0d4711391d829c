"""poad_jax on a device mesh (`poad_jax.parallel`), against one device.

The mesh tests need 8 devices: this file runs itself as a subprocess with
`--xla_force_host_platform_device_count=8` (the device count is fixed when
JAX's backend starts, and the rest of the suite keeps one device).  The
subprocess computes everything once per layout and writes it to a file;
each test below reads what it proves from that file.

Layouts: meshes (data, fsdp, tensor) = (8,1,1) pure data parallelism,
(1,8,1) pure FSDP, (2,2,2) all three axes; each against one device running
the same update with the same row groups (minibatches take chunk m of every
group's permutation, `learner.minibatch_order`), so both runs train on
the same rows in the same order.

Tiny model: hidden 40 (no trainable array shares a shape with a frozen base
weight or its fsdp shard, which the collective audit relies on), 2 layers,
float32 with matmul precision "highest".
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys
from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import AbstractMesh, PartitionSpec as P

from poad_jax import parallel as dist
from poad_jax.agent import sharded_update as sharded
from poad_jax.run import config as config_lib

# One xdist worker runs every test of this module (`--dist loadgroup`, scripts/test.sh): its module
# fixture, minutes of training or of subprocesses, is then set up once per suite, not once per worker.
pytestmark = [pytest.mark.xdist_group("sharding"), pytest.mark.long]

REPO = pathlib.Path(__file__).resolve().parents[1]
MESHES = {"dp8": (8, 1, 1), "fsdp8": (1, 8, 1), "mixed222": (2, 2, 2)}
HIDDEN, HEAD_SIZES, THREADS, STEPS, PROMPT, ACTION = 40, (48,), 8, 4, 10, 6


# ---------------------------------------------------------------------------
# Rules and meshes: pure functions, one device.


def test_default_mesh_block_is_one_device_and_makes_no_mesh():
    block = config_lib.default_config().mesh
    assert dict(block) == {"data": 1, "fsdp": 1, "tensor": 1}
    assert dist.mesh_from_config(block) is None
    assert dist.batch_shards(None) == 1


def test_mesh_shape_resolves_minus_one_and_rejects_mistakes():
    assert dist.mesh_shape({"data": -1, "fsdp": 2, "tensor": 1}, 8) == (4, 2, 1)
    with pytest.raises(ValueError, match="needs 16 devices"):
        dist.mesh_shape({"data": 8, "fsdp": 2, "tensor": 1}, 8)
    with pytest.raises(ValueError, match="at most one mesh axis"):
        dist.mesh_shape({"data": -1, "fsdp": -1, "tensor": 1}, 8)
    with pytest.raises(ValueError, match="positive"):
        dist.mesh_shape({"data": 0, "fsdp": 1, "tensor": 1}, 8)


def _tiny_state():
    from flax import nnx

    from poad_jax.run.config import learner_config
    from poad_jax.agent.learner import init_train_state
    from poad_jax.models.tiny import tiny_random_model
    from poad_jax.core.critic_config import CriticConfig
    from poad_jax.core.policy import ValueHead, split_policy

    model, _ = tiny_random_model(hidden_size=HIDDEN)
    head = ValueHead(HIDDEN, CriticConfig(hidden_sizes=HEAD_SIZES), rngs=nnx.Rngs(1))
    _, frozen, params = split_policy(model, head)
    state = init_train_state(params, learner_config(), jax.random.key(0))
    return frozen, state


def test_every_leaf_gets_a_spec_and_optimiser_states_follow_their_parameter():
    frozen, state = _tiny_state()
    mesh = AbstractMesh((2, 2, 2), dist.MESH_AXES)
    rules = dist.train_rules("follow_base")
    specs = dist.partition_specs((state, frozen), rules, mesh)
    flat = {dist.sharding.path_string(p): s for p, s in
            jax.tree_util.tree_flatten_with_path(specs, is_leaf=lambda x: isinstance(x, P))[0]}
    assert len(flat) == len(jax.tree.leaves((state, frozen)))
    assert flat["1/base/layers/weights/q_proj/value"] == P(None, "fsdp", "tensor")
    assert flat["1/base/layers/weights/down_proj/value"] == P(None, "tensor", "fsdp")
    # vocabulary 119 is not divisible by tensor = 2: that dimension stays whole
    assert flat["1/base/embed/value"] == P(None, "fsdp")
    lora_a = flat["0/params/actor/layers/lora_a/q_proj/value"]
    assert lora_a == P(None, "fsdp")
    assert flat["0/actor_opt_state/1/0/mu/layers/lora_a/q_proj/value"] == lora_a
    assert flat["0/actor_opt_state/1/0/nu/layers/lora_a/q_proj/value"] == lora_a
    assert flat["0/params/head/hidden_layers/0/kernel/value"] == P()
    assert flat["0/rng"] == P() and flat["0/update_step"] == P()
    replicated_lora = dist.partition_specs(state, dist.train_rules(), mesh)
    assert all(s == P() for s in jax.tree.leaves(replicated_lora.params["actor"], is_leaf=lambda x: isinstance(x, P)))


def test_sample_layout_has_no_fsdp_and_train_layout_does():
    frozen, _ = _tiny_state()
    mesh = AbstractMesh((1, 4, 2), dist.MESH_AXES)
    assert dist.sharding.specs_mention(dist.partition_specs(frozen, dist.train_rules(), mesh), "fsdp")
    sample = dist.partition_specs(frozen, dist.sample_rules(), mesh)
    assert not dist.sharding.specs_mention(sample, "fsdp")
    assert dist.sharding.specs_mention(sample, "tensor")


def test_batch_rows_must_hold_whole_threads():
    mesh = AbstractMesh((2, 2, 1), dist.MESH_AXES)
    rows = {"tokens": np.zeros((12, 3)), "bootstrap_value": np.zeros((6,))}
    with pytest.raises(ValueError, match="bootstrap_value has 6 rows, not divisible by data x fsdp = 4"):
        dist.batch_shardings(rows, mesh)
    good = dist.batch_shardings({"tokens": np.zeros((16, 3)), "b": np.zeros((4,))}, mesh)
    assert good["tokens"].spec == P(("data", "fsdp"))


# ---------------------------------------------------------------------------
# The 8-device subprocess and what it proves.


def run_on_host_devices(script: str, out: pathlib.Path, devices: int = 8) -> tuple[dict, dict]:
    """Runs `python script out` in a fresh process with `devices` host CPU devices (the count is
    fixed when JAX starts); returns what it wrote: (summary.json, arrays.npz)."""
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, script, str(out)], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / "summary.json").read_text()), dict(np.load(out / "arrays.npz"))


@pytest.fixture(scope="module")
def mesh_results(tmp_path_factory):
    return run_on_host_devices(__file__, tmp_path_factory.mktemp("sharding"))


def assert_update_close(got: dict, ref: dict, params: dict) -> None:
    """A sharded update against one device: every metric within 1e-6 absolute plus 1e-5
    relative, every parameter (`params`: name -> (mesh, one device), LoRA B among them)
    within 1e-5 absolute."""
    assert set(got) == set(ref)
    for key in ref:
        assert abs(got[key] - ref[key]) <= 1e-6 + 1e-5 * abs(ref[key]), (key, got[key], ref[key])
    assert any("lora_b" in n for n in params)
    for name, (got_p, want_p) in params.items():
        np.testing.assert_allclose(got_p, want_p, rtol=0, atol=1e-5, err_msg=name)

def _pair(arrays, layout, name):
    """(mesh result, one-device result) of `name`; an update's reference ran
    with the mesh's row groups (data x fsdp)."""
    groups = MESHES[layout][0] * MESHES[layout][1]
    reference = f"single{groups}" if name.startswith("params/") else "single"
    return arrays[f"{layout}/{name}"], arrays[f"{reference}/{name}"]


def _max_rel(got, want):
    return float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-3)))


def _scaled_error(got, want) -> float:
    """max |got - want| / max |want|: the error in units of the array's scale."""
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))


@pytest.mark.parametrize("layout", list(MESHES))
def test_forward_logits_match_one_device(mesh_results, layout):
    """Logits of the action columns `[N, A, V]`.  Not bit-exact even under
    pure data parallelism: XLA:CPU blocks a matmul differently for 4 rows
    than for 32, so a row's f32 sums run in another order; FSDP and tensor
    parallelism also split contractions over devices.  Measured (2026-11-23):
    3e-7 of the logits' scale on every mesh, a few float32 roundings.
    Bound: 2e-6 of the scale."""
    _, arrays = mesh_results
    got, want = _pair(arrays, layout, "logits")
    assert got.shape == want.shape and np.all(np.isfinite(got))
    assert _scaled_error(got, want) < 2e-6


@pytest.mark.parametrize("layout", list(MESHES))
def test_learner_gradients_match_one_device(mesh_results, layout):
    """Gradients of sum(log pi) + sum(V) w.r.t. every LoRA and head array:
    per-device sums over rows, all-reduced (another order of f32
    additions) on top of the forward's differences.  Bound per array: 1e-5
    of its scale."""
    _, arrays = mesh_results
    names = sorted(k.split("/", 1)[1] for k in arrays if k.startswith(f"{layout}/grad/"))
    assert any("lora_a" in n for n in names) and any("head" in n for n in names)
    for name in names:
        got, want = _pair(arrays, layout, name)
        assert np.max(np.abs(want)) > 0, name
        assert _scaled_error(got, want) < 1e-5, name


@pytest.mark.parametrize("layout", list(MESHES))
def test_one_ppo_update_matches_one_device(mesh_results, layout):
    """One full update (2 epochs x 2 minibatches x 2 micro-batches, lr 1e-2,
    target_kl = inf so no minibatch is skipped by a rounding difference),
    against one device with the same row groups: every metric within 1e-6
    absolute plus 1e-5 relative, every parameter within 1e-5 absolute (the
    update moves them by 4e-2): the gradient differences above after four
    Adam steps (Adam's m / sqrt(v) is scale-free, so a relative gradient
    error becomes an absolute step error of lr times that)."""
    summary, arrays = mesh_results
    names = sorted(k.split("/", 1)[1] for k in arrays if k.startswith(f"{layout}/params/"))
    assert_update_close(summary["metrics"][layout], summary["metrics"][f"single{MESHES[layout][0] * MESHES[layout][1]}"],
                        {name: _pair(arrays, layout, name) for name in names})
    assert summary["param_change"][layout] > 1e-2  # the update moved the parameters


@pytest.mark.parametrize("layout", list(MESHES))
def test_first_ppo_ratio_is_exactly_one_on_the_mesh(mesh_results, layout):
    """The learner's log-probs (compiled on the mesh) equal the behaviour
    statistics' (compiled on the same mesh) bit for bit: the first PPO ratio
    is exactly 1 on every valid token.  The behaviour statistics themselves
    match one device within 2e-6 of their scale, as the logits do."""
    summary, arrays = mesh_results
    ratio = summary["first_ratio"][layout]
    assert ratio["count"] > 0 and ratio["min"] == ratio["max"] == 1.0
    for name in ("old_logprobs", "old_values", "features", "bootstrap_value"):
        got, want = _pair(arrays, layout, f"stats/{name}")
        assert np.max(np.abs(want)) > 0, name
        assert _scaled_error(got, want) < 2e-6, name


def _dims(shape) -> tuple[int, ...]:
    """A shape as its sorted dimensions (XLA may transpose an array's layout)."""
    return tuple(sorted(shape))


def _row_moving(collectives, trainable) -> list:
    """Collectives that are not all-reduces of a trainable array's shape or
    of a handful of scalars: what moving batch rows between devices adds."""
    return [(kind, shapes) for kind, shapes in collectives
            if kind != "all-reduce" or any(_dims(s) not in trainable and np.prod(s) > 8 for s in shapes)]


def test_data_parallel_update_moves_no_rows_between_devices(mesh_results):
    """Under pure data parallelism the compiled update's only collectives are
    all-reduces of gradients (trainable shapes) and of loss statistics
    (scalars): no all-gather, all-to-all, permute or batch-shaped reduction,
    i.e. every minibatch and micro-batch is taken from the rows a device
    holds.  The same update with one global permutation (row_groups=1,
    today's single-device order) moves rows (XLA gathers them with a
    batch-shaped all-reduce): the audit trips on it."""
    summary, _ = mesh_results
    trainable = {_dims(s) for s in summary["trainable_shapes"]}
    assert summary["collectives"]["dp8"]
    assert _row_moving(summary["collectives"]["dp8"], trainable) == []
    assert _row_moving(summary["collectives"]["dp8_global_permutation"], trainable)


def _base_shapes(summary):
    """Shapes (sorted dimensions) a gradient of a frozen base weight would
    have in the HLO: the stacked `[L, in, out]`, one layer's `[in, out]`, and
    their fsdp shards."""
    shapes = set()
    for shape, spec in summary["base_shapes"]:
        variants = [tuple(shape)]
        for dim, axes in enumerate(spec):
            if axes == "fsdp":
                split = list(shape)
                split[dim] //= 8
                variants.append(tuple(split))
        for v in variants:
            shapes.add(_dims(v))
            if len(v) == 3:
                shapes.add(_dims(v[1:]))
    return shapes


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_fsdp_update_forms_no_gradient_of_the_frozen_base(mesh_results, precision):
    """Under FSDP no matmul of the compiled update yields an array shaped
    like a frozen base weight (stacked, one layer, or its fsdp shard), and no
    all-reduce or reduce-scatter carries one: no gradient of the base is
    formed or reduced; only LoRA and head gradients are.  Checked for float32
    matmuls and for bfloat16 operands (`mixed_einsum`, whose custom VJP
    computes both operands' cotangents: XLA must drop the frozen one).  A
    gradient w.r.t. the base, compiled on the same mesh, trips the audit."""
    summary, _ = mesh_results
    base = _base_shapes(summary)
    trainable = {_dims(s) for s in summary["trainable_shapes"]}
    assert not base & trainable  # the audit can tell them apart
    reductions = [(kind, shapes) for kind, shapes in summary["collectives"][f"fsdp8_{precision}"]
                  if kind in ("all-reduce", "reduce-scatter")]
    assert reductions and summary["dots"][f"fsdp8_{precision}"]
    for kind, shapes in reductions:
        assert not base & {_dims(s) for s in shapes}, (kind, shapes)
    assert not base & {_dims(s) for s in summary["dots"][f"fsdp8_{precision}"]}
    assert base & {_dims(s) for s in summary["dots"]["fsdp8_base_gradient"]}


def test_checkpoint_moves_between_meshes_bit_exactly(mesh_results):
    """An Orbax checkpoint of the sharded train state (LoRA following the
    base, on (2,2,2)) restores on one device and on (8,1,1); one saved from
    one device restores on (1,8,1).  Restore targets carry the live
    template's shardings (`RunCheckpointer.restore`), so each device reads
    its own slices: every value is bitwise equal and lands on the target's
    sharding."""
    summary, _ = mesh_results
    assert summary["checkpoint"] == {
        "222_to_1": {"equal": True, "on_target": True},
        "222_to_dp8": {"equal": True, "on_target": True},
        "1_to_fsdp8": {"equal": True, "on_target": True},
    }


def test_compiler_argument_memory_is_the_sum_of_shards_and_the_base_share_shrinks(mesh_results):
    """`memory_analysis()` of the compiled update on meshes (1,f,1): its
    per-device argument bytes equal the sum of every argument's shard bytes
    (so the sharding is what the compiler allocates), and the frozen base's
    share per device is 1/f of the whole (up to dimensions f does not divide)."""
    summary, _ = mesh_results
    table = summary["memory"]
    whole = table["1"]["base_bytes"]
    for fsdp in ("1", "2", "8"):
        row = table[fsdp]
        assert row["argument_bytes"] == row["expected_argument_bytes"], row
        assert row["base_bytes"] <= whole / int(fsdp) * 1.05 + 4096, row
    assert table["8"]["base_bytes"] < table["2"]["base_bytes"] < whole


# ---------------------------------------------------------------------------
# The worker (runs with 8 host devices).


def _synthetic_rollout(vocab: int, seed: int = 0):
    """A token-level rollout of THREADS x STEPS rows: random prompts and
    actions, half of the rows trie-constrained (the action token among 3
    allowed), random rewards and dones."""
    from poad_jax.core.token_batch import pack_rows

    rng = np.random.default_rng(seed)
    rows = THREADS * STEPS
    prompts = [list(rng.integers(5, vocab, rng.integers(3, PROMPT + 1))) for _ in range(rows)]
    actions = [list(rng.integers(5, vocab, rng.integers(1, ACTION + 1))) for _ in range(rows)]
    arrays = pack_rows(prompts, actions, PROMPT, ACTION, 0)
    allowed = rng.integers(5, vocab, (rows, ACTION, 3)).astype(np.int32)
    allowed[..., 0] = arrays["tokens"][:, PROMPT:]
    constrained = (rng.random((rows, 1, 1)) < 0.5) & arrays["action_mask"][..., None]
    arrays.update(
        allowed_tokens=allowed, allowed_mask=np.broadcast_to(constrained, allowed.shape).copy(),
        rewards=rng.normal(size=rows).astype(np.float32), dones=rng.random(rows) < 0.3,
    )
    next_arrays = pack_rows([list(rng.integers(5, vocab, 4)) for _ in range(THREADS)], [[0]] * THREADS,
                            PROMPT, 1, 0)
    return arrays, next_arrays


def dot_shapes(hlo_text: str) -> list[list[int]]:
    """Result shapes of every matmul (`dot`) in a compiled module's text."""
    return [[int(d) for d in m.group(1).split(",") if d]
            for m in re.finditer(r"= \w+\[([\d,]*)\]\S* dot\(", hlo_text)]


def collectives(hlo_text: str) -> list[tuple[str, list[list[int]]]]:
    """(kind, result shapes) of every collective in a compiled module's text."""
    found = []
    pattern = r"= (\(?[^=]*?\)?) (all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)(-start)?\("
    # XLA writes `/*index=5*/` inside tuples of six or more results: its `=` would hide those collectives.
    for line in re.sub(r"/\*index=\d+\*/", "", hlo_text).splitlines():
        match = re.search(pattern, line)
        if match:
            shapes = [[int(d) for d in s.split(",") if d] for s in re.findall(r"\[([\d,]*)\]", match.group(1))]
            found.append((match.group(2), shapes))
    return found


@dataclasses.dataclass
class _Run:
    """What the worker's parts share: the tiny policy (LoRA B and the value head's output perturbed away
    from zero, so adapters and values take part in every comparison), the method, the learner config,
    the rollout, and what the parts record (`saved` arrays, the `summary`)."""

    graph: Any
    frozen: Any
    params: Any
    method: Any
    config: Any
    arrays: dict
    next_arrays: dict
    saved: dict = dataclasses.field(default_factory=dict)
    summary: dict = dataclasses.field(default_factory=lambda: {
        "metrics": {}, "first_ratio": {}, "collectives": {}, "dots": {}, "param_change": {}})
    grads_fn: Any = None


def _copy(tree):
    """A copy of every array (updates donate their state)."""
    import jax.numpy as jnp

    return jax.tree.map(jnp.copy, tree)


def _worker_run() -> _Run:
    from flax import nnx

    from poad_jax.agent.methods import make_method
    from poad_jax.core.critic_config import CriticConfig
    from poad_jax.core.policy import ValueHead, split_policy
    from poad_jax.models.tiny import tiny_random_model
    from poad_jax.run.config import learner_config

    model, _ = tiny_random_model(hidden_size=HIDDEN)
    head = ValueHead(HIDDEN, CriticConfig(hidden_sizes=HEAD_SIZES), rngs=nnx.Rngs(1))
    graph, frozen, params = split_policy(model, head)
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(7), len(leaves))
    params = jax.tree.unflatten(treedef, [x + 0.05 * jax.random.normal(k, x.shape, x.dtype)
                                          for x, k in zip(leaves, keys)])
    arrays, next_arrays = _synthetic_rollout(model.config.vocab_size)
    config = learner_config(gamma=0.95, temperature=1.0, num_minibatches=2, accumulation_steps=2, epochs=2,
                            actor_lr=1e-2, critic_lr=1e-2, target_kl=float("inf"))
    run = _Run(graph, frozen, params, make_method("poad", 0.95), config, arrays, next_arrays)
    run.grads_fn = _grads_fn(run)
    return run


def _grads_fn(run: _Run):
    """Jitted (params, frozen, batch) -> gradients of sum(log pi) + sum(V); the learner's log-probs; the logits."""
    import jax.numpy as jnp

    from poad_jax.agent.learner import policy_outputs
    from poad_jax.core.policy import merge_model

    def action_logits(frozen, params, batch):
        model = merge_model(run.graph, frozen, params["actor"])
        hidden = model(batch.tokens, batch.positions, batch.key_mask, use_lora=True, return_logits=False).hidden
        return model.logits(hidden[:, PROMPT - 1:-1])

    @jax.jit
    def grads_fn(params, frozen, batch):
        def loss(params):
            logprobs, _, values, mask = policy_outputs(run.graph, frozen, params, batch, run.method, run.config)
            total = jnp.sum(jnp.where(mask, logprobs, 0.0)) + jnp.sum(jnp.where(mask, values, 0.0))
            return total, (logprobs, mask)
        grads, aux = jax.grad(loss, has_aux=True)(params)
        return grads, aux, action_logits(frozen, params, batch)

    return grads_fn


def _save_tree(run: _Run, prefix: str, tree) -> None:
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        run.saved[f"{prefix}/{dist.sharding.path_string(path)}"] = np.asarray(leaf)


def _forward_parts(run: _Run, name, fr, pr, rows, next_rows, mesh):
    """Logits, behaviour statistics, gradients and the first ratio; the batch."""
    from poad_jax.agent.experience import behaviour_statistics, make_token_batch

    stats = behaviour_statistics(run.graph, fr, pr, pr["head"], rows, next_rows, method=run.method,
                                 temperature=1.0, critic_kind="head")
    _save_tree(run, f"{name}/stats", stats)
    batch = make_token_batch(rows, stats)
    if mesh is not None:
        batch = dist.shard_batch(batch, mesh)
    grads, (logprobs, mask), logits = run.grads_fn(pr, fr, batch)
    run.saved[f"{name}/logits"] = np.asarray(logits)
    _save_tree(run, f"{name}/grad", grads)
    ratio = np.exp(np.asarray(logprobs) - np.asarray(batch.old_logprobs))[np.asarray(mask)]
    run.summary["first_ratio"][name] = {"min": float(ratio.min()), "max": float(ratio.max()), "count": int(ratio.size)}
    return batch


def _record_update(run: _Run, name, state, metrics) -> None:
    run.summary["metrics"][name] = {k: float(v) for k, v in metrics.items()}
    _save_tree(run, f"{name}/params", state.params)
    run.summary["param_change"][name] = max(
        float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in
        zip(jax.tree.leaves(state.params), jax.tree.leaves(run.params)))


def _updates_on_one_device_and_meshes(run: _Run):
    """Forward, gradients, first ratio and one update on one device (row groups 8 and 4) and on each mesh;
    returns the last batch (its shapes serve the audits)."""
    from poad_jax.agent.learner import build_update, init_train_state

    batch = _forward_parts(run, "single", run.frozen, run.params, run.arrays, run.next_arrays, None)
    for groups in (8, 4):  # (8,1,1) and (1,8,1) hold rows in 8 groups; (2,2,2) in 4
        update, _ = build_update(run.graph, run.method, run.config, row_groups=groups)
        state = init_train_state(_copy(run.params), run.config, jax.random.key(0))
        _record_update(run, f"single{groups}", *jax.jit(update, donate_argnums=(0,))(state, run.frozen, batch))
    for name, shape in MESHES.items():
        mesh = dist.make_mesh(*shape)
        fr, pr = sharded.shard_policy(run.frozen, _copy(run.params), mesh)
        batch = _forward_parts(run, name, fr, pr, dist.shard_batch(run.arrays, mesh),
                               dist.shard_batch(run.next_arrays, mesh), mesh)
        update, _ = sharded.jit_sharded_update(run.graph, run.method, run.config, mesh)
        state = sharded.shard_train_state(init_train_state(_copy(pr), run.config, jax.random.key(0)), mesh)
        compiled = update.lower(state, fr, batch).compile()
        run.summary["collectives"][name] = collectives(compiled.as_text())
        run.summary["dots"][name] = dot_shapes(compiled.as_text())
        _record_update(run, name, *compiled(state, fr, batch))
    return batch


def _abstract_args(mesh, state, frozen, batch, rules=None):
    rules = dist.train_rules() if rules is None else rules
    return (dist.abstract_like(state, dist.tree_shardings(state, rules, mesh)),
            dist.abstract_like(frozen, dist.tree_shardings(frozen, rules, mesh)),
            dist.abstract_like(batch, dist.batch_shardings(batch, mesh)))


def _collective_audits(run: _Run, batch) -> None:
    """Collectives and matmul shapes of updates compiled from shapes alone: one global permutation on
    (8,1,1), bfloat16 operands on (1,8,1), and a gradient of the base (what the audit must catch)."""
    import jax.numpy as jnp
    from flax import nnx

    from poad_jax.agent.learner import build_update, init_train_state, policy_outputs
    from poad_jax.core.critic_config import CriticConfig
    from poad_jax.core.policy import ValueHead, split_policy
    from poad_jax.models.tiny import tiny_random_model

    summary, graph, method, config = run.summary, run.graph, run.method, run.config
    state = jax.eval_shape(lambda p: init_train_state(p, config, jax.random.key(0)), run.params)
    dp = dist.make_mesh(8, 1, 1)
    args = _abstract_args(dp, state, run.frozen, batch)
    global_perm, _ = build_update(graph, method, config, row_groups=1)
    lowered = jax.jit(global_perm, in_shardings=jax.tree.map(lambda a: a.sharding, args)).lower(*args)
    summary["collectives"]["dp8_global_permutation"] = collectives(lowered.compile().as_text())
    fsdp = dist.make_mesh(1, 8, 1)
    summary["collectives"]["fsdp8_float32"] = summary["collectives"]["fsdp8"]
    summary["dots"]["fsdp8_float32"] = summary["dots"]["fsdp8"]
    model_bf16, _ = tiny_random_model(hidden_size=HIDDEN, matmul_dtype=jnp.bfloat16)
    head_bf16 = ValueHead(HIDDEN, CriticConfig(hidden_sizes=HEAD_SIZES), rngs=nnx.Rngs(1))
    graph_bf16, frozen_bf16, _ = split_policy(model_bf16, head_bf16)
    update, _ = sharded.jit_sharded_update(graph_bf16, method, config, fsdp)
    lowered = update.lower(*_abstract_args(fsdp, state, frozen_bf16, batch))
    text = lowered.compile().as_text()
    summary["collectives"]["fsdp8_bfloat16"], summary["dots"]["fsdp8_bfloat16"] = collectives(text), dot_shapes(text)

    @jax.jit
    def base_gradient(frozen, params, batch):  # what the audit must catch: a gradient of the base
        def loss(frozen):
            logprobs, _, _, mask = policy_outputs(graph, frozen, params, batch, method, config)
            return jnp.sum(jnp.where(mask, logprobs, 0.0))
        return jax.grad(loss)(frozen)

    abstract_state, abstract_frozen, abstract_batch = _abstract_args(fsdp, state, run.frozen, batch)
    lowered = base_gradient.lower(abstract_frozen, abstract_state.params, abstract_batch)
    text = lowered.compile().as_text()
    summary["collectives"]["fsdp8_base_gradient"], summary["dots"]["fsdp8_base_gradient"] = (
        collectives(text), dot_shapes(text))
    base_specs = dist.partition_specs(run.frozen.base, dist.train_rules(), fsdp)
    summary["base_shapes"] = [
        (list(np.shape(x)), list(s)) for x, s in zip(jax.tree.leaves(run.frozen.base),
                                                      jax.tree.leaves(base_specs, is_leaf=lambda x: isinstance(x, P)))
        if np.ndim(x) >= 2]
    trainable = [np.shape(x) for x in jax.tree.leaves(run.params)]
    summary["trainable_shapes"] = [list(s) for s in trainable] + [list(s[1:]) for s in trainable if len(s) == 3]


def _checkpoint_case(run: _Run, out: pathlib.Path, name, save_mesh, restore_mesh, rules) -> dict:
    """A train state saved (sharded on `save_mesh`, or one device) and restored onto `restore_mesh`:
    whether every value is bitwise equal, and whether each lands on the target's sharding."""
    import jax.numpy as jnp

    from poad_jax.agent.learner import init_train_state
    from poad_jax.run import checkpoint as checkpoint_lib

    state = init_train_state(_copy(run.params), run.config, jax.random.key(3))
    state = jax.tree.map(lambda x: x + 0.5 if jnp.issubdtype(x.dtype, jnp.floating) else x, state)
    if save_mesh is not None:
        state = sharded.shard_train_state(state, save_mesh, rules)
    expected = jax.device_get(jax.tree.map(
        lambda x: jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x, state))
    workdir = out / f"ckpt_{name}"
    writer = checkpoint_lib.RunCheckpointer(workdir)
    writer.save(1, state, {"update": 1})
    writer.close()
    template = init_train_state(_copy(run.params), run.config, jax.random.key(9))
    if restore_mesh is not None:
        template = sharded.shard_train_state(template, restore_mesh, rules)
    reader = checkpoint_lib.RunCheckpointer(workdir, create=False)
    restored, _ = reader.restore(template)
    reader.close()
    got = jax.tree.map(
        lambda x: jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x, restored)
    equal = all(np.array_equal(np.asarray(a), b) for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)))
    on_target = all(a.sharding.is_equivalent_to(b.sharding, np.ndim(a)) for a, b in
                    zip(jax.tree.leaves(restored), jax.tree.leaves(template)))
    return {"equal": bool(equal), "on_target": bool(on_target)}


def _memory_table() -> dict:
    """Compiled per-device argument bytes of the update on (1, f, 1), f = 1, 2, 8."""
    from poad_jax.bench._update_memory import update_memory

    return {str(f): update_memory(
        dist.make_mesh(1, f, 1), hidden_size=256, intermediate_size=512, num_layers=2, vocab_size=1024,
        num_heads=4, num_kv_heads=4, rows=32, prompt_len=16, action_len=8, dtype="float32", head_sizes=(64,))
        for f in (1, 2, 8)}


def _worker(out: pathlib.Path) -> None:
    jax.config.update("jax_default_matmul_precision", "highest")
    assert jax.device_count() == 8, jax.devices()
    run = _worker_run()
    batch = _updates_on_one_device_and_meshes(run)
    _collective_audits(run, batch)
    follow = dist.train_rules("follow_base")
    run.summary["checkpoint"] = {
        "222_to_1": _checkpoint_case(run, out, "222_to_1", dist.make_mesh(2, 2, 2), None, follow),
        "222_to_dp8": _checkpoint_case(run, out, "222_to_dp8", dist.make_mesh(2, 2, 2), dist.make_mesh(8, 1, 1),
                                       follow),
        "1_to_fsdp8": _checkpoint_case(run, out, "1_to_fsdp8", None, dist.make_mesh(1, 8, 1), follow),
    }
    run.summary["memory"] = _memory_table()
    (out / "summary.json").write_text(json.dumps(run.summary))
    np.savez(out / "arrays.npz", **run.saved)


if __name__ == "__main__":
    _worker(pathlib.Path(sys.argv[1]))
