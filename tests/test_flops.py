"""The matmul FLOP counter (`poad_jax.core.flops`) against a hand count and against the
matmuls the code actually traces.

- A made-up tiny config counted by hand, pass by pass.
- Every pass the loop runs (the policy's forward, the sampler's prefill,
  decode step and TWOSOME scoring, the behaviour pass and the whole learner
  update under each remat policy) against the sum of 2 x (output size) x
  (contracted size) over the `dot_general`s of its jaxpr (scans counted
  `length` times), LoRA's matmuls left out: they are the ones with an operand
  dimension equal to the LoRA rank, chosen to occur nowhere else.
- The sampler adds up what its calls ran.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from poad_jax.core import flops
from poad_jax.run.config import learner_config, rollout_config
from poad_jax.agent.learner import build_update, init_train_state
from poad_jax.agent.methods import GroupRelative, make_method
from poad_jax.core.group_advantages import GroupConfig
from poad_jax.models.config import LlamaConfig, LoraConfig
from poad_jax.models.decode import init_cache, unstack_weights
from poad_jax.models.tiny import tiny_random_model
from poad_jax.core.critic_config import CriticConfig
from poad_jax.core.policy import PackedRows, ValueHead, action_logprobs, split_policy
from poad_jax.agent.rollout import StepRecord
from poad_jax.agent.experience import behaviour_statistics, make_token_batch, pack_batch
from poad_jax.sampling import Sampler, SamplingConfig
from poad_jax.sampling.loop import left_pad, prefill
from poad_jax.sampling.scoring import pack_candidates, score_candidates

RANK = 5  # LoRA rank of the traced models: no other dimension of the tests' matmuls is 5
HEAD = (24,)


def dot_flops(jaxpr, skip_size: int | None = RANK) -> int:
    """2 x prod(output shape) x prod(contracted sizes) over the jaxpr's dot_generals,
    sub-jaxprs included (a scan's body `length` times); dots with an operand
    dimension equal to `skip_size` (LoRA's) left out.  No while loops allowed
    (their trip count is not in the jaxpr)."""
    total = 0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        assert name != "while", "a while loop's trip count is unknown"
        if name == "dot_general":
            (contracting, _), _ = eqn.params["dimension_numbers"]
            shapes = [v.aval.shape for v in eqn.invars]
            if skip_size is None or all(skip_size not in shape for shape in shapes):
                total += 2 * math.prod(eqn.outvars[0].aval.shape) * math.prod(shapes[0][d] for d in contracting)
            continue
        times = eqn.params.get("length", 1) if name == "scan" else 1
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else [value]:
                inner = sub.jaxpr if hasattr(sub, "jaxpr") and hasattr(sub.jaxpr, "eqns") else sub
                if hasattr(inner, "eqns"):
                    total += times * dot_flops(inner, skip_size)
    return total


def traced_flops(fn, *args, skip_size: int | None = RANK) -> int:
    return dot_flops(jax.make_jaxpr(fn)(*args).jaxpr, skip_size)


def model_and_policy(remat="full", lora=True):
    model, tokenizer = tiny_random_model(lora=LoraConfig(rank=RANK) if lora else None, remat=remat)
    head = ValueHead(model.config.hidden_size, CriticConfig(hidden_sizes=HEAD), rngs=nnx.Rngs(1))
    return model, tokenizer, split_policy(model, head)


# ---------------------------------------------------------------------------
# By hand.


def test_a_tiny_config_counted_by_hand():
    """1 layer, H 4, 2 query heads and 1 KV head of width 2 (Q 4, K 2), MLP 6, vocabulary 10;
    2 rows of 3 tokens, logits at 1 column."""
    config = LlamaConfig(vocab_size=10, hidden_size=4, intermediate_size=6, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=2)
    got = flops.pass_flops(config, flops.Pass(rows=2, length=3, logit_columns=1))
    # q 4x4, k 4x2, v 4x2, o 4x4 = 48 weights, gate and up 4x6 = 48: 96 per token, 6 tokens, x2
    assert got.projections == 2 * 96 * 6 == 1152
    assert got.mlp_output == 2 * 24 * 6 == 288  # down 6x4
    assert got.scores == got.values == 2 * 4 * 6 * 3 == 144  # Q 4 x 6 queries x 3 keys each
    assert got.output == 2 * 4 * 10 * 2 == 160  # H x V at 1 column of 2 rows
    assert got.total == 1152 + 288 + 144 + 144 + 160
    # Training with remat "full": projections 3x, down 2x, attention 4x, output 2x.
    assert flops.training_flops(config, flops.Pass(2, 3, 1), "full") == 3 * 1152 + 2 * 288 + 4 * 288 + 2 * 160
    # One decode step of 2 rows over 5 cache slots: scores 2 x Q 4 x 2 queries x 5 keys.
    step = flops.pass_flops(config, flops.Pass(2, 1, 1, keys=5))
    assert (step.projections, step.scores, step.output) == (2 * 96 * 2, 2 * 4 * 2 * 5, 160)
    # Head 4 -> 24 -> 1 over 5 inputs: forward 2 x 5 x (96 + 24); training adds weight
    # gradients (the same again) and the second layer's input gradient (2 x 5 x 24).
    assert flops.head_flops(4, HEAD, 5) == 1200
    assert flops.head_training_flops(4, HEAD, 5) == 1200 + 1200 + 2 * 5 * 24


# ---------------------------------------------------------------------------
# Against the traced matmuls.


def token_rows(rows=2, prompt=5, action=4):
    tokens = jnp.ones((rows, prompt + action), jnp.int32)
    positions = jnp.tile(jnp.arange(prompt + action), (rows, 1))
    return tokens, positions, jnp.ones((rows, prompt + action), bool)


def test_the_policy_forward_is_the_traced_count():
    model, _, (graph, frozen, params) = model_and_policy()
    tokens, positions, mask = token_rows()
    traced = traced_flops(lambda f: action_logprobs(graph, f, params["actor"], PackedRows(tokens, positions, mask, 5), 1.0), frozen)
    assert traced == flops.pass_flops(model.config, flops.Pass(2, 9, 4)).total


@pytest.mark.parametrize("remat", ["none", "dots", "full"])
def test_training_a_pass_is_the_traced_count_of_its_gradient(remat):
    model, _, (graph, frozen, params) = model_and_policy(remat)
    tokens, positions, mask = token_rows()
    loss = lambda lora: action_logprobs(graph, frozen, lora, PackedRows(tokens, positions, mask, 5), 1.0)[0].sum()
    traced = traced_flops(jax.grad(loss), params["actor"])
    # one device: the logits go row by row and the backward recomputes the output layer
    assert traced == flops.training_flops(model.config, flops.Pass(2, 9, 4), remat, output_recomputed=True)


def test_the_samplers_passes_are_the_traced_counts():
    model, _, _ = model_and_policy(lora=False)
    config, unstacked = model.config, unstack_weights(model)
    tokens, mask = left_pad([[5, 6, 7], [8, 9, 10, 11, 12]], 2, 8)
    traced = traced_flops(lambda t, m: prefill(model, unstacked, t, m, 2, 16, jnp.float32, 8), tokens, mask,
                          skip_size=None)
    assert traced == flops.prefill_flops(config, 2, 8)

    cache = init_cache(config, 2, 16, jnp.float32)
    step = lambda c: model(jnp.ones((2, 1), jnp.int32), jnp.ones((2, 1), jnp.int32), jnp.ones((2, 16), bool), c,
                           unstacked=unstacked).logits
    assert traced_flops(step, cache, skip_size=None) == flops.decode_flops(config, 2, 1, 16)

    actions, action_mask, normalizer, candidate_mask = pack_candidates([[[5], [6, 7]], [[8, 9]]], [1.0, 1.0], 2, 2, 4)
    score = lambda t: score_candidates(model, unstacked, t, mask, actions, action_mask, normalizer, candidate_mask)
    assert traced_flops(score, tokens, skip_size=None) == flops.scoring_flops(config, 2, 8, 2, 4)


def records(method_name, rows=4):
    """Step records of 2 threads x 2 steps: prompts of 5-9 tokens, actions of 2-4 of 3 candidates."""
    rng = np.random.default_rng(0)
    candidates = [[4, 5], [6, 7, 8], [9, 10, 11, 12]]
    steps = []
    for t in range(rows // 2):
        step = []
        for b in range(2):
            chosen = int(rng.integers(3))
            prompt = rng.integers(3, 100, 5 + 2 * t + b).tolist()
            step.append(StepRecord(prompt, candidates[chosen], 1.0, False, candidates, ["a", "b c", "d e f"], chosen))
        steps.append(step)
    return steps, [rng.integers(3, 100, 6).tolist(), rng.integers(3, 100, 7).tolist()]


@pytest.mark.long
@pytest.mark.parametrize("method_name,share_prompt,critic_kind", [
    ("poad", True, "head"), ("twosome", True, "head"), ("twosome", False, "head"), ("poad", True, "lora")])
def test_an_updates_behaviour_pass_and_learner_are_the_traced_counts(method_name, share_prompt, critic_kind):
    model, _, (graph, frozen, params) = model_and_policy()
    if critic_kind == "lora":
        params["critic_lora"] = jax.tree.map(jnp.copy, params["actor"])
    method = make_method(method_name, 0.95, share_prompt=share_prompt)
    steps, next_prompts = records(method_name)
    arrays, next_arrays = pack_batch(steps, next_prompts, method, rollout_config(num_threads=2, rollout_length=2), 0)
    stats_fn = lambda p: behaviour_statistics(graph, frozen, p, p["head"], arrays, next_arrays, method=method,
                                              temperature=1.0, critic_kind=critic_kind)
    traced_behaviour = traced_flops(stats_fn, params)
    batch = make_token_batch(arrays, jax.tree.map(np.asarray, stats_fn(params)))
    lconfig = learner_config(epochs=2, num_minibatches=2, critic_kind=critic_kind)
    update, _ = build_update(graph, method, lconfig)
    state = init_train_state(params, lconfig, jax.random.key(0))
    traced_learner = traced_flops(lambda s: update(s, frozen, batch), state)

    counted = flops.update_flops(
        model.config, method.scheme.passes(batch.tokens.shape, batch.action_len), head_sizes=HEAD,
        next_rows=batch.num_threads, prompt_len=batch.prompt_len, critic_kind=critic_kind, remat="full", epochs=2,
        rowwise_output=True)  # one device: the policy's output layer recomputed in the backward
    assert counted == {"behaviour": traced_behaviour, "learner": traced_learner}


@pytest.mark.parametrize("reference", [False, True], ids=["no-kl", "kl-to-base"])
def test_a_critic_free_updates_passes_are_the_traced_counts(reference):
    model, _, (graph, frozen, params) = model_and_policy()
    method = make_method("grpo", 0.95, group=GroupRelative("grpo", GroupConfig(size=2), 2, 0.95))
    steps, next_prompts = records("poad")
    arrays, next_arrays = pack_batch(steps, next_prompts, method,
                                     rollout_config(num_threads=2, rollout_length=2, group_size=2), 0)
    stats_fn = lambda p: behaviour_statistics(graph, frozen, p, p["head"], arrays, next_arrays, method=method,
                                              temperature=1.0, critic_kind="head", reference_logprobs=reference)
    traced_behaviour = traced_flops(stats_fn, params)
    batch = make_token_batch(arrays, jax.tree.map(np.asarray, stats_fn(params)))
    lconfig = learner_config(epochs=2, num_minibatches=2, ref_kl_coef=0.01 if reference else 0.0)
    update, _ = build_update(graph, method, lconfig)
    traced_learner = traced_flops(lambda s: update(s, frozen, batch), init_train_state(params, lconfig,
                                                                                       jax.random.key(0)))
    counted = flops.update_flops(
        model.config, method.scheme.passes(batch.tokens.shape, batch.action_len), head_sizes=HEAD,
        next_rows=batch.num_threads, prompt_len=batch.prompt_len, critic_kind="none", remat="full", epochs=2,
        reference_logprobs=reference, rowwise_output=True)  # one device: the output layer recomputed backward
    assert counted == {"behaviour": traced_behaviour, "learner": traced_learner}


def test_with_the_samplers_logprobs_the_behaviour_pass_skips_the_policy_forward():
    model, _, (graph, frozen, params) = model_and_policy()
    method = make_method("poad", 0.95)
    steps, next_prompts = records("poad")
    for step in steps:
        for record in step:
            record.sampler_logprobs = [-1.0] * len(record.action_tokens)
    rconfig = rollout_config(num_threads=2, rollout_length=2, behaviour_logprobs="sampler")
    arrays, next_arrays = pack_batch(steps, next_prompts, method, rconfig, 0)
    traced = traced_flops(lambda p: behaviour_statistics(graph, frozen, p, p["head"], arrays, next_arrays,
                                                         method=method, temperature=1.0, critic_kind="head"), params)
    passes = method.scheme.passes(arrays["tokens"].shape, arrays["action_mask"].shape[-1])
    common = dict(head_sizes=HEAD, next_rows=2, prompt_len=arrays["tokens"].shape[-1] - arrays["action_mask"].shape[-1],
                  critic_kind="head", remat="full", epochs=1)
    counted = flops.update_flops(model.config, passes, sampler_logprobs=True, **common)
    assert counted["behaviour"] == traced
    assert counted["behaviour"] < flops.update_flops(model.config, passes, **common)["behaviour"]


def test_the_sampler_adds_up_what_its_calls_ran():
    model, _ = tiny_random_model(lora=None)
    config = model.config
    sampler = Sampler(model, batch_buckets=(4,), prompt_buckets=(8,))
    generated = sampler.generate([[5, 6, 7], [8, 9]], jax.random.key(0), SamplingConfig(max_new_tokens=6))
    steps = max(map(len, generated.tokens))  # the loop runs until the longest row ends
    expected = flops.prefill_flops(config, 4, 8) + flops.decode_flops(config, 4, steps, 8 + 6)
    assert sampler.matmul_flops == expected
    sampler.score_actions_batch([[5, 6, 7]], [[[4], [5, 6]]])
    expected += flops.scoring_flops(config, 4, 8, 4, 4)  # 2 candidates -> batch bucket 4, action bucket 4
    assert sampler.matmul_flops == expected
