"""The method options of study B (docs/results/virtualhome_options.md), each against a plain NumPy reference:

1. lambda where gamma applies (`ppo.lambda_scope="action"`): `gae.action_lambdas`, `token_gae` with
   per-token lambdas, and BAD's two identities (first token = action-level GAE with V(o); a later token =
   that estimate minus its prefix value);
2. the entropy over the offered continuations (`ppo.entropy_scope="offered"`): `token_policy_terms`;
3. the behaviour correction (`ppo.behaviour_correction="importance"`): the per-token log-probs of an
   action drawn from the action scores (`prefix_token_logprobs`), the truncated importance weights, and
   an update whose weights are all 1 equals the uncorrected one;
4. trie exploration (`trie_explore_temperature`): the recorded behaviour log-probs are the trie's at the
   exploration temperature, and a run with every option on trains end to end and logs its divergences.
"""

from __future__ import annotations

import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from poad_jax.agent import learner as learner_lib
from poad_jax.agent.rollout import prefix_token_logprobs
from poad_jax.core import gae, losses
from poad_jax.core.policy import token_policy_terms
from poad_jax.core.token_batch import CorrectedTokenBatch
from poad_jax.run import config as config_lib
from poad_jax.run import train

REPO = pathlib.Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------
# 1. lambda where gamma applies.


def numpy_token_gae(rewards, values, discounts, valid, bootstrap, lambdas):
    """A plain loop: A_j = r_j + d_j V_next - V_j + d_j lam_j A_next over each row's valid positions."""
    advantages = np.zeros_like(values)
    for b in range(values.shape[0]):
        next_value, next_advantage = bootstrap[b], 0.0
        for j in reversed(range(values.shape[1])):
            if not valid[b, j]:
                continue
            delta = rewards[b, j] + discounts[b, j] * next_value - values[b, j]
            advantages[b, j] = delta + discounts[b, j] * lambdas[b, j] * next_advantage
            next_value, next_advantage = values[b, j], advantages[b, j]
    return advantages


def random_stream(rng, rows=3, actions=5, max_len=4):
    """Token streams of `actions` actions of 1..max_len tokens each with random padding between them."""
    columns = []
    for b in range(rows):
        row = []
        for t in range(actions):
            n = int(rng.integers(1, max_len + 1))
            for j in range(n):
                row.append((True, j == n - 1, t == actions - 1 and b == 0 and j == n - 1, t))
            for _ in range(int(rng.integers(0, 2))):
                row.append((False, False, False, t))
        columns.append(row)
    width = max(len(r) for r in columns)
    valid = np.zeros((rows, width), bool)
    end = np.zeros((rows, width), bool)
    done = np.zeros((rows, width), bool)
    for b, row in enumerate(columns):
        for j, (v, e, d, _) in enumerate(row):
            valid[b, j], end[b, j], done[b, j] = v, e, d
    rewards = np.where(end, rng.normal(size=(rows, width)), 0.0).astype(np.float32)
    values = rng.normal(size=(rows, width)).astype(np.float32)
    bootstrap = rng.normal(size=rows).astype(np.float32)
    return rewards, values, valid, end, done, bootstrap


def test_action_lambdas_are_lam_at_action_ends_and_one_inside():
    end = np.array([[False, True, True, False, False, True]])
    got = np.asarray(gae.action_lambdas(jnp.asarray(end), 0.9))
    np.testing.assert_array_equal(got, np.where(end, np.float32(0.9), np.float32(1.0)))
    with pytest.raises(gae.BackupError):
        gae.action_lambdas(jnp.asarray(end), 1.5)


@pytest.mark.parametrize("gamma_w", [1.0, 0.9])
def test_token_gae_with_per_token_lambdas_equals_a_numpy_loop(gamma_w):
    rng = np.random.default_rng(0)
    rewards, values, valid, end, done, bootstrap = random_stream(rng)
    discounts = np.asarray(gae.action_discounts(jnp.asarray(end), jnp.asarray(done), 0.95, gamma_w))
    lambdas = rng.uniform(0.5, 1.0, size=values.shape).astype(np.float32)
    expected = numpy_token_gae(rewards, values, discounts, valid, bootstrap, lambdas)
    for kernel in (gae.token_gae, gae.token_gae_parallel):
        advantages, returns = kernel(rewards, values, discounts, valid, bootstrap, jnp.asarray(lambdas))
        np.testing.assert_allclose(np.asarray(advantages), expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(returns), np.where(valid, expected + values, 0.0), rtol=1e-5, atol=1e-5)
    # A constant per-token array gives the scalar's numbers exactly.
    scalar, _ = gae.token_gae(rewards, values, discounts, valid, bootstrap, 0.8)
    full, _ = gae.token_gae(rewards, values, discounts, valid, bootstrap, jnp.full(values.shape, 0.8, jnp.float32))
    np.testing.assert_array_equal(np.asarray(scalar), np.asarray(full))


