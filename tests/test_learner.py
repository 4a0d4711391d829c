"""The learner end to end on a tiny random model and the toy decisive-token task.

- POAD learns the task where one token inside a multi-token action decides
  the reward (the paper's Figure 1 setting); NTPO and TWOSOME run too.
- The first update's PPO ratio is exactly 1 on every valid token.
- The update compiles once across iterations.
- Action-level (TWOSOME) log-probs equal a NumPy softmax over normalised
  candidate scores; the constrained token log-probs equal a NumPy
  renormalisation over the allowed tokens.
"""

from __future__ import annotations

import dataclasses

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import envs_py
from poad_jax.run import train
from poad_jax.run import config as config_lib
from poad_jax.run.config import learner_config, rollout_config
from poad_jax.agent.learner import compute_advantages, init_train_state, jit_update, policy_outputs
from poad_jax.agent.methods import make_method
from poad_jax.models.tiny import tiny_random_model
from poad_jax.core.critic_config import CriticConfig
from poad_jax.core.policy import ValueHead, split_policy, token_logprobs_and_entropy
from poad_jax.agent.rollout import RolloutCollector, merged_actor
from poad_jax.agent.experience import behaviour_statistics, make_token_batch, pack_batch
from poad_jax.sampling import Sampler

REPO = pathlib.Path(__file__).resolve().parents[1]




def collect_batch(method_name: str, num_threads=4, rollout_length=4, seed=0, matmul_dtype=None,
                  behaviour_logprobs="recompute", return_arrays=False):
    model, tokenizer = tiny_random_model(seed=seed, matmul_dtype=matmul_dtype)
    head = ValueHead(model.config.hidden_size, CriticConfig(hidden_sizes=(32,)), rngs=nnx.Rngs(1))
    graph, frozen, params = split_policy(model, head)
    method = make_method(method_name, 0.95)
    config = rollout_config(num_threads=num_threads, rollout_length=rollout_length, prompt_format="raw",
                            behaviour_logprobs=behaviour_logprobs)
    envs = envs_py.VectorEnv("toy/decisive_token", num_threads, seed=seed, horizon=2, num_colours=3, rewarded="blue")
    collector = RolloutCollector(envs, tokenizer, Sampler(merged_actor(graph, frozen, params)), method, config, seed=seed)
    steps, next_prompts = collector.collect(jax.random.key(seed))
    arrays, next_arrays = pack_batch(steps, next_prompts, method, config, tokenizer.pad_token_id)
    stats = behaviour_statistics(
        graph, frozen, params, params["head"], arrays, next_arrays,
        method=method, temperature=1.0, critic_kind="head",
    )
    if return_arrays:
        return graph, frozen, params, method, make_token_batch(arrays, stats), steps, (arrays, next_arrays)
    return graph, frozen, params, method, make_token_batch(arrays, stats), steps


@pytest.mark.parametrize("method_name", ["poad", "ntpo"])
def test_the_samplers_logprobs_as_old_logprobs_give_a_first_ratio_of_one_up_to_rounding(method_name):
    """behaviour_logprobs="sampler" (float32): the old log-probs are the ones the sampler decoded,
    each within 1e-5 of the learner's own (issue 31's bound on |ratio - 1|), and only they change."""
    graph, frozen, params, method, batch, steps, (arrays, _) = collect_batch(
        method_name, behaviour_logprobs="sampler", return_arrays=True)
    _, _, _, _, recomputed, _ = collect_batch(method_name)
    rows = [steps[t][b] for b in range(len(steps[0])) for t in range(len(steps))]
    mask = np.asarray(batch.action_mask)
    np.testing.assert_array_equal(np.asarray(batch.old_logprobs)[mask],
                                  np.concatenate([r.sampler_logprobs for r in rows]).astype(np.float32))
    np.testing.assert_array_equal(np.asarray(recomputed.tokens), np.asarray(batch.tokens))  # the same rollout
    logprobs, _, _, valid = policy_outputs(graph, frozen, params, batch, method, learner_config(gamma=0.95))
    gap = np.abs(np.expm1(np.asarray(logprobs, np.float64) - np.asarray(batch.old_logprobs, np.float64)))
    assert np.asarray(valid).sum() > 0 and gap[np.asarray(valid)].max() <= 1e-5
    assert gap[np.asarray(valid)].max() > 0  # they are the sampler's, not a recomputation
    for name in ("old_values", "features", "bootstrap_value"):
        np.testing.assert_array_equal(np.asarray(getattr(batch, name)), np.asarray(getattr(recomputed, name)))


