"""scripts/behaviour_gap.py: the behaviour (action scores' softmax) against the token policy at the states
the behaviour visits, per step: both policies' action probabilities and the truncated weights of the
taken action's tokens, checked against a brute-force NumPy reference and against the run itself."""

from __future__ import annotations

import importlib.util
import itertools
import json
import pathlib
import sys

import numpy as np
import pytest

from poad_jax.run import config as config_lib
from poad_jax.run import train

# One xdist worker runs every test of this module (`--dist loadgroup`, scripts/test.sh): its module
# fixture, minutes of training or of subprocesses, is then set up once per suite, not once per worker.
pytestmark = pytest.mark.xdist_group("behaviour_gap")

REPO = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("behaviour_gap", REPO / "scripts" / "behaviour_gap.py")
gap_script = importlib.util.module_from_spec(_spec)
sys.modules["behaviour_gap"] = gap_script  # its dataclass looks its module up there
_spec.loader.exec_module(gap_script)


def token_conditionals(candidates: list[list[int]], probs: np.ndarray, chosen: int) -> np.ndarray:
    """p(w_j | w_<j) of the chosen candidate's tokens when whole candidates are drawn from `probs`,
    by enumerating every candidate for each prefix (the definition, no shared code)."""
    action, out = candidates[chosen], []
    for j in range(len(action)):
        upto = sum(p for c, p in zip(candidates, probs) if c[:j + 1] == action[:j + 1])
        before = sum(p for c, p in zip(candidates, probs) if c[:j] == action[:j])
        out.append(upto / before)
    return np.array(out)


def test_the_weights_are_the_truncated_ratio_of_both_policies_token_conditionals():
    rng = np.random.default_rng(0)
    candidates = [[5, 6, 7], [5, 6, 8], [5, 9, 7], [4, 6, 7], [5, 6, 8]]  # shared prefixes, one repeated
    texts = [f"action {k}" for k in range(len(candidates))]
    for _ in range(50):
        mu, pi = rng.dirichlet(np.ones(len(candidates)) * 0.5), rng.dirichlet(np.ones(len(candidates)) * 0.5)
        chosen = int(rng.integers(len(candidates)))
        recorded = list(np.log(token_conditionals(candidates, mu, chosen)) + 1e-3)
        gap = gap_script.step_gap(candidates, texts, mu * 3.0, pi, chosen, recorded)  # mu unnormalised: fine
        want = np.minimum(1.0, token_conditionals(candidates, pi, chosen) / token_conditionals(candidates, mu, chosen))
        np.testing.assert_allclose(gap.weights, want, rtol=1e-12)
        assert (gap.mu, gap.pi) == pytest.approx((mu[chosen], pi[chosen]), rel=1e-12)
        assert (gap.mu_best, gap.pi_best) == (texts[int(np.argmax(mu))], texts[int(np.argmax(pi))])
        assert gap.recorded_gap == pytest.approx(1e-3, rel=1e-6) and gap.offered == len(candidates)


@pytest.fixture(scope="module")
def action_score_run(tmp_path_factory):
    """A toy run (tiny random model) that drew its actions from the action scores, with the correction."""
    workdir = tmp_path_factory.mktemp("gap") / "run"
    config = config_lib.load_config_file(REPO / "configs" / "toy.py")
    config.total_env_steps = config.num_threads * config.rollout_length * 2
    config.tensorboard, config.plot = False, False
    config.restricted_sampling, config.ppo.behaviour_correction = "action_scores", "importance"
    train.run(config, workdir, show_progress=False)
    return workdir, config


def test_the_episodes_are_the_behaviours_own_and_mu_is_what_the_collector_recorded(action_score_run, tmp_path):
    from poad_jax.tools import evaluate
    from poad_jax.tools.export import load_trained_actor

    workdir, config = action_score_run
    assert gap_script.main([f"--workdir={workdir}", "--episodes=6", "--seed=7", "--initial", f"--out={tmp_path}"]) == 0
    steps = [json.loads(line) for line in (tmp_path / "behaviour_gap_steps.jsonl").read_text().splitlines()]
    assert max(s["recorded_gap"] for s in steps) < 1e-5  # mu recomputed = the log-probs the collector recorded
    assert all(0 < s["mu_initial"] <= 1 and 0 < s["pi_initial"] <= 1 for s in steps)
    assert any(abs(s["pi_initial"] - s["pi"]) > 1e-6 for s in steps)  # training moved the policy
    episodes = [list(group) for _, group in itertools.groupby(steps, key=lambda s: s["episode"])]
    assert [e[0]["episode"] for e in episodes] == list(range(6))  # each episode's steps together, in order
    assert all(len({s["thread"] for s in e}) == 1 and len({s["success"] for s in e}) == 1 for e in episodes)
    assert all(0 < s["mu"] <= 1 and 0 < s["pi"] <= 1 and all(0 < w <= 1 for w in s["weights"]) for s in steps)
    run, model, tokenizer, _ = load_trained_actor(workdir)
    played = evaluate.evaluate_env(model, tokenizer, run, run.env.name, 6, False, 7, 1000)
    assert sum(e[0]["success"] for e in episodes) == round(played.success_rate * 6)  # the same episodes
    text = (tmp_path / "behaviour_gap.md").read_text()
    assert f"6 episodes of mu, {round(played.success_rate * 6)} successful; {len(steps)} steps" in text
    assert "| mean mu as training started | mean pi as training started |" in text


def test_the_initial_actor_is_the_one_training_started_from(action_score_run):
    """LoRA B zeroed in the trained actor gives the actor `build` makes before any update, to the last bit
    of its action scores; the trained actor's scores differ."""
    from poad_jax.core.policy import merge_model
    from poad_jax.run.build import build
    from poad_jax.sampling import Sampler
    from poad_jax.tools.export import load_trained_actor

    workdir, config = action_score_run
    _, trained, tokenizer, _ = load_trained_actor(workdir)
    built = build(config_lib.typed(config))
    fresh = merge_model(built.graph, built.frozen, built.params["actor"])
    prompt = list(tokenizer.encode("You are in a room with three doors."))
    actions = [list(tokenizer.encode(f" walk to the {colour} door")) for colour in ("red", "green", "blue")]
    scores = [Sampler(actor).score_actions(prompt, actions, normalization="none").token_logprob_sums
              for actor in (gap_script.initial_actor(trained), fresh, trained)]
    np.testing.assert_array_equal(scores[0], scores[1])
    assert not np.allclose(scores[0], scores[2])


def test_a_run_whose_behaviour_is_its_token_policy_is_refused_in_one_line(tmp_path, capsys):
    from poad_jax.run.rundir import config_as_json

    for method, sampling in (("poad", "trie"), ("twosome", "action_scores")):
        config = config_lib.load_config_file(REPO / "configs" / "toy.py")
        config.method, config.restricted_sampling = method, sampling
        workdir = tmp_path / f"{method}-{sampling}"
        workdir.mkdir()
        (workdir / "config.json").write_text(json.dumps(config_as_json(config)))
        with pytest.raises(SystemExit, match="^error: the run's behaviour is its token policy"):
            gap_script.main([f"--workdir={workdir}"])
    assert gap_script.main([f"--workdir={tmp_path / 'none'}"]) == 2  # no run there: the loader's one line
    assert capsys.readouterr().err.startswith("error: ")
