"""TWOSOME with each state's prompt encoded once equals the per-candidate computation.

The shared path packs `prompt | candidate 0 | ... | candidate K-1` into one
row and masks the candidates from each other; the reference runs every
candidate as its own `prompt + action` row (`Method.share_prompt=False`).
Both must give the same numbers (float32, float-rounding tolerances) for:
the candidates' token log-probs, TWOSOME's normalised action log-probs (token
and word normalisation), the behaviour statistics, the learner's outputs and
its gradients.  The batches mix candidates of different token counts and
states with different numbers of candidates (padding candidates included).

(`--config.share_prompt`, action level; token-level rows that share a prompt prefix
are `--config.prefix_packing`, tests/test_prefix_packing.py.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from poad_jax.run.config import learner_config, rollout_config
from poad_jax.agent.learner import jit_update, init_train_state, policy_outputs
from poad_jax.agent.methods import make_method
from poad_jax.models.tiny import tiny_random_model
from poad_jax.core.critic_config import CriticConfig
from poad_jax.core.policy import (
    ValueHead,
    action_level_log_policy,
    PackedRows,
    candidate_token_logprobs,
    shared_prompt_visibility,
    split_policy,
)
from poad_jax.agent.rollout import StepRecord
from poad_jax.agent.experience import behaviour_statistics, make_token_batch, pack_batch
from poad_jax.sampling import Sampler

WORDS = ["walk to the red door.", "open", "pick up the pancake", "go, go", "heat microwave on", "turn off."]


def random_steps(tokenizer, threads: int, steps: int, seed: int) -> tuple[list[list[StepRecord]], list[list[int]]]:
    """Records with prompts of 3..12 tokens and 1..5 candidates of 1..4 words each."""
    rng = np.random.default_rng(seed)
    vocab = range(5, tokenizer.vocab_size)
    out = []
    for _ in range(steps):
        records = []
        for _ in range(threads):
            prompt = [int(t) for t in rng.choice(vocab, size=rng.integers(3, 13))]
            texts = [WORDS[i] for i in rng.choice(len(WORDS), size=rng.integers(1, 6), replace=False)]
            candidates = [tokenizer.encode(" " + text) for text in texts]
            chosen = int(rng.integers(len(candidates)))
            records.append(StepRecord(prompt, candidates[chosen], float(rng.normal()), bool(rng.random() < 0.2),
                                      candidates, texts, chosen))
        out.append(records)
    next_prompts = [[int(t) for t in rng.choice(vocab, size=rng.integers(3, 13))] for _ in range(threads)]
    return out, next_prompts


def rich_policy(seed: int = 0, matmul_dtype=None):
    """A tiny model split for the learner, with adapters that change the logits (so their gradients are
    rich) and a value head whose output layer is not zero: (graph, frozen, params, tokenizer)."""
    model, tokenizer = tiny_random_model(seed=seed, matmul_dtype=matmul_dtype)
    rng = np.random.default_rng(seed)
    for name in model.layers.lora_b.keys():
        b = model.layers.lora_b[name]
        b[...] = jnp.asarray(rng.normal(0, 0.2, b[...].shape), jnp.float32)
    head = ValueHead(model.config.hidden_size, CriticConfig(hidden_sizes=(16,)), rngs=nnx.Rngs(1))
    head.out.kernel[...] = jnp.asarray(rng.normal(0, 0.5, head.out.kernel[...].shape), jnp.float32)
    return (*split_policy(model, head), tokenizer)


def setup(normalization: str, seed: int = 0, matmul_dtype=None):
    graph, frozen, params, tokenizer = rich_policy(seed, matmul_dtype)
    steps, next_prompts = random_steps(tokenizer, threads=2, steps=4, seed=seed)
    config = rollout_config(num_threads=2, rollout_length=4, prompt_format="raw", twosome_normalization=normalization)
    arrays, next_arrays = pack_batch(steps, next_prompts, make_method("twosome", 0.95), config, tokenizer.pad_token_id)
    return graph, frozen, params, arrays, next_arrays


def test_the_batch_mixes_candidate_counts_and_lengths():
    _, _, _, arrays, _ = setup("token")
    counts = arrays["candidate_mask"].sum(-1)
    lengths = arrays["action_mask"].sum(-1)[arrays["candidate_mask"]]
    assert len(set(counts.tolist())) > 2 and counts.min() < arrays["candidate_mask"].shape[1]
    assert len(set(lengths.tolist())) > 2
    # Every candidate row of a state repeats the state's prompt columns: what sharing relies on.
    prompt_len = arrays["tokens"].shape[-1] - arrays["action_mask"].shape[-1]
    prompts = arrays["tokens"][:, :, :prompt_len]
    np.testing.assert_array_equal(prompts, np.broadcast_to(prompts[:, :1], prompts.shape))


def test_visibility_is_prompt_plus_own_block():
    visible = np.asarray(shared_prompt_visibility(prompt_len=3, num_candidates=2, action_len=2))[0]
    expected = np.array([
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 0, 0, 1, 1],
        [1, 1, 1, 0, 0, 1, 1],
    ], bool)
    np.testing.assert_array_equal(visible, expected)  # the model ANDs it with the causal rule


@pytest.mark.parametrize("normalization", ["token", "word"])
def test_token_and_action_logprobs_equal_the_per_candidate_computation(normalization):
    graph, frozen, params, arrays, _ = setup(normalization)
    prompt_len = arrays["tokens"].shape[-1] - arrays["action_mask"].shape[-1]
    args = (graph, frozen, params["actor"],
            PackedRows(*(jnp.asarray(arrays[k]) for k in ("tokens", "positions", "key_mask")), prompt_len))
    per_candidate = np.asarray(candidate_token_logprobs(*args, share_prompt=False))
    shared = np.asarray(candidate_token_logprobs(*args, share_prompt=True))
    mask = arrays["action_mask"] & arrays["candidate_mask"][..., None]
    assert np.abs(per_candidate[mask]).min() > 0.1  # real log-probs, not zeros
    np.testing.assert_allclose(shared[mask], per_candidate[mask], rtol=1e-5, atol=1e-5)
    policy = lambda lp: np.asarray(action_level_log_policy(
        jnp.asarray(lp), arrays["action_mask"], arrays["normalizer"], arrays["candidate_mask"]))
    np.testing.assert_allclose(policy(shared), policy(per_candidate), rtol=1e-5, atol=1e-5)
    if normalization == "word":  # word counts differ from token counts here, so the normaliser matters
        real = arrays["candidate_mask"]
        assert not np.array_equal(arrays["normalizer"][real], arrays["action_mask"].sum(-1)[real])


@pytest.mark.parametrize("normalization", ["token", "word"])
def test_behaviour_statistics_equal_the_per_candidate_computation(normalization):
    graph, frozen, params, arrays, next_arrays = setup(normalization)
    stats = {
        share: behaviour_statistics(
            graph, frozen, params, params["head"], arrays, next_arrays,
            method=make_method("twosome", 0.95, share_prompt=share), temperature=1.0, critic_kind="head",
        )
        for share in (True, False)
    }
    for key in ("old_logprobs", "features", "old_values", "bootstrap_value"):
        np.testing.assert_allclose(np.asarray(stats[True][key]), np.asarray(stats[False][key]),
                                   rtol=1e-5, atol=1e-5, err_msg=key)


@pytest.mark.long
@pytest.mark.parametrize("critic_kind", ["head", "lora"])
def test_learner_outputs_and_gradients_equal_the_per_candidate_computation(critic_kind):
    graph, frozen, params, arrays, next_arrays = setup("token", seed=1)
    if critic_kind == "lora":
        params = dict(params, critic_lora=jax.tree.map(lambda x: x * 0.5, params["actor"]))
    shared_method = make_method("twosome", 0.95)
    stats = behaviour_statistics(graph, frozen, params, params["head"], arrays, next_arrays,
                                 method=shared_method, temperature=1.0, critic_kind=critic_kind)
    batch = make_token_batch(arrays, stats)
    config = learner_config(gamma=0.95, critic_kind=critic_kind)
    rng = np.random.default_rng(2)
    advantages = jnp.asarray(rng.normal(size=batch.rewards.shape), jnp.float32)
    returns = jnp.asarray(rng.normal(size=batch.rewards.shape), jnp.float32)

    def loss(p, method):
        logprobs, entropy, values, _ = policy_outputs(graph, frozen, p, batch, method, config)
        return jnp.sum(advantages * logprobs) + 0.1 * jnp.sum(entropy) + jnp.sum((values - returns) ** 2)

    outputs, grads = {}, {}
    for share in (True, False):
        method = make_method("twosome", 0.95, share_prompt=share)
        outputs[share] = policy_outputs(graph, frozen, params, batch, method, config)
        grads[share] = jax.grad(loss)(params, method)
    for a, b in zip(outputs[True], outputs[False]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
    flat_shared = jax.tree_util.tree_leaves_with_path(grads[True])
    flat_reference = jax.tree.leaves(grads[False])
    assert len(flat_shared) == len(flat_reference)
    for (path, a), b in zip(flat_shared, flat_reference):
        a, b = np.asarray(a), np.asarray(b)
        scale = max(np.abs(b).max(), 1e-12)
        assert np.abs(b).max() > 0, jax.tree_util.keystr(path)  # every trained parameter gets a gradient
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * scale, err_msg=jax.tree_util.keystr(path))


def test_whole_update_agrees_and_first_ratio_is_one_with_sharing():
    graph, frozen, params, arrays, next_arrays = setup("token", seed=2)
    config = learner_config(gamma=0.95, num_minibatches=2, accumulation_steps=2, actor_lr=1e-3, critic_lr=1e-3)
    metrics = {}
    for share in (True, False):
        method = make_method("twosome", 0.95, share_prompt=share)
        stats = behaviour_statistics(graph, frozen, params, params["head"], arrays, next_arrays,
                                     method=method, temperature=1.0, critic_kind="head")
        batch = make_token_batch(arrays, stats)
        # Compiled, as the learner runs it: op-by-op (eager) execution rounds TWOSOME's shared-prompt
        # log-probs 1 ulp differently on some CPUs (seen on an AVX2-only AMD EPYC), the compiled
        # behaviour pass and learner agree bit for bit.
        logprobs, _, _, _ = jax.jit(policy_outputs, static_argnames=("graph", "method", "config"))(
            graph, frozen, params, batch, method, config)
        np.testing.assert_array_equal(np.asarray(logprobs), np.asarray(batch.old_logprobs))  # ratio exactly 1
        update, _ = jit_update(graph, method, config)
        state = init_train_state(jax.tree.map(jnp.array, params), config, jax.random.key(0))
        _, metrics[share] = update(state, frozen, batch)
    # The policy loss and the KL start at 0 up to rounding (normalised advantages have mean 0, the
    # first ratio is 1): they are compared at the absolute rounding of float32 sums of O(1) terms.
    for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "actor_grad_norm", "critic_grad_norm"):
        np.testing.assert_allclose(float(metrics[True][key]), float(metrics[False][key]), rtol=1e-4, atol=1e-6,
                                   err_msg=key)
    assert float(metrics[True]["actor_grad_norm"]) > 0


def test_batched_scoring_equals_one_prompt_at_a_time_and_the_learner():
    """The sampler scores several states in one call; each equals its own call and
    the learner's action-level policy on the packed batch's rows."""
    model, tokenizer = tiny_random_model(seed=3)
    steps, _ = random_steps(tokenizer, threads=3, steps=1, seed=3)
    records = steps[0]
    sampler = Sampler(model, batch_buckets=(1, 2, 4, 8), prompt_buckets=(16,))
    prompts = [r.prompt for r in records]
    candidates = [r.candidates for r in records]
    texts = [r.candidate_texts for r in records]
    assert len({len(c) for c in candidates}) > 1  # states with different numbers of candidates
    for normalization in ("token", "word"):
        batched = sampler.score_actions_batch(prompts, candidates, normalization, texts)
        for b, scores in enumerate(batched):
            alone = sampler.score_actions(prompts[b], candidates[b], normalization, texts[b])
            assert scores.probs.shape == (len(candidates[b]),)
            for field in ("token_logprob_sums", "normalized_logprobs", "probs"):
                np.testing.assert_allclose(getattr(scores, field), getattr(alone, field), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(scores.probs.sum(), 1.0, atol=1e-5)
    head = ValueHead(model.config.hidden_size, CriticConfig(hidden_sizes=(8,)), rngs=nnx.Rngs(0))
    graph, frozen, params = split_policy(model, head)
    config = rollout_config(num_threads=3, rollout_length=1, prompt_format="raw", twosome_normalization="word")
    arrays, _ = pack_batch(steps, [[5]] * 3, make_method("twosome", 0.95), config, tokenizer.pad_token_id)
    prompt_len = arrays["tokens"].shape[-1] - arrays["action_mask"].shape[-1]
    token_logprobs = candidate_token_logprobs(
        graph, frozen, params["actor"],
        PackedRows(*(jnp.asarray(arrays[k]) for k in ("tokens", "positions", "key_mask")), prompt_len))
    log_pi = np.asarray(action_level_log_policy(
        token_logprobs, arrays["action_mask"], arrays["normalizer"], arrays["candidate_mask"]))
    for b, scores in enumerate(sampler.score_actions_batch(prompts, candidates, "word", texts)):
        np.testing.assert_allclose(np.log(scores.probs), log_pi[b, : len(candidates[b])], rtol=1e-5, atol=1e-5)