@pytest.mark.parametrize("matmul_dtype", [None, jnp.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("method_name", ["poad", "ntpo", "twosome"])
def test_first_update_ratio_is_one(method_name, matmul_dtype):
    graph, frozen, params, method, batch, _ = collect_batch(method_name, matmul_dtype=matmul_dtype)
    config = learner_config(gamma=0.95)
    logprobs, _, values, mask = policy_outputs(graph, frozen, params, batch, method, config)
    ratio = np.exp(np.asarray(logprobs) - np.asarray(batch.old_logprobs))
    assert np.asarray(mask).sum() > 0
    np.testing.assert_array_equal(ratio[np.asarray(mask)], 1.0)
    np.testing.assert_array_equal(np.asarray(values), np.asarray(batch.old_values))


def test_constrained_logprobs_match_numpy_renormalisation():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 7)).astype(np.float32)
    tokens = np.array([[1, 2, 5], [3, 4, 0]])
    allowed = np.array([[[1, 2], [2, 0], [5, 6]], [[3, 5], [4, 0], [0, 0]]])
    allowed_mask = np.array([[[1, 1], [1, 0], [1, 1]], [[1, 1], [1, 0], [0, 0]]], bool)
    logprobs, entropy = token_logprobs_and_entropy(
        jnp.asarray(logits), jnp.asarray(tokens), jnp.asarray(allowed), jnp.asarray(allowed_mask)
    )
    for n in range(2):
        for j in range(3):
            ids = allowed[n, j][allowed_mask[n, j]]
            if len(ids):
                z = logits[n, j, ids].astype(np.float64)
                p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
                expected_lp = np.log(p[list(ids).index(tokens[n, j])])
                expected_h = -(p * np.log(p)).sum()
            else:  # unconstrained column: full vocabulary
                z = logits[n, j].astype(np.float64)
                p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
                expected_lp = np.log(p[tokens[n, j]])
                expected_h = -(p * np.log(p)).sum()
            np.testing.assert_allclose(logprobs[n, j], expected_lp, atol=1e-5)
            np.testing.assert_allclose(entropy[n, j], expected_h, atol=1e-5)


def test_twosome_logprob_is_softmax_over_normalised_scores():
    graph, frozen, params, method, batch, steps = collect_batch("twosome")
    config = learner_config(gamma=0.95)
    logprobs, entropy, _, _ = policy_outputs(graph, frozen, params, batch, method, config)
    token_method = make_method("poad", 0.95)
    rows, candidates, length = batch.tokens.shape
    # Score every candidate row with the token-level path (full vocabulary, T = 1).
    flat = jax.tree.map(lambda x: x, batch)
    from poad_jax.core.policy import PackedRows, action_logprobs

    token_lp, _ = action_logprobs(graph, frozen, params["actor"], PackedRows.of(flat).flat(), 1.0)
    token_lp = np.asarray(token_lp, np.float64).reshape(rows, candidates, -1)
    mask = np.asarray(batch.action_mask)
    scores = (token_lp * mask).sum(-1) / np.asarray(batch.normalizer)
    scores = np.where(np.asarray(batch.candidate_mask), scores, -np.inf)
    log_pi = scores - np.log(np.exp(scores - scores.max(-1, keepdims=True)).sum(-1, keepdims=True)) - scores.max(-1, keepdims=True)
    expected = log_pi[np.arange(rows), np.asarray(batch.chosen)]
    np.testing.assert_allclose(np.asarray(logprobs), expected, atol=1e-5)
    del token_method, entropy, steps