def test_bad_with_action_lambdas_gives_action_level_gae_at_each_first_token():
    """BAD's discounts with lambda only where gamma applies:
        A_t^1 = action-level GAE of V(o_t) = V_t^1,   A_t^j = A_t^1 + V_t^1 - V_t^j."""
    rng = np.random.default_rng(1)
    rewards, values, valid, end, done, bootstrap = random_stream(rng, rows=4, actions=6)
    gamma, lam = 0.95, 0.9
    discounts = gae.action_discounts(jnp.asarray(end), jnp.asarray(done), gamma, 1.0)
    advantages, _ = gae.token_gae(rewards, values, discounts, valid, bootstrap,
                                  gae.action_lambdas(jnp.asarray(end), lam))
    advantages = np.asarray(advantages)
    for b in range(values.shape[0]):
        positions = np.flatnonzero(valid[b])
        starts = [p for i, p in enumerate(positions) if i == 0 or end[b, positions[i - 1]]]
        ends = [p for p in positions if end[b, p]]
        # Action-level GAE over (V(o_t) = V_t^1, r_t, done_t), in NumPy.
        v_o = values[b, starts]
        r = rewards[b, ends]
        d = gamma * (1.0 - done[b, ends])
        action_adv = np.zeros(len(starts))
        next_value, next_adv = bootstrap[b], 0.0
        for t in reversed(range(len(starts))):
            action_adv[t] = r[t] + d[t] * next_value - v_o[t] + d[t] * lam * next_adv
            next_value, next_adv = v_o[t], action_adv[t]
        np.testing.assert_allclose(advantages[b, starts], action_adv, rtol=1e-5, atol=1e-5)
        for t, (start, stop) in enumerate(zip(starts, ends)):
            inside = [p for p in positions if start <= p <= stop]
            np.testing.assert_allclose(advantages[b, inside], action_adv[t] + values[b, start] - values[b, inside],
                                       rtol=1e-5, atol=1e-5)
    # With lambda per token instead, the first token's advantage is not the action-level one.
    per_token, _ = gae.token_gae(rewards, values, discounts, valid, bootstrap, lam)
    assert not np.allclose(np.asarray(per_token), advantages, atol=1e-3)


# ---------------------------------------------------------------------------
# 2. Entropy over the offered continuations.


