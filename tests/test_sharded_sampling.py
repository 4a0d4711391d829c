"""The sampler on a device mesh (`Sampler(model, mesh=...)`), against one device.

Like tests/test_sharding.py, the mesh tests need 8 devices: this file runs
itself as a subprocess with `--xla_force_host_platform_device_count=8`,
which computes everything once and writes it to a file; each test reads
what it proves from that file.  Meshes (data, fsdp, tensor) = (8,1,1),
(1,8,1), (2,2,2) (`test_sharding.MESHES`), each against one device.

Tiny model: hidden 40, 2 layers, GQA 4/2 heads, float32 with matmul
precision "highest", LoRA B perturbed away from zero so adapters take part,
embeddings of std 0.1 (with `tiny_random_model`'s default 0.5 the
distributions are so peaked that another key changes no token, and "same
key, same tokens" would prove nothing).
Prompt counts (5 and 3) divide neither the one-device bucket nor the 8 row
shards evenly: the mesh pads with dummy rows (to 8), one device to its
bucket (8 and 4), so the rows also run in batches of different sizes.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import pathlib
import re
import sys
from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import AbstractMesh, PartitionSpec as P

from poad_jax import parallel as dist
from poad_jax.parallel.sampling_layout import CARRY_RULES, UNSTACKED_SAMPLE_RULES, SamplingLayout, padded_rows

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from test_sharding import MESHES, collectives, run_on_host_devices  # noqa: E402  (the sibling test's helpers)

# One xdist worker runs every test of this module (`--dist loadgroup`, scripts/test.sh): its module
# fixture, minutes of training or of subprocesses, is then set up once per suite, not once per worker.
pytestmark = [pytest.mark.xdist_group("sharded_sampling"), pytest.mark.long]

REPO = pathlib.Path(__file__).resolve().parents[1]
HIDDEN, NEW_TOKENS, BUCKETS, PROMPT_BUCKETS = 40, 12, (1, 2, 4, 8), (16,)
# The training layout of the per-layer copies (fsdp on the hidden dimension),
# for the tripwire: a sampler holding its base as the learner does.
UNSTACKED_TRAIN_RULES = (
    (r"^layers/\d+/(q_proj|k_proj|v_proj|gate_proj|up_proj)$", P("fsdp", "tensor")),
    (r"^layers/\d+/(o_proj|down_proj)$", P("tensor", "fsdp")),
    (r"^head$", P("fsdp", "tensor")),
)


# ---------------------------------------------------------------------------
# One device.


def test_rows_are_padded_to_whole_row_shards():
    """Dummy rows (which start done) fill the batch to a multiple of data x
    fsdp; the tensor axis does not split rows.  No mesh: unchanged."""
    assert padded_rows(3, None) == 3
    assert padded_rows(4, AbstractMesh((8, 1, 1), dist.MESH_AXES)) == 8
    assert padded_rows(9, AbstractMesh((2, 2, 2), dist.MESH_AXES)) == 12
    assert padded_rows(16, AbstractMesh((1, 8, 1), dist.MESH_AXES)) == 16


def test_sampling_layout_specs_have_no_fsdp_and_pin_the_cache_to_its_rows():
    mesh = AbstractMesh((2, 2, 2), dist.MESH_AXES)
    from poad_jax.models.decode import KVCache, UnstackedWeights
    from poad_jax.sampling.loop import DecodeCarry

    shapes = UnstackedWeights(({"q_proj": np.zeros((40, 40)), "down_proj": np.zeros((80, 40))},), np.zeros((40, 120)))
    specs = dist.partition_specs(shapes, UNSTACKED_SAMPLE_RULES, mesh)
    assert specs.layers[0] == {"q_proj": P(None, "tensor"), "down_proj": P("tensor")} and specs.head == P(None, "tensor")
    rows = np.zeros((8,))
    carry = DecodeCarry(KVCache(np.zeros((2, 8, 2, 24, 10)), np.zeros((2, 8, 2, 10, 24)), np.zeros(())),
                        np.zeros((8, 24)), rows, rows, np.zeros((8, 12)), np.zeros((8, 12)), rows, np.zeros(()), rows)
    specs = dist.partition_specs(carry, CARRY_RULES, mesh)
    assert specs.cache.k == specs.cache.v == P(None, ("data", "fsdp"), "tensor")
    assert specs.cache.index == specs.step == P()
    assert specs.tokens == specs.done == specs.key_mask == P(("data", "fsdp"))
    assert not dist.sharding.specs_mention(dist.partition_specs(shapes, UNSTACKED_SAMPLE_RULES, mesh), "fsdp")


def test_without_a_mesh_the_programs_hold_no_mesh(tmp_path):
    """`mesh=None` makes no sharding call: the lowered prefill and decode name
    no mesh axis (the same sampler on a one-device mesh does: it pins its
    carry).  Their text was also compared with the code before the mesh
    path existed: identical (docs/distributed.md)."""
    import jax.numpy as jnp

    from poad_jax.models.tiny import tiny_random_model
    from poad_jax.sampling import Sampler
    from poad_jax.sampling.loop import FreeSampling

    model, _ = tiny_random_model(hidden_size=HIDDEN)

    def programs(sampler):
        carry = sampler._start([[5, 6, 7]], 4)
        prefill = sampler._prefill.lower(*sampler._weights(), jnp.zeros((1, 16), jnp.int32), jnp.ones((1, 16), bool),
                                         jnp.int32(1), 20, 4).as_text()
        decode = sampler._decode.lower(*sampler._weights(), carry, jax.random.key(0),
                                       FreeSampling(1.0, 0, 1.0, ())).as_text()
        return prefill + decode

    assert sampler_axes(programs(Sampler(model, batch_buckets=(1,), prompt_buckets=(16,)))) == set()
    on_mesh = Sampler(model, batch_buckets=(1,), prompt_buckets=(16,), mesh=dist.make_mesh(1, 1, 1))
    assert sampler_axes(programs(on_mesh)) == {"data", "fsdp", "tensor"}


def sampler_axes(text: str) -> set[str]:
    """Mesh axis names a lowered program mentions."""
    return set(re.findall(r'"(data|fsdp|tensor)"', text))


# ---------------------------------------------------------------------------
# The 8-device subprocess and what it proves.


@pytest.fixture(scope="module")
def mesh_results(tmp_path_factory):
    return run_on_host_devices(__file__, tmp_path_factory.mktemp("sharded_sampling"))


CALLS = ("free", "nucleus", "free_new_lora", "constrained")


@pytest.mark.parametrize("layout", list(MESHES))
def test_sampled_tokens_are_those_of_one_device(mesh_results, layout):
    """Same RNG key -> the same tokens, finish reasons and chosen actions as
    one device: free sampling (T = 1), top-k 20 / top-p 0.9 at T = 0.7 with a
    stop token, trie-constrained choices among candidates, and free sampling
    again after `set_lora`.  Why they can agree: row b's key at step s is
    fold_in(fold_in(rng, b), s) with threefry partitionable (jax's default),
    so the noise does not depend on the sharding or the batch size; only a
    logit within rounding of a decision boundary could flip a token (another
    key changes 98 % of the free tokens and 63 % of the nucleus ones, so the
    agreement is not for lack of noise).  Log-probs: bound 1e-5 absolute;
    measured (2026-11-23, CPU) 4.8e-7 to 9.5e-7 on values near -4: not
    bit-exact (XLA:CPU blocks the matmuls of 1 row per device differently
    from 8, and (2,2,2) splits the o / down contractions over devices)."""
    summary, arrays = mesh_results
    for call in CALLS:
        got, want = arrays[f"{layout}/{call}/tokens"], arrays[f"single/{call}/tokens"]
        assert got.shape == want.shape and np.all(np.any(want > 0, axis=1)), call  # every row drew tokens
        np.testing.assert_array_equal(got, want, err_msg=call)
        np.testing.assert_allclose(arrays[f"{layout}/{call}/logprobs"], arrays[f"single/{call}/logprobs"],
                                   rtol=0, atol=1e-5, err_msg=call)
        assert summary["extra"][layout][call] == summary["extra"]["single"][call], call
    assert summary["lora_changed_tokens"]  # the new adapters are used (tokens differ from before)
    for call in ("free", "nucleus"):  # another key changes most tokens: agreement is not for lack of noise
        assert np.mean(arrays[f"other_key/{call}/tokens"] != arrays[f"single/{call}/tokens"]) > 0.3, call


@pytest.mark.parametrize("layout", list(MESHES))
def test_action_scores_are_those_of_one_device(mesh_results, layout):
    """TWOSOME scores (`score_actions_batch`, 3 prompts x 4 candidates, and
    `score_actions` of one prompt) on the mesh: sums of token log-probs
    within 1e-6 of their scale + 1e-5, probabilities within 1e-6.  Not
    bit-exact: measured up to 1.9e-6 absolute on sums near -17 (1e-7 of the
    scale), probabilities 1.5e-7: XLA:CPU blocks the matmuls differently for
    1 row per device than for 8 (as in test_sharding's forward test)."""
    _, arrays = mesh_results
    for name in ("batch", "one"):
        got, want = arrays[f"{layout}/score_{name}/sums"], arrays[f"single/score_{name}/sums"]
        assert np.max(np.abs(got - want)) <= 1e-6 * np.max(np.abs(want)) + 1e-5, name
        np.testing.assert_allclose(arrays[f"{layout}/score_{name}/probs"], arrays[f"single/score_{name}/probs"],
                                   rtol=0, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("layout", list(MESHES))
def test_base_is_laid_out_once_for_sampling(mesh_results, layout):
    """The sampler holds the base in the sampling layout (no array split over
    fsdp; on (2,2,2) the projections split over tensor), its per-layer
    copies in the matching layout, and LoRA replicated; `set_lora` moves
    only LoRA: the base and its copies are the same arrays afterwards, and
    nothing recompiles."""
    summary, _ = mesh_results
    found = summary["placement"][layout]
    assert not any("fsdp" in spec["axes"] for spec in found["base"].values())
    assert not any("fsdp" in spec["axes"] for spec in found["unstacked"].values())
    assert all(spec["whole"] for spec in found["lora"].values())
    split = MESHES[layout][2] > 1  # only a tensor axis splits weights
    assert found["base"]["layers/weights/q_proj/value"]["whole"] != split
    assert found["unstacked"]["layers/0/down_proj"]["whole"] != split
    if not split:
        assert all(spec["whole"] for spec in [*found["base"].values(), *found["unstacked"].values()])
    assert found["same_base_after_set_lora"] and found["compiles_after_set_lora"] == 0


def _is_local(audit, layout) -> bool:
    """Every collective of the compiled decode is the all(done) reduction
    (a scalar), or on a tensor axis the all-reduce of one token's partial
    activations of the device's own rows `[B / (data fsdp), 1, d]`."""
    rows = 8 // (MESHES[layout][0] * MESHES[layout][1])
    for kind, shapes in audit["collectives"]:
        if kind != "all-reduce":
            return False
        for shape in shapes:
            scalar = shape == []
            token = MESHES[layout][2] > 1 and len(shape) == 3 and shape[:2] == [rows, 1]
            if not (scalar or token):
                return False
    return True


def _moved_shapes(audit, shapes) -> list:
    """Collectives carrying an array of one of `shapes` (sorted dimensions)."""
    return [(kind, s) for kind, group in audit["collectives"] for s in group if tuple(sorted(s)) in shapes]


@pytest.mark.parametrize("rule", ["free", "trie"])
@pytest.mark.parametrize("layout", list(MESHES))
def test_decode_gathers_no_weight_and_moves_no_row(mesh_results, layout, rule):
    """HLO audit of the compiled decode loop (free and trie-constrained):
    no collective carries a base weight (stacked, one layer, or any shard of
    them) or a piece of the KV cache, and the only collectives are the
    all(done) test and, on a tensor axis, the Megatron all-reduce of one
    token's activations of the device's rows.  Tripwire: the same sampler
    on (1,8,1) with the base in the training layout (fsdp-split), and
    today's path before this change (a one-device sampler given
    training-layout weights), both communicate every token."""
    summary, _ = mesh_results
    audit = summary["audit"][f"{layout}/{rule}"]
    forbidden = {tuple(s) for s in summary["weight_shapes"]} | {tuple(s) for s in audit["cache_shapes"]}
    assert audit["collectives"], "the all(done) reduction must be found (the parser works)"
    assert _moved_shapes(audit, forbidden) == []
    assert _is_local(audit, layout), audit["collectives"]
    for tripwire in ("fsdp8_train_layout", "fsdp8_unsharded_sampler"):
        assert not _is_local(summary["audit"][f"{tripwire}/{rule}"], "fsdp8"), tripwire


@pytest.mark.parametrize("layout", list(MESHES))
def test_decode_carry_is_pinned_and_the_cache_never_relaid(mesh_results, layout):
    """The compiled decode takes and returns its carry with the layout's
    shardings (cache by rows, and by KV heads on a tensor axis; every `[B,
    ...]` buffer by rows), every carry output reuses its donated input
    buffer (the cache is updated in place across calls), and the whole
    cache's shape appears nowhere in the per-device program (it is never
    gathered, only its shard exists).  Tripwires: a layout that keeps the
    cache replicated (the full shape appears, gathered every token) and one
    that does not pin the carry (the prefill returns replicated token
    buffers, the loop re-lays them out, and donation fails for some)."""
    summary, _ = mesh_results
    audit = summary["audit"][f"{layout}/free"]
    assert audit["carry_in_pinned"] and audit["carry_out_pinned"]
    assert audit["aliased_outputs"] == audit["carry_leaves"]
    assert audit["cache_shard_in_loop"] and not audit["whole_cache_in_program"]
    assert summary["audit"]["fsdp8_cache_replicated/free"]["whole_cache_in_program"]
    assert summary["audit"]["fsdp8_cache_replicated/free"]["aliased_outputs"] < audit["carry_leaves"]
    unpinned = summary["audit"]["fsdp8_unpinned/free"]
    assert not (unpinned["carry_in_pinned"] and unpinned["carry_out_pinned"])
    assert unpinned["aliased_outputs"] < audit["carry_leaves"]


# ---------------------------------------------------------------------------
# The worker (runs with 8 host devices).


def _weight_shapes(sampler) -> set[tuple[int, ...]]:
    """Sorted dimensions of every base weight matrix (stacked `[L, in, out]`,
    one layer's, the per-layer copies, the output layer) and of every shard
    of them a mesh of 8 devices could hold (any dimension divided by 2, 4
    or 8): what a gathered or reduced weight would look like in the HLO."""
    shapes = set()
    for x in jax.tree.leaves((sampler._base, sampler.unstacked)):
        if np.ndim(x) < 2:
            continue
        for shape in [tuple(x.shape)] + ([tuple(x.shape[1:])] if x.ndim == 3 else []):
            choices = [[d] + [d // k for k in (2, 4, 8) if d % k == 0] for d in shape]
            shapes |= {tuple(sorted(v)) for v in itertools.product(*choices)}
    return shapes


@dataclasses.dataclass
class _Case:
    """What the worker's parts share: the tiny model (LoRA B perturbed), the prompts and candidates, the
    sampling configs, the new adapters for `set_lora`, and what the parts record."""

    model: Any
    prompts: list
    few: list
    candidates: list
    free: Any
    nucleus: Any
    new_lora: Any
    saved: dict = dataclasses.field(default_factory=dict)
    summary: dict = dataclasses.field(default_factory=lambda: {"extra": {}, "placement": {}, "audit": {}})


def _sampling_case() -> _Case:
    import jax.numpy as jnp
    from flax import nnx

    from poad_jax.models.tiny import tiny_random_model
    from poad_jax.sampling import SamplingConfig

    model, tokenizer = tiny_random_model(hidden_size=HIDDEN, embedding_std=0.1)
    rng = np.random.default_rng(0)
    for name in model.layers.lora_b.keys():
        b = model.layers.lora_b[name]
        b[...] = jnp.asarray(rng.normal(0, 0.05, b[...].shape), jnp.float32)
    vocab = model.config.vocab_size
    prompts = [list(rng.integers(5, vocab, n)) for n in (3, 9, 5, 12, 1)]
    few = prompts[:3]
    candidates = [[list(rng.integers(5, vocab, rng.integers(1, 4))) for _ in range(4)] for _ in few]
    eos = int(tokenizer.eos_token_ids[0])
    free = SamplingConfig(temperature=1.0, max_new_tokens=NEW_TOKENS)
    nucleus = SamplingConfig(temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=NEW_TOKENS, stop_token_ids=(eos,))
    new_lora = jax.tree.map(lambda x: x + 0.2, nnx.state(model, nnx.LoRAParam))
    return _Case(model, prompts, few, candidates, free, nucleus, new_lora)


def _padded(rows):
    return np.stack([np.pad(r, (0, NEW_TOKENS - len(r))) for r in rows])


def _run_calls(case: _Case, name, sampler):
    """Every sampler call, with the same keys; results saved under `name`.  Returns whether the base
    and its per-layer copies are the same arrays after `set_lora`, and how many programs it compiled."""
    saved, prompts, few, candidates = case.saved, case.prompts, case.few, case.candidates
    extra = {}
    for call, config in (("free", case.free), ("nucleus", case.nucleus)):
        g = sampler.generate(prompts, jax.random.key(11), config)
        saved[f"{name}/{call}/tokens"], saved[f"{name}/{call}/logprobs"] = _padded(g.tokens), _padded(g.logprobs)
        extra[call] = g.finish_reasons
    c = sampler.generate_constrained(few, candidates, jax.random.key(12), 1.0)
    saved[f"{name}/constrained/tokens"], saved[f"{name}/constrained/logprobs"] = _padded(c.tokens), _padded(c.logprobs)
    extra["constrained"] = c.action_index.tolist()
    scores = sampler.score_actions_batch(few, candidates)
    saved[f"{name}/score_batch/sums"] = np.stack([s.token_logprob_sums for s in scores])
    saved[f"{name}/score_batch/probs"] = np.stack([s.probs for s in scores])
    one = sampler.score_actions(prompts[3], candidates[0])
    saved[f"{name}/score_one/sums"], saved[f"{name}/score_one/probs"] = one.token_logprob_sums, one.probs
    base, unstacked, count = jax.tree.leaves(sampler._base), jax.tree.leaves(sampler.unstacked), sampler.compile_count
    sampler.set_lora(case.new_lora)
    g = sampler.generate(prompts, jax.random.key(11), case.free)
    saved[f"{name}/free_new_lora/tokens"], saved[f"{name}/free_new_lora/logprobs"] = _padded(g.tokens), _padded(
        g.logprobs)
    extra["free_new_lora"] = g.finish_reasons
    case.summary["extra"][name] = extra
    same = all(a is b for a, b in zip(base + unstacked, jax.tree.leaves(sampler._base) +
                                      jax.tree.leaves(sampler.unstacked)))
    return same, sampler.compile_count - count


def _specs(tree):
    """Per array: its spec's axis names, and whether each device holds all of it."""
    return {dist.sharding.path_string(p): {"axes": str(tuple(x.sharding.spec)),
                                           "whole": x.sharding.shard_shape(x.shape) == x.shape}
            for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _make(case: _Case, mesh=None):
    from poad_jax.sampling import Sampler

    return Sampler(case.model, batch_buckets=BUCKETS, prompt_buckets=PROMPT_BUCKETS, mesh=mesh)


def _decode_rule(case: _Case, sampler, rule_name):
    from poad_jax.sampling.loop import FreeSampling, TrieSampling

    if rule_name == "free":
        return FreeSampling(1.0, 0, 1.0, ())
    from poad_jax.core.layout import build_action_tries

    trie = build_action_tries(case.candidates + case.candidates[:2], sampler._batch(len(case.prompts)), None)
    return TrieSampling(*(sampler._rows(a) for a in (trie.edge_token, trie.edge_child, trie.edge_valid)),
                        1.0, row_local=sampler.layout is not None)


def _audit(case: _Case, sampler, rule_name):
    """The compiled decode of `sampler` on 5 prompts: collectives, carry
    shardings and aliasing, and where the cache's shapes appear."""
    carry = sampler._start(case.prompts, NEW_TOKENS)
    rule = _decode_rule(case, sampler, rule_name)
    key = sampler._key(jax.random.key(0))
    compiled = sampler._decode.lower(*sampler._weights(), carry, key, rule).compile()
    text = compiled.as_text()
    # the reference: the default layout on the sampler's mesh (tripwires change its rules)
    layout = SamplingLayout(sampler.layout.mesh if sampler.layout is not None else dist.make_mesh(1, 8, 1))
    wanted = jax.tree.leaves(layout.carry_shardings(carry))
    leaves = jax.tree.leaves(carry)

    def pinned(shardings):
        return all(s.is_equivalent_to(w, np.ndim(x)) for s, w, x in zip(jax.tree.leaves(shardings), wanted, leaves))

    cache = [carry.cache.k, carry.cache.v]
    whole = [tuple(x.shape) for x in cache]
    shard = [tuple(w.shard_shape(x.shape)) for w, x in zip(wanted[:2], cache)]
    cache_shapes = {tuple(sorted(s)) for s in whole + shard} | {tuple(sorted(s[1:])) for s in whole + shard}
    header = text.split("entry_computation_layout", 1)[0]
    loop = [line for line in text.splitlines() if " while(" in line and 'op_name="jit(decode)/while"' in line]

    def spelled(shape):
        return "[" + ",".join(map(str, shape)) + "]"

    return {
        "collectives": collectives(text),
        "cache_shapes": sorted(cache_shapes),
        "carry_leaves": len(leaves),
        "aliased_outputs": len(re.findall(r"\{\d+\}: \(\d+, \{\}, may-alias\)", header)),
        "carry_in_pinned": pinned(compiled.input_shardings[0][4]),
        "carry_out_pinned": pinned(compiled.output_shardings),
        "cache_shard_in_loop": bool(loop) and all(spelled(s) in loop[0] for s in shard),
        "whole_cache_in_program": any(spelled(s) in text for s in whole if s not in shard),
    }


def _tripwire_audits(case: _Case) -> None:
    """Tripwires on (1, 8, 1): the training layout, a one-device sampler given training-layout weights,
    a replicated cache, an unpinned carry."""
    audits = case.summary["audit"]
    fsdp = dist.make_mesh(1, 8, 1)
    train_layout = SamplingLayout(fsdp, base_rules=dist.train_rules(), unstacked_rules=UNSTACKED_TRAIN_RULES)
    unsharded = _make(case)  # today's path before this change: a one-device sampler given training-layout weights
    unsharded._base = dist.shard_by_rules(unsharded._base, fsdp, dist.train_rules())
    unsharded.unstacked = dist.shard_by_rules(unsharded.unstacked, fsdp, UNSTACKED_TRAIN_RULES)
    for rule in ("free", "trie"):
        audits[f"fsdp8_train_layout/{rule}"] = _audit(case, _make(case, train_layout), rule)
        audits[f"fsdp8_unsharded_sampler/{rule}"] = _audit(case, unsharded, rule)
    replicated_cache = SamplingLayout(fsdp, carry_rules=((r"^cache/(k|v)$", P()),) + CARRY_RULES)
    audits["fsdp8_cache_replicated/free"] = _audit(case, _make(case, replicated_cache), "free")

    class Unpinned(SamplingLayout):
        def constrain_carry(self, carry):
            return carry

    audits["fsdp8_unpinned/free"] = _audit(case, _make(case, Unpinned(fsdp)), "free")


def _worker(out: pathlib.Path) -> None:
    jax.config.update("jax_default_matmul_precision", "highest")
    assert jax.device_count() == 8, jax.devices()
    case = _sampling_case()
    summary, saved = case.summary, case.saved
    single = _make(case)
    for call, config in (("free", case.free), ("nucleus", case.nucleus)):  # how much the draws depend on the key
        other = single.generate(case.prompts, jax.random.key(12), config)
        saved[f"other_key/{call}/tokens"] = _padded(other.tokens)
    same, _ = _run_calls(case, "single", single)
    summary["lora_changed_tokens"] = bool(np.any(saved["single/free/tokens"] != saved["single/free_new_lora/tokens"]))
    for name, shape in MESHES.items():
        sampler = _make(case, dist.make_mesh(*shape))
        summary["placement"][name] = {"base": _specs(sampler._base), "unstacked": _specs(sampler.unstacked)}
        for rule in ("free", "trie"):
            summary["audit"][f"{name}/{rule}"] = _audit(case, sampler, rule)
        same, compiles = _run_calls(case, name, sampler)
        summary["placement"][name].update(lora=_specs(sampler._lora), same_base_after_set_lora=same,
                                          compiles_after_set_lora=compiles)
    _tripwire_audits(case)
    summary["weight_shapes"] = sorted(_weight_shapes(_make(case)))
    (out / "summary.json").write_text(json.dumps(summary))
    np.savez(out / "arrays.npz", **saved)


if __name__ == "__main__":
    _worker(pathlib.Path(sys.argv[1]))