def test_the_batch_type_has_the_fields_its_scheme_and_correction_read():
    """Packed arrays name their batch type: the behaviour log-probs (the importance correction) make a
    token-level batch a corrected one, group advantages a group one, the candidates' `chosen` an action-level one."""
    from poad_jax.agent.experience import batch_type
    from poad_jax.core import token_batch as tb

    kinds = {(): tb.TokenLevelBatch, ("behaviour_logprobs",): tb.CorrectedTokenBatch,
             ("advantages",): tb.GroupTokenBatch, ("advantages", "behaviour_logprobs"): tb.CorrectedGroupTokenBatch,
             ("chosen",): tb.ActionLevelBatch}
    for keys, kind in kinds.items():
        assert batch_type(dict.fromkeys(("tokens", "action_mask") + keys)) is kind, keys
    names = lambda kind: {f.name for f in dataclasses.fields(kind)}
    assert "behaviour_logprobs" not in names(tb.TokenLevelBatch) | names(tb.GroupTokenBatch)
    assert names(tb.CorrectedGroupTokenBatch) == names(tb.GroupTokenBatch) | {"behaviour_logprobs"}
    assert issubclass(tb.CorrectedGroupTokenBatch, tb.CorrectedTokenBatch)  # what the learner's correction reads
    for kind in kinds.values():
        assert all(f.default is dataclasses.MISSING for f in dataclasses.fields(kind) if not f.metadata.get("static"))


@pytest.mark.parametrize("method_name", ["poad", "twosome"])
def test_each_scheme_packs_its_own_complete_batch_type(method_name):
    """A token-level method's batch is a TokenLevelBatch, an action-level one's an ActionLevelBatch;
    every field is an array of the rank its type documents (no None: no field is optional)."""
    from poad_jax.core.token_batch import ActionLevelBatch, TokenLevelBatch

    _, _, _, method, batch, _ = collect_batch(method_name, num_threads=2, rollout_length=2)
    token_level = method.scheme.token_level
    assert type(batch) is (TokenLevelBatch if token_level else ActionLevelBatch)
    ranks = ({"tokens": 2, "action_mask": 2, "old_logprobs": 2, "old_values": 2, "features": 3,
              "allowed_tokens": 3, "allowed_mask": 3} if token_level else
             {"tokens": 3, "action_mask": 3, "old_logprobs": 1, "old_values": 1, "features": 2,
              "chosen": 1, "candidate_mask": 2, "normalizer": 2})
    for name, rank in ranks.items():
        assert np.ndim(getattr(batch, name)) == rank, name
    fields = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch) if not f.metadata.get("static")}
    static = [f.name for f in dataclasses.fields(batch) if f.metadata.get("static")]
    assert static == (["prefix_plan"] if token_level else [])  # a token-level batch's plan, declared
    assert not token_level or batch.prefix_plan is None  # static metadata, set only with prefix_packing
    assert [name for name, value in fields.items() if value is None] == []  # no optional field
    assert not hasattr(batch, "behaviour_logprobs")  # without the importance correction, not in the type
    assert all(np.shape(value)[0] == batch.num_rows for name, value in fields.items()
               if value is not None and name != "bootstrap_value")


def test_update_compiles_once_and_changes_params():
    graph, frozen, params, method, batch, _ = collect_batch("poad")
    config = learner_config(gamma=0.95, num_minibatches=2, accumulation_steps=2, epochs=2, actor_lr=1e-2, critic_lr=1e-2)
    update, compiles = jit_update(graph, method, config)
    state = init_train_state(params, config, jax.random.key(0))
    before = jax.tree.map(np.asarray, state.params)
    for _ in range(3):
        state, metrics = update(state, frozen, batch)
    assert compiles() == 1
    assert int(state.update_step) == 3
    changed = jax.tree.map(lambda a, b: not np.array_equal(np.asarray(a), b), state.params, before)
    assert any(jax.tree.leaves(changed))
    for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction",
                "explained_variance", "actor_grad_norm", "critic_grad_norm", "skipped_minibatches"):
        assert np.isfinite(float(metrics[key])), key


