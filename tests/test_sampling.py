"""Tests for poad_jax.sampling: cached decoding agrees with training-style full
forward passes (so PPO's first ratio is 1), masks agree with NumPy references,
constrained decoding stays inside the trie, and shapes bucket compilations."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from poad_jax.models.llama import Llama, LlamaConfig, LoraConfig
from poad_jax.sampling import (
    ActionScores,
    Sampler,
    SamplingConfig,
    build_action_tries,
    bucket_size,
    sample_tokens,
    top_k_mask,
    top_p_mask,
    trie_action_probs,
)

VOCAB = 48
CONFIG = LlamaConfig(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rope_theta=10000.0,
)
PROMPTS = [[3, 7, 1, 9, 12], [5, 2], [8, 8, 4, 30, 21, 17, 40, 2, 6]]


def make_model(seed: int = 0, matmul_dtype=None) -> Llama:
    """Tiny random model with non-zero LoRA B (so adapters matter), logits scaled
    up so distributions are far from uniform."""
    model = Llama(CONFIG, lora=LoraConfig(rank=4, alpha=8.0), matmul_dtype=matmul_dtype, rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    for name in model.layers.lora_b.keys():
        b = model.layers.lora_b[name]
        b[...] = jnp.asarray(rng.normal(0, 0.05, b[...].shape), jnp.float32)
    model.embed[...] = model.embed[...] * 4.0
    return model


@pytest.fixture(scope="module")
def model():
    return make_model()


@pytest.fixture(scope="module")
def sampler(model):
    return Sampler(model, batch_buckets=(1, 2, 4), prompt_buckets=(8, 16))


FULL_LENGTH = 64  # right padding is invisible to earlier positions (causal)


@nnx.jit
def _full_forward(model, tokens):
    positions = jnp.arange(tokens.shape[1])[None]
    return model(tokens, positions, jnp.ones(tokens.shape, bool)).logits[0]


def full_forward_logits(model, tokens) -> np.ndarray:
    """Training-style forward (no cache, no left padding): logits `[T, V]`."""
    padded = np.zeros((1, FULL_LENGTH), np.int32)
    padded[0, : len(tokens)] = tokens
    return np.asarray(_full_forward(model, jnp.asarray(padded)), np.float64)[: len(tokens)]


def np_log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


# ---------------------------------------------------------------------------
# Log-prob parity with a full forward pass.


def test_sampled_logprobs_equal_full_forward_tempered_log_softmax(model, sampler):
    temperature = 0.7
    config = SamplingConfig(temperature=temperature, max_new_tokens=12)
    gen = sampler.generate(PROMPTS, jax.random.key(3), config)
    for prompt, tokens, logprobs in zip(PROMPTS, gen.tokens, gen.logprobs):
        assert tokens.dtype == np.int32 and logprobs.dtype == np.float32
        assert len(tokens) == len(logprobs) == 12
        logits = full_forward_logits(model, prompt + tokens.tolist())
        reference = np_log_softmax(logits / temperature)
        expected = reference[np.arange(len(prompt) - 1, len(prompt) + 11), tokens]
        np.testing.assert_allclose(logprobs, expected, atol=2e-5, rtol=0)
    assert gen.finish_reasons == ["length"] * 3


def test_greedy_with_cache_equals_argmax_of_repeated_full_forwards(model, sampler):
    gen = sampler.generate(PROMPTS, jax.random.key(0), SamplingConfig(temperature=0, max_new_tokens=10))
    for prompt, tokens, logprobs in zip(PROMPTS, gen.tokens, gen.logprobs):
        sequence = list(prompt)
        expected_lp = []
        for _ in range(10):
            logits = full_forward_logits(model, sequence)[-1]
            sequence.append(int(np.argmax(logits)))
            expected_lp.append(np_log_softmax(logits)[sequence[-1]])
        assert tokens.tolist() == sequence[len(prompt):]
        np.testing.assert_allclose(logprobs, expected_lp, atol=2e-5)


def test_left_padded_batch_gives_each_row_the_result_of_its_prompt_alone(model, sampler):
    greedy = SamplingConfig(temperature=0, max_new_tokens=8)
    batched = sampler.generate(PROMPTS, jax.random.key(0), greedy)
    for b, prompt in enumerate(PROMPTS):
        alone = sampler.generate([prompt], jax.random.key(0), greedy)
        assert alone.tokens[0].tolist() == batched.tokens[b].tolist()
        np.testing.assert_allclose(alone.logprobs[0], batched.logprobs[b], atol=1e-5)
    # Sampling keys are per row, so row 0 does not depend on the other rows.
    sampled = SamplingConfig(temperature=1.0, max_new_tokens=8)
    batched = sampler.generate(PROMPTS, jax.random.key(5), sampled)
    alone = sampler.generate(PROMPTS[:1], jax.random.key(5), sampled)
    assert alone.tokens[0].tolist() == batched.tokens[0].tolist()
    np.testing.assert_allclose(alone.logprobs[0], batched.logprobs[0], atol=1e-5)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_shared_prompts_are_prefilled_once_and_give_every_row_its_own_draws(model, sampler, temperature):
    """`share_prompts`: the rows of a repeated prompt draw what they draw when each prompt is
    prefilled in its own row (per-row keys), the prefill runs the distinct prompts only."""
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[0], PROMPTS[0]]  # three distinct rows fewer
    config = SamplingConfig(temperature=temperature, max_new_tokens=8)
    flops_before = sampler.matmul_flops
    plain = sampler.generate(prompts, jax.random.key(3), config)
    plain_flops, flops_before = sampler.matmul_flops - flops_before, sampler.matmul_flops
    shared = sampler.generate(prompts, jax.random.key(3), dataclasses.replace(config, share_prompts=True))
    assert sampler.matmul_flops - flops_before < plain_flops  # two prompts prefilled, not four
    for b in range(len(prompts)):
        assert shared.tokens[b].tolist() == plain.tokens[b].tolist()
        np.testing.assert_allclose(shared.logprobs[b], plain.logprobs[b], atol=1e-5)
    if temperature:  # rows of one prompt draw apart: each keeps its own key
        assert len({tuple(shared.tokens[b].tolist()) for b in (0, 2, 3)}) > 1


# ---------------------------------------------------------------------------
# Top-k / top-p.


def np_top_k_mask(logits, k):
    kth = np.sort(logits, axis=-1)[:, -k][:, None]
    return logits >= kth


def np_top_p_mask(logits, p):
    mask = np.zeros(logits.shape, bool)
    for b, row in enumerate(logits):
        probs = np.exp(row - row.max())
        probs /= probs.sum()
        order = sorted(range(len(row)), key=lambda i: (-row[i], i))
        mass = 0.0
        for i in order:
            if mass >= p:
                break
            mask[b, i] = True
            mass += probs[i]
    return mask


def test_top_k_and_top_p_masks_match_numpy():
    logits = np.random.default_rng(0).normal(0, 2, (5, 40)).astype(np.float32)
    logits[0, :4] = 3.0  # ties
    for k in (1, 3, 7):
        np.testing.assert_array_equal(np.asarray(top_k_mask(jnp.asarray(logits), k)), np_top_k_mask(logits, k))
    assert np.asarray(top_k_mask(jnp.asarray(logits), 0)).all()
    for p in (0.05, 0.5, 0.9, 0.99):
        np.testing.assert_array_equal(np.asarray(top_p_mask(jnp.asarray(logits), p)), np_top_p_mask(logits, p))


def test_kth_largest_is_numpys_sorted_value_exactly():
    """The bitwise search for top-k's threshold (`kernels.kth_largest`) against NumPy's sort: rows
    with ties, -inf, both zeros, tiny and huge scales, every k from 1 to V."""
    from poad_jax.sampling.kernels import kth_largest

    kth = jax.jit(kth_largest)  # k traced: one compilation per shape
    rng = np.random.default_rng(4)
    for width in (1, 7, 40):
        for trial in range(12):
            x = (rng.normal(size=(3, width)) * rng.choice([1e-30, 1e-3, 1.0, 1e4, 1e30])).astype(np.float32)
            if trial % 3 == 0:
                x = np.round(x)  # ties
            if trial % 4 == 1:
                x[:, : width // 3 + 1] = -np.inf
            if trial % 4 == 2:
                x[:, ::2], x[:, 1::4] = 0.0, -0.0
            for k in range(1, width + 1):
                want = -np.sort(-x, axis=-1)[:, k - 1]
                np.testing.assert_array_equal(np.asarray(kth(jnp.asarray(x), k))[:, 0], want,
                                              err_msg=f"width {width}, trial {trial}, k {k}")


def test_sample_tokens_records_logprob_of_renormalised_masked_distribution():
    logits = np.random.default_rng(1).normal(0, 2, (4, 40)).astype(np.float32)
    temperature, k, p = 0.8, 10, 0.7
    keys = jax.random.split(jax.random.key(0), 4)
    tokens, logprobs = sample_tokens(jnp.asarray(logits), keys, temperature, k, p)
    scaled = logits / temperature
    keep = np_top_k_mask(scaled, k)
    keep &= np_top_p_mask(np.where(keep, scaled, -np.inf), p)
    reference = np_log_softmax(np.where(keep, scaled, -np.inf))
    tokens = np.asarray(tokens)
    assert keep[np.arange(4), tokens].all()
    np.testing.assert_allclose(np.asarray(logprobs), reference[np.arange(4), tokens], atol=1e-5)


def test_policy_logprobs_under_top_k_top_p_are_the_untruncated_policys(model, sampler):
    """`logprobs_of="policy"`: tokens drawn from the nucleus, log-probs of softmax(logits / T) over the whole
    vocabulary (what the learner recomputes), against a NumPy full forward."""
    temperature, k, p = 1.3, 5, 0.8
    config = SamplingConfig(temperature=temperature, top_k=k, top_p=p, max_new_tokens=6, logprobs_of="policy")
    truncated = sampler.generate(PROMPTS, jax.random.key(11), dataclasses.replace(config, logprobs_of="sampled"))
    gen = sampler.generate(PROMPTS, jax.random.key(11), config)
    for prompt, tokens, logprobs, same_draw in zip(PROMPTS, gen.tokens, gen.logprobs, truncated.tokens):
        np.testing.assert_array_equal(tokens, same_draw)  # what is recorded does not change what is drawn
        logits = full_forward_logits(model, prompt + tokens.tolist())[len(prompt) - 1 : -1] / temperature
        reference = np_log_softmax(logits)[np.arange(6), tokens]
        np.testing.assert_allclose(logprobs, reference, atol=2e-5)
    assert not np.allclose(np.concatenate(gen.logprobs), np.concatenate(truncated.logprobs))
    with pytest.raises(ValueError, match="logprobs_of"):
        SamplingConfig(logprobs_of="truncated")


def test_generate_with_top_k_top_p_stays_in_the_nucleus(model, sampler):
    temperature, k, p = 1.3, 5, 0.8
    config = SamplingConfig(temperature=temperature, top_k=k, top_p=p, max_new_tokens=6)
    gen = sampler.generate(PROMPTS, jax.random.key(11), config)
    for prompt, tokens, logprobs in zip(PROMPTS, gen.tokens, gen.logprobs):
        logits = full_forward_logits(model, prompt + tokens.tolist())[len(prompt) - 1 : -1] / temperature
        keep = np_top_k_mask(logits, k)
        keep &= np_top_p_mask(np.where(keep, logits, -np.inf), p)
        reference = np_log_softmax(np.where(keep, logits, -np.inf))
        assert keep[np.arange(6), tokens].all()
        np.testing.assert_allclose(logprobs, reference[np.arange(6), tokens], atol=2e-5)


# ---------------------------------------------------------------------------
# Stopping.


def test_stop_token_ends_row_and_is_kept(model, sampler):
    free = sampler.generate(PROMPTS, jax.random.key(0), SamplingConfig(temperature=0, max_new_tokens=10))
    stop = int(free.tokens[0][3])
    first = int(np.flatnonzero(free.tokens[0] == stop)[0])
    config = SamplingConfig(temperature=0, max_new_tokens=10, stop_token_ids=(stop,))
    gen = sampler.generate(PROMPTS, jax.random.key(0), config)
    assert gen.tokens[0].tolist() == free.tokens[0][: first + 1].tolist()
    assert gen.finish_reasons[0] == "stop_token"
    np.testing.assert_allclose(gen.logprobs[0], free.logprobs[0][: first + 1], atol=1e-6)
    for b in (1, 2):
        hit = np.flatnonzero(free.tokens[b] == stop)
        n = int(hit[0]) + 1 if len(hit) else 10
        assert gen.tokens[b].tolist() == free.tokens[b][:n].tolist()
        assert gen.finish_reasons[b] == ("stop_token" if len(hit) else "length")
    np.testing.assert_array_equal(gen.lengths, [len(t) for t in gen.tokens])


# ---------------------------------------------------------------------------
# Compilation.


def test_compile_count_is_constant_within_buckets_and_across_weight_updates():
    model = make_model(1)
    sampler = Sampler(model, batch_buckets=(2, 4), prompt_buckets=(8,))
    config = SamplingConfig(temperature=1.0, max_new_tokens=4)
    first = sampler.generate([[1, 2, 3], [4]], jax.random.key(0), config)
    count = sampler.compile_count
    assert count == 2  # prefill + decode loop
    sampler.generate([[5, 6], [7, 8, 9, 10, 11]], jax.random.key(1), config)
    sampler.generate([[5]], jax.random.key(1), config)  # batch 1 -> bucket 2
    for name in model.layers.lora_b.keys():  # a PPO update changes the adapters
        b = model.layers.lora_b[name]
        b[...] = b[...] + 0.5
    sampler.set_lora(nnx.state(model, nnx.LoRAParam))
    updated = sampler.generate([[1, 2, 3], [4]], jax.random.key(0), config)
    assert sampler.compile_count == count
    assert not np.allclose(updated.logprobs[0], first.logprobs[0])  # new weights were used
    sampler.generate([[1, 2, 3]] * 3, jax.random.key(0), config)  # batch bucket 4
    assert sampler.compile_count == count + 2


def test_buckets_round_up_and_extend_past_the_largest():
    assert bucket_size(1, (2, 4)) == 2
    assert bucket_size(4, (2, 4)) == 4
    assert bucket_size(9, (2, 4)) == 12


# ---------------------------------------------------------------------------
# Trie-constrained decoding.

CANDIDATES = [
    [[5, 6, 7], [5, 8], [9], [10, 11, 12, 13]],
    [[1], [2, 3], [2, 4]],
    [[20, 21], [22, 23], [20, 24, 25]],
]


def allowed_next_tokens(actions, prefix):
    return sorted({a[len(prefix)] for a in actions if len(a) > len(prefix) and a[: len(prefix)] == prefix})


def test_constrained_samples_are_candidates_with_renormalised_logprobs(model, sampler):
    temperature = 0.8
    seen = [set() for _ in CANDIDATES]
    for seed in range(4):
        gen = sampler.generate_constrained(PROMPTS, CANDIDATES, jax.random.key(seed), temperature)
        for b, (prompt, actions) in enumerate(zip(PROMPTS, CANDIDATES)):
            tokens = gen.tokens[b].tolist()
            assert tokens == actions[gen.action_index[b]]
            seen[b].add(tuple(tokens))
            logits = full_forward_logits(model, prompt + tokens)
            for j, token in enumerate(tokens):
                allowed = allowed_next_tokens(actions, tokens[:j])
                constrained = np_log_softmax(logits[len(prompt) - 1 + j, allowed] / temperature)
                np.testing.assert_allclose(gen.logprobs[b][j], constrained[allowed.index(token)], atol=2e-5)
    assert sum(len(s) for s in seen) > len(CANDIDATES)  # it does sample, not always the same


@pytest.mark.long
def test_constrained_action_probs_equal_the_sampled_actions_logprobs(sampler):
    """`constrained_action_probs` (prefix sums through `trie_action_probs`) is the distribution
    `generate_constrained` draws from: each drawn action's summed log-probs equal log pi_trie(a), and
    pi_trie sums to 1 over the candidates."""
    for b, (prompt, actions) in enumerate(zip(PROMPTS, CANDIDATES)):
        probs = sampler.constrained_action_probs(prompt, actions)
        assert probs.shape == (len(actions),) and abs(probs.sum() - 1.0) < 1e-5
        for seed in range(3):
            gen = sampler.generate_constrained([prompt], [actions], jax.random.key(seed), temperature=1.0)
            np.testing.assert_allclose(np.sum(gen.logprobs[0]), np.log(probs[gen.action_index[0]]), atol=5e-5)
    with pytest.raises(ValueError, match="prefix"):
        sampler.constrained_action_probs(PROMPTS[0], [[5], [5, 6]])


def test_trie_action_probs_is_the_product_of_renormalised_token_probabilities():
    """A hand-built case: tokens p(1)=.5, p(2)=.3 at the root (other tokens .2); after 1: p(3)=.2, p(4)=.6."""
    logp = {(1,): np.log(0.5), (2,): np.log(0.3), (1, 3): np.log(0.5 * 0.2), (1, 4): np.log(0.5 * 0.6)}
    probs = trie_action_probs(logp, [[1, 3], [1, 4], [2]])
    np.testing.assert_allclose(probs, [0.5 / 0.8 * 0.25, 0.5 / 0.8 * 0.75, 0.3 / 0.8])


def test_constrained_greedy_picks_the_best_allowed_token(model, sampler):
    gen = sampler.generate_constrained(PROMPTS, CANDIDATES, jax.random.key(0), temperature=0.0)
    for b, (prompt, actions) in enumerate(zip(PROMPTS, CANDIDATES)):
        prefix = []
        while not any(prefix == a for a in actions):
            allowed = allowed_next_tokens(actions, prefix)
            logits = full_forward_logits(model, prompt + prefix)[-1]
            prefix.append(allowed[int(np.argmax(logits[allowed]))])
        assert gen.tokens[b].tolist() == prefix


def test_constrained_prefix_actions_use_the_end_token(model, sampler):
    end = 0
    candidates = [[[5], [5, 6], [5, 6, 7]]] * 2
    with pytest.raises(ValueError, match="prefix"):
        sampler.generate_constrained(PROMPTS[:2], candidates, jax.random.key(0))
    counts = np.zeros(3, int)
    for seed in range(6):
        gen = sampler.generate_constrained(PROMPTS[:2], candidates, jax.random.key(seed), 2.0, end_token_id=end)
        for b in range(2):
            action = candidates[b][gen.action_index[b]]
            tokens = gen.tokens[b].tolist()
            counts[gen.action_index[b]] += 1
            assert tokens in (action + [end], action)
            assert tokens == action or len(action) < 3  # only shorter actions need the end token
            assert len(gen.logprobs[b]) == len(tokens)
            if tokens[-1] == end:
                logits = full_forward_logits(model, PROMPTS[b] + tokens)[len(PROMPTS[b]) - 1 + len(action)]
                allowed = sorted([end, 6 if len(action) == 1 else 7])
                reference = np_log_softmax(logits[allowed] / 2.0)[allowed.index(end)]
                np.testing.assert_allclose(gen.logprobs[b][-1], reference, atol=2e-5)
    assert (counts > 0).sum() >= 2


def test_action_trie_tables():
    trie = build_action_tries([[[5, 6], [5, 7], [9]]], batch=2, end_token_id=None)
    root = trie.edge_token[0, 0][trie.edge_valid[0, 0]].tolist()
    assert root == [5, 9]
    child_of_5 = trie.edge_child[0, 0, 0]
    assert trie.edge_token[0, child_of_5][trie.edge_valid[0, child_of_5]].tolist() == [6, 7]
    assert sorted(trie.node_action[0][trie.node_action[0] >= 0].tolist()) == [0, 1, 2]
    assert trie.max_depth == 2
    assert trie.edge_valid[1, 0].sum() == 1  # dummy row


# ---------------------------------------------------------------------------
# TWOSOME action scoring.


def test_score_actions_matches_full_forward_and_normalises(model, sampler):
    prompt = PROMPTS[0]
    actions = [[4, 5], [6], [7, 8, 9], [10, 11, 12, 13, 14]]
    texts = ["pick up", "wait", "go to the", "put it"]
    sums = []
    for action in actions:
        logprobs = np_log_softmax(full_forward_logits(model, prompt + action))
        sums.append(sum(logprobs[len(prompt) - 1 + j, t] for j, t in enumerate(action)))
    sums = np.array(sums)
    scores = sampler.score_actions(prompt, actions)
    assert isinstance(scores, ActionScores)
    np.testing.assert_allclose(scores.token_logprob_sums, sums, atol=5e-5)
    np.testing.assert_allclose(scores.normalized_logprobs, sums / [2, 1, 3, 5], atol=5e-5)
    reference = np.exp(sums / [2, 1, 3, 5])
    np.testing.assert_allclose(scores.probs, reference / reference.sum(), atol=1e-5)
    words = sampler.score_actions(prompt, actions, normalization="word", action_texts=texts)
    np.testing.assert_allclose(words.normalized_logprobs, sums / [2, 1, 3, 2], atol=5e-5)
    np.testing.assert_allclose(words.probs.sum(), 1.0, atol=1e-6)
    with pytest.raises(ValueError, match="action_texts"):
        sampler.score_actions(prompt, actions, normalization="word")
    with pytest.raises(ValueError, match="normalization"):
        sampler.score_actions(prompt, actions, normalization="chars")


# ---------------------------------------------------------------------------
# Bad input.


def test_bad_input_gives_one_line_value_errors(model, sampler):
    key = jax.random.key(0)
    config = SamplingConfig(max_new_tokens=2)
    cases = [
        lambda: sampler.generate([], key, config),
        lambda: sampler.generate(["hello"], key, config),
        lambda: sampler.generate([[]], key, config),
        lambda: sampler.generate([[VOCAB]], key, config),
        lambda: SamplingConfig(temperature=-1),
        lambda: SamplingConfig(top_p=0),
        lambda: SamplingConfig(top_k=-2),
        lambda: SamplingConfig(max_new_tokens=0),
        lambda: sampler.generate_constrained([[1]], [[]], key),
        lambda: sampler.generate_constrained([[1]], [[[1], []]], key),
        lambda: sampler.generate_constrained([[1]], [[[1]], [[2]]], key),
        lambda: sampler.generate_constrained([[1]], [["go"]], key),
        lambda: sampler.score_actions([1], []),
        lambda: Sampler(model, batch_buckets=()),
    ]
    for case in cases:
        with pytest.raises(ValueError) as info:
            case()
        assert "\n" not in str(info.value)


def test_one_token_prompt_in_a_one_slot_bucket(model):
    sampler = Sampler(model, batch_buckets=(1,), prompt_buckets=(1, 8))
    gen = sampler.generate([[7]], jax.random.key(0), SamplingConfig(temperature=0, max_new_tokens=3))
    sequence = [7]
    for _ in range(3):
        sequence.append(int(np.argmax(full_forward_logits(model, sequence)[-1])))
    assert gen.tokens[0].tolist() == sequence[1:]


# ---------------------------------------------------------------------------
# Unstacked layer weights (the default) against the scan over stacked weights.


@pytest.mark.long
@pytest.mark.parametrize("matmul_dtype", [None, jnp.bfloat16])
def test_unstacked_and_scanned_samplers_agree(matmul_dtype):
    model = make_model(2, matmul_dtype)  # bfloat16 matmuls: a bfloat16 cache by default too
    unstacked = Sampler(model, batch_buckets=(4,), prompt_buckets=(16,))
    scanned = Sampler(model, batch_buckets=(4,), prompt_buckets=(16,), unstack_layers=False)
    assert unstacked.cache_dtype == (jnp.bfloat16 if matmul_dtype is not None else jnp.float32)
    for config in (SamplingConfig(temperature=0, max_new_tokens=10), SamplingConfig(temperature=0.8, max_new_tokens=10)):
        a = unstacked.generate(PROMPTS, jax.random.key(4), config)
        b = scanned.generate(PROMPTS, jax.random.key(4), config)
        for x, y, lx, ly in zip(a.tokens, b.tokens, a.logprobs, b.logprobs):
            assert x.tolist() == y.tolist()
            np.testing.assert_allclose(lx, ly, atol=1e-5, rtol=0)
    candidates = [[[1, 2], [1, 3, 5], [7]]] * len(PROMPTS)
    a = unstacked.generate_constrained(PROMPTS, candidates, jax.random.key(1), 0.0)
    b = scanned.generate_constrained(PROMPTS, candidates, jax.random.key(1), 0.0)
    assert a.action_index.tolist() == b.action_index.tolist()
    actions = [[1, 2], [3, 4, 5], [6]]
    np.testing.assert_allclose(unstacked.score_actions(PROMPTS[0], actions).token_logprob_sums,
                               scanned.score_actions(PROMPTS[0], actions).token_logprob_sums, atol=1e-5)


def test_released_copies_are_made_again_from_the_samplers_own_base_and_sample_the_same():
    """`release_copies` frees the per-layer copies (the learner's phase runs without them); the next call
    makes them again from the sampler's own base, not the model's later edits, and samples the same tokens."""
    model = make_model(3)
    sampler = Sampler(model, batch_buckets=(4,), prompt_buckets=(16,))
    config = SamplingConfig(temperature=0.7, max_new_tokens=6)
    before = sampler.generate(PROMPTS, jax.random.key(0), config)
    sampler.release_copies()
    assert sampler.unstacked is None
    w = model.layers.weights["up_proj"]
    w[...] = w[...] * 1.5  # the model's base changes: the sampler's own does not
    after = sampler.generate(PROMPTS, jax.random.key(0), config)
    assert sampler.unstacked is not None
    for a, b in zip(before.tokens, after.tokens):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(before.logprobs, after.logprobs):
        np.testing.assert_array_equal(a, b)


def test_set_lora_keeps_the_unstacked_copy_and_the_new_adapters_are_used():
    model = make_model(3)
    sampler = Sampler(model, batch_buckets=(4,), prompt_buckets=(16,))
    greedy = SamplingConfig(temperature=0, max_new_tokens=6)
    before = sampler.generate(PROMPTS, jax.random.key(0), greedy)
    copy, count = sampler.unstacked, sampler.compile_count
    for name in model.layers.lora_b.keys():  # a PPO update: adapters change, the base does not
        model.layers.lora_b[name][...] = model.layers.lora_b[name][...] + 0.3
    untold = sampler.generate(PROMPTS, jax.random.key(0), greedy)  # the sampler holds its own state
    np.testing.assert_array_equal(untold.logprobs[0], before.logprobs[0])
    sampler.set_lora(nnx.state(model, nnx.LoRAParam))
    after_lora = sampler.generate(PROMPTS, jax.random.key(0), greedy)
    assert sampler.unstacked is copy and sampler.compile_count == count
    logits = full_forward_logits(model, PROMPTS[0] + after_lora.tokens[0].tolist())
    expected = np_log_softmax(logits)[np.arange(len(PROMPTS[0]) - 1, len(PROMPTS[0]) + 5), after_lora.tokens[0]]
    np.testing.assert_allclose(after_lora.logprobs[0], expected, atol=2e-5)
    w = model.layers.weights["up_proj"]  # new base weights: a new sampler, and they are used
    w[...] = w[...] * 1.5
    after_base = Sampler(model, batch_buckets=(4,), prompt_buckets=(16,)).generate(PROMPTS, jax.random.key(0), greedy)
    logits = full_forward_logits(model, PROMPTS[0] + after_base.tokens[0].tolist())
    expected = np_log_softmax(logits)[np.arange(len(PROMPTS[0]) - 1, len(PROMPTS[0]) + 5), after_base.tokens[0]]
    np.testing.assert_allclose(after_base.logprobs[0], expected, atol=2e-5)
    with pytest.raises(ValueError, match="structure"):
        sampler.set_lora({"lora_b": jnp.zeros(3)})
