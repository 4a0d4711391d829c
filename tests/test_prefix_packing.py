"""Token-level rows packed with their common prompt prefix once equal the rows run one by one.

`core/shared_prefix.py` packs `prefix | rest of row 0 | rest of row 1 | ...` and lets every
rest see only the prefix and itself.  The reference is the plain forward of each row
`[P + A]`: hidden states, log-probs, entropies, behaviour statistics, gradients and a whole
update must agree to float32 rounding.  The rows mix prompt lengths (one prompt is the
prefix and nothing else), action lengths, and groups of several sizes.

(`--config.prefix_packing`, token level; TWOSOME's candidates sharing their state's
prompt are `--config.share_prompt`, tests/test_twosome_prompt_sharing.py.)
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from poad_jax.agent.experience import PrefixPlans, behaviour_statistics, make_token_batch, pack_batch, prefix_plans
from poad_jax.agent.learner import init_train_state, jit_update, policy_outputs
from poad_jax.agent.methods import make_method
from poad_jax.agent.rollout import StepRecord
from poad_jax.core import shared_prefix
from poad_jax.core.policy import PackedRows, base_features
from poad_jax.models.tiny import tiny_random_model
from poad_jax.run.config import learner_config, rollout_config
from tests.test_twosome_prompt_sharing import rich_policy

PREFIX = 32  # a multiple of the plan's default rounding, so the whole common prefix is shared


def random_steps(vocab_size: int, threads: int, seed: int, prefix_len: int = PREFIX):
    """One step per thread: prompts = a common prefix + 0..20 own tokens (thread 0: none), actions of
    1..12 tokens; next prompts the same way."""
    rng = np.random.default_rng(seed)
    vocab = range(5, vocab_size)
    prefix = [int(t) for t in rng.choice(vocab, size=prefix_len)]
    own = lambda n: [int(t) for t in rng.choice(vocab, size=n)]
    records = [StepRecord(prefix + own(0 if b == 0 else int(rng.integers(1, 21))), own(int(rng.integers(1, 13))),
                          float(rng.normal()), bool(rng.random() < 0.3)) for b in range(threads)]
    next_prompts = [prefix + own(int(rng.integers(0, 21))) for _ in range(threads)]
    return [records], next_prompts


def setup(seed: int = 0, threads: int = 6):
    graph, frozen, params, tokenizer = rich_policy(seed)
    steps, next_prompts = random_steps(tokenizer.vocab_size, threads, seed)
    config = rollout_config(num_threads=threads, rollout_length=1, prompt_format="raw")
    arrays, next_arrays = pack_batch(steps, next_prompts, make_method("poad", 0.95), config, tokenizer.pad_token_id)
    return graph, frozen, params, arrays, next_arrays


def test_the_common_prefix_and_the_plans_length_hold_any_group_of_rows():
    """C: the leading prompt tokens every row shares, rounded down; T: room for any m rows' rests
    (brute force over every group of m rows), rounded up; None where packing saves nothing."""
    _, _, _, arrays, _ = setup()
    tokens, key_mask = arrays["tokens"], arrays["key_mask"]
    prompt_len = tokens.shape[1] - arrays["action_mask"].shape[1]
    prompts = [list(row[prompt_len - int(mask[:prompt_len].sum()):prompt_len]) for row, mask in zip(tokens, key_mask)]
    common = next(i for i in itertools.count() if i == min(map(len, prompts)) or len({p[i] for p in prompts}) > 1)
    assert common == shared_prefix.common_prefix_len(tokens, key_mask, prompt_len) == PREFIX
    for group_rows, multiple in itertools.product((1, 2, 3, 6), (8, 32)):
        plan = shared_prefix.plan(tokens, key_mask, prompt_len, group_rows, prefix_multiple=multiple)
        assert plan.prefix_len == common // multiple * multiple and plan.group_rows == group_rows
        rests = key_mask.sum(1) - plan.prefix_len
        worst = max(plan.prefix_len + sum(rests[list(g)]) for g in itertools.combinations(range(len(rests)), group_rows))
        assert worst <= plan.packed_len < worst + 64 and plan.packed_len % 64 == 0
    no_prefix = tokens.copy()  # every row's prompt starts with its own token
    no_prefix[:, :prompt_len] = np.where(key_mask[:, :prompt_len], np.arange(len(tokens))[:, None] + 5, 0)
    assert shared_prefix.common_prefix_len(no_prefix, key_mask, prompt_len) == 0
    assert shared_prefix.plan(tokens[:1], key_mask[:1], prompt_len, 1, length_multiple=10_000) is None
    with pytest.raises(ValueError, match="groups of 4"):
        shared_prefix.plan(tokens, key_mask, prompt_len, 4)


@pytest.mark.long
def test_the_visibility_is_the_prefix_and_the_rows_own_rest():
    """Two rows of prompt length 3 and 2 with one common token, actions of 1 and 2 tokens: packed
    `p | a a a | b b b | pad`, each rest seeing the prefix and itself; reads at the rows' last prompt
    token, then at their own action tokens."""
    tokens = jnp.array([[7, 8, 9, 20, 0], [0, 7, 5, 21, 22]])
    key_mask = tokens != 0
    positions = jnp.array([[0, 1, 2, 3, 0], [0, 0, 1, 2, 3]])
    packed = shared_prefix.pack(tokens, positions, key_mask, 3, shared_prefix.PrefixPlan(1, 2, 8))
    np.testing.assert_array_equal(packed.tokens[0], [7, 8, 9, 20, 5, 21, 22, 0])
    np.testing.assert_array_equal(packed.positions[0], [0, 1, 2, 3, 1, 2, 3, 0])
    np.testing.assert_array_equal(packed.key_mask[0], [1, 1, 1, 1, 1, 1, 1, 0])
    block = np.array([-1, 0, 0, 0, 1, 1, 1, 2])
    np.testing.assert_array_equal(packed.visibility[0], (block[None] == -1) | (block[None] == block[:, None]))
    np.testing.assert_array_equal(packed.action_columns, [[2, 3], [4, 5]])  # row 0's column 1 is padding


def test_packed_hidden_states_equal_each_rows_own():
    """Groups of 1, 3 and 6 rows (2 groups of 3: a group need not hold the row that sets C), with
    the actor's adapters and without (the critic's input), compiled as the passes run."""
    graph, frozen, params, arrays, _ = setup(seed=1)
    prompt_len = arrays["tokens"].shape[1] - arrays["action_mask"].shape[1]
    columns = [jnp.asarray(arrays[k]) for k in ("tokens", "positions", "key_mask")]
    features = jax.jit(lambda lora, plan, use_lora: base_features(
        graph, frozen, lora, PackedRows(*columns, prompt_len, plan), use_lora=use_lora), static_argnums=(1, 2))
    mask = arrays["action_mask"]
    for use_lora in (False, True):
        reference = np.asarray(features(params["actor"], None, use_lora))
        assert np.abs(reference[mask]).max() > 0.1
        for group_rows in (1, 3, 6):
            plan = shared_prefix.plan(arrays["tokens"], arrays["key_mask"], prompt_len, group_rows)
            assert plan is not None and plan.prefix_len == PREFIX
            packed = np.asarray(features(params["actor"], plan, use_lora))
            np.testing.assert_allclose(packed[mask], reference[mask], rtol=1e-5, atol=1e-5,
                                       err_msg=f"{group_rows} rows, use_lora={use_lora}")


def test_behaviour_statistics_equal_the_rows_own():
    graph, frozen, params, arrays, next_arrays = setup(seed=2)
    plans = prefix_plans(arrays, next_arrays, micro_batch_rows=2)
    assert None not in plans
    stats = {packing: behaviour_statistics(graph, frozen, params, params["head"], arrays, next_arrays,
                                           method=make_method("poad", 0.95), temperature=1.0, critic_kind="head",
                                           plans=plans if packing else None)
             for packing in (True, False)}
    mask = arrays["action_mask"]
    for key in ("old_logprobs", "features", "old_values"):
        np.testing.assert_allclose(np.asarray(stats[True][key])[mask], np.asarray(stats[False][key])[mask],
                                   rtol=1e-5, atol=1e-5, err_msg=key)
    np.testing.assert_allclose(np.asarray(stats[True]["bootstrap_value"]), np.asarray(stats[False]["bootstrap_value"]),
                               rtol=1e-5, atol=1e-5)


def test_learner_outputs_and_gradients_equal_the_rows_own():
    """With the critic's own adapters (`critic.kind="lora"`): the critic's features run packed too
    (the head critic's features are the behaviour pass's, `test_behaviour_statistics_equal_the_rows_own`)."""
    critic_kind = "lora"
    graph, frozen, params, arrays, next_arrays = setup(seed=3)
    params = dict(params, critic_lora=jax.tree.map(lambda x: x * 0.5, params["actor"]))
    method = make_method("poad", 0.95)
    stats = behaviour_statistics(graph, frozen, params, params["head"], arrays, next_arrays,
                                 method=method, temperature=1.0, critic_kind=critic_kind)
    plan = prefix_plans(arrays, next_arrays, micro_batch_rows=3).learner
    batches = {True: make_token_batch(arrays, stats, prefix_plan=plan), False: make_token_batch(arrays, stats)}
    config = learner_config(gamma=0.95, critic_kind=critic_kind)
    mask = jnp.asarray(arrays["action_mask"])
    rng = np.random.default_rng(2)
    advantages = jnp.asarray(rng.normal(size=mask.shape), jnp.float32)

    def loss(p, batch):
        logprobs, entropy, values, _ = policy_outputs(graph, frozen, p, batch, method, config)
        return jnp.sum(jnp.where(mask, advantages * logprobs + 0.1 * entropy + values ** 2, 0.0))

    outputs = {k: jax.jit(policy_outputs, static_argnums=(0, 4, 5))(graph, frozen, params, b, method, config)
               for k, b in batches.items()}
    for a, b in zip(outputs[True][:3], outputs[False][:3]):
        np.testing.assert_allclose(np.asarray(a)[mask], np.asarray(b)[mask], rtol=1e-5, atol=1e-5)
    grads = {k: jax.jit(jax.grad(loss))(params, b) for k, b in batches.items()}
    flat_packed = jax.tree_util.tree_leaves_with_path(grads[True])
    flat_reference = jax.tree.leaves(grads[False])
    for (path, a), b in zip(flat_packed, flat_reference):
        a, b = np.asarray(a), np.asarray(b)
        assert np.abs(b).max() > 0, jax.tree_util.keystr(path)  # every trained parameter gets a gradient
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * np.abs(b).max(), err_msg=jax.tree_util.keystr(path))


@pytest.mark.long
def test_a_whole_update_agrees_with_packing():
    """The compiled update (6 rows: 2 minibatches of one micro-batch of 3 rows, drawn inside the update)
    with packed micro-batches gives the unpacked update's metrics and parameters."""
    graph, frozen, params, arrays, next_arrays = setup(seed=4)
    method = make_method("poad", 0.95)
    config = learner_config(gamma=0.95, num_minibatches=2, accumulation_steps=1, actor_lr=1e-3, critic_lr=1e-3)
    plans = prefix_plans(arrays, next_arrays, micro_batch_rows=3)
    results = {}
    for packing in (True, False):
        stats = behaviour_statistics(graph, frozen, params, params["head"], arrays, next_arrays, method=method,
                                     temperature=1.0, critic_kind="head", plans=plans if packing else None)
        batch = make_token_batch(arrays, stats, prefix_plan=plans.learner if packing else None)
        update, _ = jit_update(graph, method, config)
        state = init_train_state(jax.tree.map(jnp.array, params), config, jax.random.key(0))
        results[packing] = update(state, frozen, batch)
    for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "actor_grad_norm", "critic_grad_norm"):
        np.testing.assert_allclose(float(results[True][1][key]), float(results[False][1][key]), rtol=1e-4, atol=1e-6,
                                   err_msg=key)
    assert float(results[True][1]["actor_grad_norm"]) > 0
    for a, b in zip(jax.tree.leaves(results[True][0].params), jax.tree.leaves(results[False][0].params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_twosome_batches_refuse_a_prefix_plan():
    arrays = {"chosen": np.zeros(2, np.int32)}
    with pytest.raises(ValueError, match="token-level"):
        make_token_batch(arrays, prefix_plan=shared_prefix.PrefixPlan(1, 1, 1))
    assert PrefixPlans(None, None, None).learner is None


def test_the_trainer_packs_token_level_rows_on_one_device_and_counts_the_packed_flops():
    """`Placement.prefix_plans`: the learner's groups are its micro-batches, the behaviour pass packs
    all rows and all next prompts at once; nothing for TWOSOME, a mesh, or the option off.  The
    update's FLOP count (`update_flops`) is the packed passes'."""
    from poad_jax.core import flops as flops_lib
    from poad_jax.run import config as config_lib
    from poad_jax.run.build import Placement

    _, _, _, arrays, next_arrays = setup()
    config = config_lib.default_config()
    config.prefix_packing, config.ppo.num_minibatches, config.ppo.accumulation_steps = True, 2, 1
    poad = make_method("poad", 0.95)
    run = config_lib.typed(config)
    plans = Placement().prefix_plans(arrays, next_arrays, poad, run)
    assert [p.group_rows for p in plans] == [3, 6, 6] and {p.prefix_len for p in plans} == {PREFIX}
    assert Placement().prefix_plans(arrays, next_arrays, make_method("twosome", 0.95), run) is None
    assert Placement(count=2).prefix_plans(arrays, next_arrays, poad, run) is None
    config.prefix_packing = False
    assert Placement().prefix_plans(arrays, next_arrays, poad, config_lib.typed(config)) is None

    shape, action_len = arrays["tokens"].shape, arrays["action_mask"].shape[1]
    packed_passes = poad.scheme.passes(shape, action_len, plans.learner)
    assert packed_passes.policy == flops_lib.Pass(2, plans.learner.packed_len, 3 * action_len)
    assert packed_passes.values == poad.scheme.passes(shape, action_len).values
    count = lambda **packed: flops_lib.update_flops(
        tiny_random_model()[0].config, poad.scheme.passes(shape, action_len, packed.pop("learner", None)), head_sizes=(16,),
        next_rows=6, prompt_len=shape[1] - action_len, critic_kind="head", remat="full", epochs=1, **packed)
    plain = count()
    packed = count(learner=plans.learner, behaviour_passes=poad.scheme.passes(shape, action_len, plans.rows),
                   bootstrap=flops_lib.Pass(1, plans.next_rows.packed_len))
    assert packed["learner"] < plain["learner"] and packed["behaviour"] < plain["behaviour"]