def test_token_policy_terms_equal_numpy_softmaxes_over_the_vocabulary_and_the_offered_tokens():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(2, 3, 11)).astype(np.float32) * 2
    allowed = np.array([[[1, 4, 0], [2, 0, 0], [0, 0, 0]], [[5, 6, 7], [3, 9, 0], [8, 0, 0]]], np.int32)
    mask = np.array([[[1, 1, 0], [1, 0, 0], [0, 0, 0]], [[1, 1, 1], [1, 1, 0], [1, 0, 0]]], bool)
    tokens = np.array([[4, 2, 10], [6, 9, 8]], np.int32)
    terms = token_policy_terms(jnp.asarray(logits), jnp.asarray(tokens), jnp.asarray(allowed), jnp.asarray(mask))

    def log_softmax(x):
        x = x.astype(np.float64) - x.max()
        return x - np.log(np.exp(x).sum())

    for n in range(2):
        for j in range(3):
            full = log_softmax(logits[n, j])
            np.testing.assert_allclose(terms.logprobs_vocabulary[n, j], full[tokens[n, j]], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(terms.entropy_vocabulary[n, j], -(np.exp(full) * full).sum(), rtol=1e-5)
            ids = allowed[n, j][mask[n, j]]
            if len(ids) == 0:  # unconstrained: offered = vocabulary
                offered_lp, offered_h = full[tokens[n, j]], -(np.exp(full) * full).sum()
            else:
                sub = log_softmax(logits[n, j, ids])
                offered_lp = sub[list(ids).index(tokens[n, j])]
                offered_h = -(np.exp(sub) * sub).sum()
            np.testing.assert_allclose(terms.logprobs_offered[n, j], offered_lp, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(terms.entropy_offered[n, j], offered_h, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# 3. Behaviour correction.


def test_prefix_token_logprobs_marginalise_the_action_distribution_onto_token_prefixes():
    candidates = [[5, 1, 2], [5, 1, 3], [5, 4], [6], [5, 1, 2, 9]]
    probs = np.array([0.1, 0.2, 0.3, 0.15, 0.25])
    for chosen in range(len(candidates)):
        got = prefix_token_logprobs(candidates, probs, chosen)
        action = candidates[chosen]
        # Brute force: the mass of candidates through each prefix, as a dict of tuples.
        mass = {}
        for k, cand in enumerate(candidates):
            for j in range(len(cand) + 1):
                mass[tuple(cand[:j])] = mass.get(tuple(cand[:j]), 0.0) + probs[k]
        expected = [np.log(mass[tuple(action[:j + 1])] / mass[tuple(action[:j])]) for j in range(len(action))]
        np.testing.assert_allclose(got, expected, rtol=1e-12)
    # Chain rule: an action no other extends has total log-prob log mu(a).
    np.testing.assert_allclose(sum(prefix_token_logprobs(candidates, probs, 1)), np.log(0.2), rtol=1e-12)


def test_importance_weights_are_truncated_ratios_of_pi_old_to_mu():
    old = np.log(np.array([0.5, 0.1, 0.9, 0.3], np.float32))
    behaviour = np.log(np.array([0.25, 0.4, 0.3, 0.3], np.float32))
    got = np.asarray(losses.importance_weights(jnp.asarray(old), jnp.asarray(behaviour), 1.5))
    np.testing.assert_allclose(got, np.minimum(np.exp(old) / np.exp(behaviour), 1.5), rtol=1e-6)


def with_behaviour(batch, behaviour_logprobs) -> CorrectedTokenBatch:
    """`batch` (a TokenLevelBatch) as the importance correction's batch, with `behaviour_logprobs`."""
    return CorrectedTokenBatch(**{f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)},
                               behaviour_logprobs=behaviour_logprobs)


@pytest.mark.long
def test_an_update_with_all_weights_one_equals_the_uncorrected_update():
    """The correction only reweights: where mu = pi_old every weight is exactly 1 and the update is the
    uncorrected one; where mu differs, the policy loss changes.  The correction reads a batch type that
    has the behaviour log-probs (`CorrectedTokenBatch`), and refuses one without them."""
    from tests.test_learner import collect_batch

    graph, frozen, params, method, batch, _ = collect_batch("poad", num_threads=2, rollout_length=4)
    rewards = np.random.default_rng(1).normal(size=batch.rewards.shape).astype(np.float32)
    batch = dataclasses.replace(batch, rewards=jnp.asarray(rewards))  # advantages that are not all zero
    base = config_lib.learner_config(num_minibatches=2, epochs=1, target_kl=10.0, actor_lr=1e-3)
    corrected = dataclasses.replace(base, behaviour_correction="importance", importance_weight_clip=2.0)

    def one_update(config, batch):
        state = learner_lib.init_train_state(jax.tree.map(jnp.copy, params), config, jax.random.key(0))
        update, _ = learner_lib.jit_update(graph, method, config)
        return update(state, frozen, batch)

    with pytest.raises(ValueError, match=r"^ppo.behaviour_correction='importance' needs a CorrectedTokenBatch "
                                         r"\(the behaviour log-probs.*got a TokenLevelBatch($|\n)"):
        one_update(corrected, batch)  # the plain batch has no behaviour log-probs: refused while tracing
    same = with_behaviour(batch, batch.old_logprobs)
    state_a, metrics_a = one_update(base, batch)
    state_b, metrics_b = one_update(corrected, same)
    np.testing.assert_allclose(float(metrics_b["importance_weight"]), 1.0, rtol=1e-6)  # a weighted mean of ones
    for a, b in zip(jax.tree.leaves(state_a.params), jax.tree.leaves(state_b.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert float(metrics_b["behaviour_kl_token"]) == 0.0
    shift = jnp.asarray(np.random.default_rng(0).uniform(0.0, 1.0, size=batch.old_logprobs.shape), jnp.float32)
    shifted = with_behaviour(batch, batch.old_logprobs + shift)
    state_c, metrics_c = one_update(corrected, shifted)
    mask = np.asarray(batch.action_mask)
    np.testing.assert_allclose(float(metrics_c["behaviour_kl_token"]), np.asarray(shift)[mask].mean(), rtol=1e-5)
    assert float(metrics_c["importance_weight"]) < 1.0
    assert any(not np.array_equal(np.asarray(a), np.asarray(c))
               for a, c in zip(jax.tree.leaves(state_a.params["actor"]), jax.tree.leaves(state_c.params["actor"])))


# ---------------------------------------------------------------------------
# 4. End to end, and the config's one-line errors.


def restricted_config(**ppo):
    config = config_lib.load_config_file(REPO / "configs" / "synthetic.py")
    config.total_env_steps = config.num_threads * config.rollout_length * 2
    config.tensorboard = False
    config.plot = False
    for key, value in ppo.items():
        config.ppo[key] = value
    return config


@pytest.mark.long
@pytest.mark.parametrize("sampling", ["action_scores", "trie_explore"])
def test_every_option_on_trains_end_to_end_and_logs_its_divergences(tmp_path, sampling):
    config = restricted_config(lambda_scope="action", entropy_scope="offered", behaviour_correction="importance")
    if sampling == "action_scores":
        config.restricted_sampling = "action_scores"
    else:
        config.trie_explore_temperature = 2.0
    result = train.run(config, tmp_path / sampling, show_progress=False)
    for record in result.records:
        for key in ("behaviour_kl_token", "behaviour_kl_action", "importance_weight", "entropy_offered",
                    "entropy_vocabulary", "policy_loss"):
            assert np.isfinite(record[key]), key
        assert 0 < record["importance_weight"] <= 1.0
        assert record["entropy_offered"] != record["entropy_vocabulary"]  # two supports, two entropies
    # Drawn at another distribution than pi_old, the samples differ from it measurably.
    assert max(abs(r["behaviour_kl_token"]) for r in result.records) > 1e-4


@pytest.mark.long
def test_trie_exploration_records_the_log_probs_of_the_temperature_it_draws_at():
    """The behaviour log-probs are those of the trie's softmax at the exploration temperature (NumPy)."""
    from poad_jax.agent.rollout import RolloutCollector, merged_actor
    from poad_jax.core.critic_config import CriticConfig
    from poad_jax.core.policy import ValueHead, split_policy
    from poad_jax.agent.methods import make_method
    from poad_jax.models.tiny import tiny_random_model
    from poad_jax.sampling import Sampler
    from flax import nnx
    import envs_py

    model, tokenizer = tiny_random_model(seed=0)
    head = ValueHead(model.config.hidden_size, CriticConfig(hidden_sizes=(8,)), rngs=nnx.Rngs(1))
    graph, frozen, params = split_policy(model, head)
    config = config_lib.rollout_config(num_threads=2, rollout_length=1, prompt_format="raw",
                                       trie_explore_temperature=3.0)
    envs = envs_py.VectorEnv("toy/decisive_token", 2, seed=0, horizon=2, num_colours=3, rewarded="blue")
    actor = merged_actor(graph, frozen, params)
    collector = RolloutCollector(envs, tokenizer, Sampler(actor), make_method("poad", 0.95), config, seed=0)
    steps, _ = collector.collect(jax.random.key(0))
    for record in steps[0]:
        assert record.behaviour_logprobs == record.sampler_logprobs
        for j, token in enumerate(record.action_tokens):
            prefix = record.action_tokens[:j]
            offered = sorted({c[j] for c in record.candidates if c[:j] == prefix and len(c) > j})
            rows = np.array([record.prompt + prefix])
            logits = np.asarray(actor(jnp.asarray(rows), jnp.arange(rows.shape[1])[None],
                                      jnp.ones(rows.shape, bool)).logits)[0, -1].astype(np.float64)
            sub = logits[offered] / 3.0
            sub = sub - sub.max()
            expected = sub[offered.index(token)] - np.log(np.exp(sub).sum())
            np.testing.assert_allclose(record.behaviour_logprobs[j], expected, rtol=1e-4, atol=1e-4)


def test_greedy_play_of_an_exploring_run_is_greedy_and_the_token_policy_drops_the_behaviour():
    """Evaluating an exploring run greedily (sampling temperature 0) picks the most likely offered token
    at each step, as without exploration; `evaluate.policy_config(config, "token")` plays the trie at the
    run's temperature with neither exploration nor action scores, and changes nothing for TWOSOME."""
    from poad_jax.agent.rollout import RolloutCollector, merged_actor
    from poad_jax.agent.methods import make_method
    from poad_jax.core.critic_config import CriticConfig
    from poad_jax.core.policy import ValueHead, split_policy
    from poad_jax.models.tiny import tiny_random_model
    from poad_jax.sampling import Sampler
    from poad_jax.tools import evaluate
    from flax import nnx
    import envs_py

    model, tokenizer = tiny_random_model(seed=0)
    head = ValueHead(model.config.hidden_size, CriticConfig(hidden_sizes=(8,)), rngs=nnx.Rngs(1))
    graph, frozen, params = split_policy(model, head)
    actor = merged_actor(graph, frozen, params)
    chosen = []
    for explore in (0.0, 3.0):
        base = config_lib.rollout_config(num_threads=8, rollout_length=1, prompt_format="raw")
        config = dataclasses.replace(base, trie_explore_temperature=explore,
                                     sampling=dataclasses.replace(base.sampling, temperature=0.0))
        envs = envs_py.VectorEnv("toy/decisive_token", 8, seed=0, horizon=2, num_colours=3, rewarded="blue")
        collector = RolloutCollector(envs, tokenizer, Sampler(actor), make_method("poad", 0.95), config, seed=0)
        chosen.append([r.action_tokens for r in collector.collect(jax.random.key(explore == 0))[0][0]])
    assert chosen[0] == chosen[1]

    config = restricted_config(behaviour_correction="importance")
    config.restricted_sampling = "action_scores"
    run = config_lib.typed(config)
    assert evaluate.policies_differ(run)
    token = evaluate.policy_config(run, "token")
    assert (token.rollout.restricted_sampling, token.rollout.trie_explore_temperature) == ("trie", 0.0)
    assert token == dataclasses.replace(run, rollout=dataclasses.replace(  # nothing else changes
        run.rollout, restricted_sampling="trie", trie_explore_temperature=0.0))
    assert run.rollout.restricted_sampling == "action_scores"  # the run's settings are not changed
    assert evaluate.policy_config(run, "behaviour") is run
    config.restricted_sampling, config.trie_explore_temperature = "trie", 2.0
    assert evaluate.policies_differ(config_lib.typed(config))
    config.method, config.trie_explore_temperature, config.ppo.behaviour_correction = "twosome", 0.0, "none"
    assert not evaluate.policies_differ(config_lib.typed(config))


def test_each_policys_evaluation_is_saved_in_its_own_file(tmp_path):
    """`evaluate --policy=token` saves its table beside the behaviour's (evaluation_token.txt), so that a run
    whose sampler is not its token policy keeps both evaluations, each with the command that made it."""
    from poad_jax.tools import evaluate

    rows = {policy: [evaluate.EvalResult("toy/decisive_token", "sampled", 20, value, value)]
            for policy, value in (("behaviour", 0.75), ("token", 0.05))}
    for policy in ("behaviour", "token"):
        saved = evaluate.save_table(tmp_path, rows[policy], ["--workdir=run", f"--policy={policy}"], policy)
        assert saved == tmp_path / evaluate.RESULTS_FILES[policy]
    for policy, value in (("behaviour", "0.75"), ("token", "0.05")):
        lines = (tmp_path / evaluate.RESULTS_FILES[policy]).read_text().splitlines()
        assert lines[0].startswith(f"# python -m poad_jax.evaluate --workdir=run --policy={policy}")
        assert lines[2].split()[-1] == value
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evaluation.txt", "evaluation_token.txt"]


@pytest.mark.parametrize("override, message", [
    ({"method": "twosome", "ppo.behaviour_correction": "importance"}, "is for poad or ntpo"),
    ({"ppo.behaviour_correction": "importance", "behaviour_logprobs": "sampler"}, "needs behaviour_logprobs='recompute'"),
    ({"trie_explore_temperature": 1.5}, "needs ppo.behaviour_correction='importance'"),
    ({"trie_explore_temperature": 1.5, "ppo.behaviour_correction": "importance",
      "restricted_sampling": "action_scores"}, "needs poad or ntpo with restricted_sampling='trie'"),
    ({"ppo.lambda_scope": "actions"}, "ppo.lambda_scope must be one of token, action"),
    ({"ppo.entropy_scope": "all"}, "ppo.entropy_scope must be one of policy, offered"),
    ({"ppo.importance_weight_clip": 0.0}, "ppo.importance_weight_clip must be"),
])
def test_bad_option_combinations_fail_with_one_line(override, message):
    config = config_lib.load_config_file(REPO / "configs" / "synthetic.py")
    for dotted, value in override.items():
        *parents, leaf = dotted.split(".")
        node = config
        for parent in parents:
            node = node[parent]
        node[leaf] = value
    with pytest.raises(config_lib.ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config_lib.validate(config)