def test_micro_batches_change_the_update_only_by_the_order_of_float_sums():
    """Gradient accumulation over k micro-batches (`accumulation_steps`, what bounds the learner's activation
    memory) sums each micro-batch's weighted terms: the minibatch's loss, statistics and gradient are the whole
    minibatch's (k = 1) to float32 rounding of the sums' order, and so are one update's metrics."""
    from poad_jax.agent.learner import UpdateContext, minibatch_gradients, update_batch

    graph, frozen, params, method, batch, _ = collect_batch("poad")
    outputs, metrics = {}, {}
    for micro in (1, 2, 4):
        config = learner_config(gamma=0.95, num_minibatches=2, accumulation_steps=micro, epochs=1)
        context = UpdateContext(graph, method, config)
        state = init_train_state(params, config, jax.random.key(0))
        index = jnp.arange(8).reshape(1, 8)
        outputs[micro] = jax.jit(lambda s, f, b: minibatch_gradients(s, index, f, update_batch(b, context),
                                                                     context)[:3])(state, frozen, batch)
        fresh = init_train_state(jax.tree.map(jnp.copy, params), config, jax.random.key(0))  # the update donates it
        metrics[micro] = jit_update(graph, method, config)[0](fresh, frozen, batch)[1]
    reference = jax.tree.leaves(outputs[1])
    for micro in (2, 4):
        for got, expected in zip(jax.tree.leaves(outputs[micro]), reference):
            np.testing.assert_allclose(got, expected, rtol=2e-5, atol=1e-7, err_msg=f"{micro} micro-batches")
        for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "actor_grad_norm", "critic_grad_norm"):
            np.testing.assert_allclose(metrics[micro][key], metrics[1][key], rtol=2e-5, atol=1e-7, err_msg=key)
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(outputs[1][2]['actor'])) > 0  # a gradient to compare


def test_kl_threshold_skips_minibatches():
    graph, frozen, params, method, batch, _ = collect_batch("poad")
    config = learner_config(gamma=0.95, num_minibatches=2, epochs=3, actor_lr=1.0, target_kl=1e-9)
    update, _ = jit_update(graph, method, config)
    state = init_train_state(params, config, jax.random.key(0))
    state, metrics = update(state, frozen, batch)
    # Epoch 1 moves the policy (its KL is 0, not above the threshold); with a
    # huge learning rate every later minibatch exceeds the tiny threshold and is skipped.
    assert float(metrics["skipped_minibatches"]) >= 1


def test_advantages_follow_the_method():
    import dataclasses

    _, _, _, _, batch, _ = collect_batch("poad")
    rng = np.random.default_rng(0)
    batch = dataclasses.replace(
        batch,
        rewards=jnp.asarray(rng.normal(size=batch.rewards.shape), jnp.float32),
        old_values=jnp.asarray(rng.normal(size=batch.old_values.shape), jnp.float32),
    )
    gamma = 0.9
    poad = np.asarray(compute_advantages(batch, make_method("poad", gamma), learner_config(gamma=gamma, lam=1.0))[0])
    ntpo = np.asarray(compute_advantages(batch, make_method("ntpo", gamma), learner_config(gamma=gamma, lam=1.0))[0])
    ntpo_one = np.asarray(
        compute_advantages(batch, make_method("ntpo", gamma, gamma_w=1.0), learner_config(gamma=gamma, lam=1.0))[0]
    )
    np.testing.assert_allclose(ntpo_one, poad, atol=1e-6)
    assert not np.allclose(ntpo, poad)


