"""The shared shape helpers (`poad_jax.core.layout`): bucket rounding, positions from a
mask (NumPy and JAX alike), and the action trie read by both the trie sampler
and the learner's allowed-token tables."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from poad_jax.core.layout import (
    FINE_PROMPT_LIMIT,
    PROMPT_BUCKETS,
    action_trie,
    allowed_next_tokens,
    bucket_size,
    next_power_of_two,
    positions_from_mask,
    prompt_buckets,
)
from poad_jax.agent.rollout import ended_where_prefixes
from poad_jax.sampling import build_action_tries


def test_bucket_rounding():
    assert [bucket_size(n, (4, 8, 16)) for n in (1, 4, 5, 16, 17, 33)] == [4, 4, 8, 16, 32, 48]
    assert [next_power_of_two(n) for n in (1, 2, 3, 5, 64, 65)] == [1, 2, 4, 8, 64, 128]
    assert next_power_of_two(3, 8) == 8 and next_power_of_two(9, 8) == 16


@pytest.mark.parametrize("step", [8, 16, 32, 64])
def test_fine_prompt_buckets_pad_a_short_prompt_by_less_than_one_step(step):
    buckets = prompt_buckets(step)
    assert list(buckets) == sorted(set(buckets))
    for n in range(1, FINE_PROMPT_LIMIT + 1):
        assert 0 <= bucket_size(n, buckets) - n < step
    assert bucket_size(FINE_PROMPT_LIMIT + 1, buckets) == prompt_buckets(0)[4]  # the coarse ladder after the limit


def test_prompt_bucket_step_zero_gives_the_buckets_before_issue_31_and_the_default_is_16():
    assert prompt_buckets(0) == (32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048)
    assert PROMPT_BUCKETS == prompt_buckets(16)
    assert [bucket_size(n, PROMPT_BUCKETS) for n in (54, 61, 76, 84)] == [64, 64, 80, 96]  # VirtualHome's lengths


@pytest.mark.parametrize("step", [-16, 3, 24, 512, 16.0, True])
def test_a_prompt_bucket_step_must_divide_the_fine_limit(step):
    with pytest.raises(ValueError, match="0 or a divisor of 256"):
        prompt_buckets(step)


def test_positions_from_mask_numpy_and_jax_agree():
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 0, 1, 1], [0, 0, 0, 0, 1]], bool)
    expected = np.array([[0, 0, 0, 1, 2], [0, 1, 1, 2, 3], [0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(positions_from_mask(mask), expected)
    np.testing.assert_array_equal(np.asarray(positions_from_mask(jnp.asarray(mask))), expected)
    assert positions_from_mask(mask).dtype == np.int32


def brute_force_options(chosen, candidates, j):
    """Tokens c[j] of the candidates c that share the chosen action's first j tokens."""
    return sorted({c[j] for c in candidates if len(c) > j and list(c[:j]) == list(chosen[:j])})


def test_allowed_next_tokens_follow_the_trie_and_the_brute_force_rule():
    rng = np.random.default_rng(0)
    for _ in range(50):
        candidates = []
        while len(candidates) < rng.integers(1, 7):
            action = [int(t) for t in rng.integers(1, 5, size=rng.integers(1, 5))]
            # no action a strict prefix of another (the sampler needs an end token for that)
            if all(a[: len(action)] != action and action[: len(a)] != a for a in candidates):
                candidates.append(action)
        chosen = candidates[rng.integers(len(candidates))]
        tokens, mask = allowed_next_tokens(chosen, candidates, action_len=6, width=8)
        trie = build_action_tries([candidates], batch=1, end_token_id=None)
        node = 0
        for j in range(6):
            options = tokens[j][mask[j]].tolist()
            if j < len(chosen):
                assert options == brute_force_options(chosen, candidates, j)
                edges = trie.edge_token[0, node][trie.edge_valid[0, node]].tolist()
                assert options == edges  # the sampler's branching at the node it walked to
                node = int(trie.edge_child[0, node][trie.edge_token[0, node] == chosen[j]][0])
            else:
                assert options == []


def test_trie_errors_are_one_line():
    for case in (lambda: action_trie([], None), lambda: action_trie([[1], []], None),
                 lambda: action_trie([[1], [1, 2]], None), lambda: action_trie([[1], [1, 2]], 2),
                 lambda: allowed_next_tokens([3], [[1], [2]], 2, 2)):
        with pytest.raises(ValueError) as info:
            case()
        assert "\n" not in str(info.value)
    nodes = action_trie([[1], [1, 2]], end_token_id=9)  # a prefix action ends on the end token
    assert sorted(nodes[1][0]) == [2, 9]


def test_actions_that_prefix_others_all_end_on_the_end_token_and_then_build_a_trie():
    """A rollout's candidates for a token-level method: where one action's ids are a strict prefix of
    another's ("walk to the pan" / "walk to the pancake" under a tokenizer that splits " pan" "cake"),
    every action gains the end token, the trie builds and offers "end here" where the short one ends."""
    rng = np.random.default_rng(1)
    for _ in range(50):
        candidates = [[int(t) for t in rng.integers(1, 4, size=rng.integers(1, 4))] for _ in range(rng.integers(1, 6))]
        has_prefix = any(a != b and b[: len(a)] == a for a in candidates for b in candidates)
        got = ended_where_prefixes(candidates, 9)
        if has_prefix:
            assert got == [c + [9] for c in candidates]
            tokens, mask = allowed_next_tokens(got[0], got, action_len=5, width=8)
            assert tokens[len(candidates[0])][mask[len(candidates[0])]].tolist().count(9) == 1
        else:
            assert got == candidates  # identical candidates are not prefixes: unchanged
        build_action_tries([got], batch=1, end_token_id=None)