def test_twosome_gamma_w_discounts_each_action_by_its_token_count():
    """Action-level GAE with d_t = gamma * gamma_w**(n_t - 1) * (1 - done_t), against a NumPy loop."""
    import dataclasses

    _, _, _, _, batch, _ = collect_batch("twosome")
    rng = np.random.default_rng(1)
    batch = dataclasses.replace(
        batch,
        rewards=jnp.asarray(rng.normal(size=batch.rewards.shape), jnp.float32),
        old_values=jnp.asarray(rng.normal(size=batch.old_values.shape), jnp.float32),
        bootstrap_value=jnp.asarray(rng.normal(size=batch.bootstrap_value.shape), jnp.float32),
        dones=jnp.asarray(rng.random(batch.dones.shape) < 0.3),
    )
    # Candidates of different token counts (the toy's actions all have five).
    width = batch.action_mask.shape[-1]
    counts = rng.integers(1, width + 1, size=batch.action_mask.shape[:-1])
    batch = dataclasses.replace(batch, action_mask=jnp.asarray(np.arange(width) < counts[..., None]))
    gamma, gamma_w, lam = 0.9, 0.7, 0.8
    got = np.asarray(compute_advantages(
        batch, make_method("twosome", gamma, gamma_w=gamma_w), learner_config(gamma=gamma, lam=lam))[0])
    lengths = np.take_along_axis(np.asarray(batch.action_mask).sum(-1), np.asarray(batch.chosen)[:, None], 1)[:, 0]
    assert len(set(lengths.tolist())) > 1  # actions of different token counts
    threads = batch.num_threads
    rewards = np.asarray(batch.rewards).reshape(threads, -1)
    values = np.asarray(batch.old_values).reshape(threads, -1)
    dones = np.asarray(batch.dones).reshape(threads, -1)
    lengths = lengths.reshape(threads, -1)
    want = np.zeros_like(values)
    for b in range(threads):
        advantage, next_value = 0.0, float(batch.bootstrap_value[b])
        for t in reversed(range(values.shape[1])):
            d = gamma * gamma_w ** (lengths[b, t] - 1) * (1.0 - dones[b, t])
            advantage = rewards[b, t] + d * next_value - values[b, t] + d * lam * advantage
            want[b, t] = advantage
            next_value = values[b, t]
    np.testing.assert_allclose(got, want.reshape(-1), rtol=1e-5, atol=1e-5)
    plain = np.asarray(compute_advantages(batch, make_method("twosome", gamma), learner_config(gamma=gamma, lam=lam))[0])
    assert not np.allclose(plain, got)


@pytest.mark.long
@pytest.mark.parametrize("method_name", ["poad", "ntpo", "twosome"])
def test_methods_learn_the_decisive_token_task(tmp_path, method_name):
    config = config_lib.load_config_file(REPO / "configs" / "toy.py")
    config.method = method_name
    updates = 60 if method_name == "poad" else 25
    config.total_env_steps = config.num_threads * config.rollout_length * updates
    config.tensorboard = False
    config.plot = False
    result = train.run(config, tmp_path / method_name, show_progress=False)
    returns = [r["episode_return"] for r in result.records]
    assert len(returns) == updates
    assert result.records[-1]["compiles_learner"] == 1
    # The rewarded door is the one the random initial policy disfavours.
    assert np.mean(returns[:3]) < 0.5
    if method_name == "poad":
        # Max return is 2 (two steps of +1): POAD gets there well within 60 updates.
        assert np.mean(returns[-10:]) > 1.8


def test_explained_variance_matches_numpy_and_is_zero_for_constant_targets():
    """1 - Var[t - p] / Var[t] over the masked elements, against NumPy; targets that are one value up to float
    rounding (a batch where every program earned the same AUC) give 0, not a ratio of rounding noise."""
    from poad_jax.core.losses import explained_variance

    rng = np.random.default_rng(0)
    targets = rng.normal(0.5, 0.3, (4, 16)).astype(np.float32)
    predictions = (targets + rng.normal(0, 0.1, targets.shape)).astype(np.float32)
    mask = (rng.random(targets.shape) < 0.7).astype(np.float32)
    t, p = targets[mask > 0].astype(np.float64), predictions[mask > 0].astype(np.float64)
    expected = 1.0 - np.var(t - p) / np.var(t)
    np.testing.assert_allclose(float(explained_variance(predictions, targets, mask)), expected, rtol=1e-4)
    constant = np.full(targets.shape, 0.8834, np.float32) + rng.normal(0, 3e-6, targets.shape).astype(np.float32)
    assert np.var(constant[mask > 0]) > 0
    assert float(explained_variance(predictions, constant, mask)) == 0.0
    assert float(explained_variance(predictions, np.zeros_like(targets), mask)) == 0.0
