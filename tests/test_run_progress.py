"""Progress that means something (issue 19): the bar before any episode ends,
the summary in words, per-episode curves."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from poad_jax.run import metrics as run_logging
from poad_jax.run import train
from poad_jax.run import cli
from poad_jax.run import config as config_lib
from poad_jax.agent.episodes import EpisodeStats, failure_kind, step_summary

REPO = pathlib.Path(__file__).resolve().parents[1]


def long_episode_config(updates: int):
    """Toy episodes of 100 steps: no episode ends within the run."""
    config = config_lib.load_config_file(REPO / "configs" / "toy.py")
    config.env.kwargs = dict(config.env.kwargs, horizon=100)
    config.total_env_steps = config.num_threads * config.rollout_length * updates
    config.tensorboard = False
    return config


def test_a_run_with_no_finished_episode_shows_no_nan(tmp_path, capsys):
    config = long_episode_config(2)
    result = train.run(config, tmp_path / "run", show_progress=True)
    bar = capsys.readouterr().err  # tqdm draws on stderr
    assert result.episodes["finished_returns"] == []
    assert "nan" not in bar.lower()
    assert "ok=0/4" in bar and "ok=0/32" in bar and "r/step=" in bar and "episodes=0" in bar
    summary = cli.summary_text(config, result)
    assert "nan" not in summary.lower()
    assert "no episode finished within 32 env steps" in summary
    assert (tmp_path / "run" / "curves.png").stat().st_size > 0


def _stats_after(steps):
    stats = EpisodeStats(running_return=[0.0, 0.0])
    for env_step, (thread, reward, done, info) in enumerate(steps, start=1):
        stats.record_step(thread, reward, done, info, env_step)
    return stats


STEPS = [
    (0, -1.0, False, {"success": False, "error": "Traceback (most recent call last):\nNameError: name 'x'"}),
    (1, 0.75, True, {"success": True}),
    (0, -1.0, False, {"success": False, "error": "SyntaxError: invalid syntax"}),
    (0, 0.5, True, {"success": True}),
    (1, -1.0, False, {"success": False, "error": "NameError: name 'y'"}),
]


def test_episode_stats_count_what_happened():
    stats = _stats_after(STEPS)
    rewards = [s[1] for s in STEPS]
    assert stats.steps == len(STEPS) and stats.succeeded_steps == 2
    assert stats.reward_sum == pytest.approx(sum(rewards))
    assert stats.best_success_reward == 0.75
    assert stats.failure_kinds == {"NameError": 2, "SyntaxError": 1}
    assert stats.finished_returns == [0.75, -1.0 - 1.0 + 0.5] and stats.finished_env_steps == [2, 4]
    assert stats.running_return == [0.0, -1.0]
    restored = EpisodeStats(running_return=[0.0, 0.0])
    restored.load_state_dict(stats.state_dict())
    assert restored.state_dict() == stats.state_dict()
    before = _stats_after(STEPS[:2]).counters()
    summary = step_summary(stats, before)
    assert summary["steps_succeeded"] == 1 and summary["step_reward_mean"] == pytest.approx(np.mean(rewards[2:]))
    assert summary["success_reward_mean"] == 0.5  # the one program that ran in those steps
    assert np.isnan(step_summary(stats, stats.counters())["success_reward_mean"])  # none ran


def test_progress_postfix_before_and_after_the_first_episode():
    early = run_logging.progress_postfix(_stats_after(STEPS[:1]).state_dict())
    assert early == {"episodes": "0", "ok": "0/1", "r/step": "-1.000"}
    late = run_logging.progress_postfix(_stats_after(STEPS).state_dict(), approx_kl=0.0123)
    assert late["ret"] == f"{np.mean([0.75, -1.5]):.3f}" and late["success"] == "1.00"
    assert late["ok"] == "2/5" and late["best"] == "0.750" and late["kl"] == "0.0123"
    assert "nan" not in str(run_logging.progress_postfix({}, approx_kl=float("nan"))).lower()


@pytest.mark.parametrize(
    "error, kind",
    [
        ("Traceback (most recent call last):\n  File \"x\", line 1\nValueError: bad", "ValueError"),
        ("TimeoutError: the code ran longer than 30 s", "TimeoutError"),
        ("sklearn.exceptions.NotFittedError: not fitted", "NotFittedError"),
        ("build_model returned None", "other"),
    ],
)
def test_failure_kind(error, kind):
    assert failure_kind(error) == kind


def test_summary_says_why_nothing_ran_and_what_to_try():
    config = config_lib.load_config_file(REPO / "configs" / "datasci_smollm2.py")
    stats = _stats_after([(0, -1.0, False, {"success": False, "error": "SyntaxError: x"})] * 16)
    episodes = stats.state_dict()
    records = [{"update": 1, "env_steps": 16}]
    lines = run_logging.run_summary_lines(records, episodes, 32, "programs", "ran", "AUC")
    assert any(line.startswith("0 of 16 programs ran;") and "SyntaxError 16" in line for line in lines)
    assert "stopped early; total_env_steps is 32" in lines[0]
    advice = " ".join(cli.advice_lines(config, episodes))
    assert "SmolLM2-135M rarely writes runnable scikit-learn code" in advice and "configs/datasci.py" in advice
    config.model = "qwen2.5-coder-0.5b-instruct"
    assert "max_new_tokens" in " ".join(cli.advice_lines(config, episodes))
    succeeded = _stats_after(STEPS).state_dict()
    assert cli.advice_lines(config, succeeded) == []
    lines = run_logging.run_summary_lines(records, succeeded, 32, "programs", "ran", "AUC")
    mean_auc = np.mean([reward for _, reward, _, info in STEPS if info["success"]])
    assert any(line.startswith(f"2 of 5 programs ran (mean AUC of those {mean_auc:.3f}); ") for line in lines), lines


def test_the_summary_prints_the_command_that_continues_the_run(tmp_path):
    """The same command with the run directory and more env steps: run as printed, it resumes."""
    import shlex
    import subprocess
    import sys

    config = long_episode_config(1)
    workdir = tmp_path / "run"
    result = train.run(config, workdir, show_progress=False)
    argv = [str(REPO / "poad_jax" / "train.py"), "--config=configs/toy.py", "--workdir", "elsewhere",
            "--config.env.kwargs.horizon=100", "--config.total_env_steps=16", "--config.tensorboard=False"]
    lines = cli.summary_text(config, result, argv).splitlines()
    assert lines[-2] == "to continue training (it resumes from update 1, up to 32 env steps):"
    command = shlex.split(lines[-1])
    assert command[1:] == ["-m", "poad_jax.train", "--config=configs/toy.py", "--config.env.kwargs.horizon=100",
                           "--config.tensorboard=False", f"--workdir={workdir}", "--config.total_env_steps=32"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"resuming {workdir} from update 1 (16 env steps)" in done.stdout
    assert "2 PPO updates over 32 env steps (the run is complete)." in done.stdout
    assert "up to 64 env steps" in done.stdout


def test_the_bar_keeps_moving_through_a_long_phase(capsys):
    """A phase in which the loop draws nothing (one long generation or PPO update) still redraws the
    bar with the phase's clock; closing it leaves the statistics without the phase."""
    import time

    from poad_jax.run.progress import RunProgress

    progress = RunProgress(total=8, initial=0, description="poad toy", tick_s=0.05)
    progress.show({"ok": "0/0"})
    progress.phase("update 1/2: learning")
    time.sleep(1.5)
    progress.close()
    drawn = capsys.readouterr().err.replace("\r", "\n").splitlines()
    ticking = [line for line in drawn if "now=update 1/2: learning 0:0" in line]
    assert len(ticking) >= 5 and "now=update 1/2: learning 0:01" in ticking[-1], drawn[-3:]
    assert "now=" not in drawn[-1] and "ok=0/0" in drawn[-1] and "0/8" in drawn[-1]


def test_actions_cut_off_counts_free_form_actions_that_reached_the_token_limit():
    from poad_jax.run import config as config_lib
    from poad_jax.agent.rollout import StepRecord, actions_cut_off

    config = config_lib.rollout_config(config_lib.load_config_file(REPO / "configs" / "toy.py"), (2,))
    limit = config.sampling.max_new_tokens
    steps = [[StepRecord([1], [5] * limit, 0.0, False),  # cut off
              StepRecord([1], [5] * (limit - 1) + [2], 0.0, False),  # ended by the stop token at the limit
              StepRecord([1], [5, 2], 0.0, False)],
             [StepRecord([1], [5] * limit, 0.0, False, candidates=[[5] * limit])]]  # chosen among candidates
    assert actions_cut_off(steps, config) == 1
    summary = cli.cut_off_lines(config_lib.load_config_file(REPO / "configs" / "toy.py"),
                                  [{"env_steps": 4, "actions_cut_off": 1}, {"env_steps": 8, "actions_cut_off": 2}])
    assert summary == [f"3 of 8 programs were cut off by sampling.max_new_tokens ({limit} tokens)."]
    assert cli.cut_off_lines(config_lib.load_config_file(REPO / "configs" / "toy.py"), [{"env_steps": 4}]) == []


def test_rolling_mean_and_episode_points():
    values = [1.0, 3.0, 2.0, 6.0, 0.0]
    expected = [np.mean(values[max(0, i - 2): i + 1]) for i in range(len(values))]
    np.testing.assert_allclose(run_logging.rolling_mean(values, 3), expected)
    episodes = {"finished_env_steps": [-1, 4, 9], "finished_returns": [1.0, 2.0, 3.0],
                "finished_success": [True, False, True]}
    assert run_logging.episode_points(episodes) == [(4, 2.0, 0.0), (9, 3.0, 1.0)]  # -1: end unknown (old run)


def test_curves_with_and_without_episodes(tmp_path):
    records = [{"update": 1, "env_steps": 16, "policy_loss": 0.1, "step_reward_mean": -1.0},
               {"update": 2, "env_steps": 32, "policy_loss": 0.05, "step_reward_mean": -0.5}]
    episodes = _stats_after(STEPS).state_dict()
    for name, eps in (("with.png", episodes), ("without.png", {})):
        path = run_logging.plot_curves(records, tmp_path / name, eps)
        assert path.stat().st_size > 0


IMPROVEMENT_STEPS = [  # one improvement episode of thread 0 (k = 2) and a paper episode of thread 1
    (0, -0.6, False, {"success": False, "error": "ValueError: boom", "failure_stage": "build", "estimator": None,
                      "episode_success": False, "episode_best_auc": None}),
    (0, 0.8, False, {"success": True, "auc": 0.8, "failure_stage": None, "estimator": "LogisticRegression",
                     "episode_success": True, "episode_best_auc": 0.8}),
    (1, -1.0, False, {"success": False, "error": "SyntaxError: x", "failure_stage": "extract", "estimator": None}),
    (0, 0.0, False, {"success": True, "auc": 0.7, "failure_stage": None, "estimator": "GaussianNB",
                     "episode_success": True, "episode_best_auc": 0.8}),
    (0, -0.4, True, {"success": False, "error": "TypeError: x", "failure_stage": "predict_proba", "estimator": "SVC",
                     "episode_success": True, "episode_best_auc": 0.8}),
    (1, 0.9, True, {"success": True, "auc": 0.9, "failure_stage": None, "estimator": "LogisticRegression"}),
]


def test_episode_stats_score_programs_by_their_auc_and_count_stages_and_estimators():
    """In an improvement episode a reward is a gain: the success means and the best use `info["auc"]`; the
    episode succeeded when any of its programs ran; stages, estimators and the episode's best are kept."""
    from poad_jax.agent.episodes import merge_episode_states, program_summary

    stats = _stats_after(IMPROVEMENT_STEPS)
    assert stats.best_success_reward == 0.9 and stats.success_reward_sum == pytest.approx(0.8 + 0.7 + 0.9)
    assert stats.finished_success == [True, True] and stats.finished_best == [0.8, None]
    assert stats.finished_returns == [pytest.approx(-0.6 + 0.8 + 0.0 - 0.4), pytest.approx(-1.0 + 0.9)]
    assert stats.failure_stages == {"build": 1, "extract": 1, "predict_proba": 1}
    assert stats.estimator_counts == {"LogisticRegression": 2, "GaussianNB": 1, "SVC": 1} and stats.programs == 6
    before = _stats_after(IMPROVEMENT_STEPS[:2]).program_tallies()
    assert program_summary(stats, before) == {"distinct_estimators": 3, "failures_build": 0, "failures_extract": 1,
                                              "failures_predict_proba": 1}
    assert program_summary(_stats_after(STEPS), _stats_after([]).program_tallies()) == {}  # no estimators: not programs
    restored = EpisodeStats(running_return=[0.0, 0.0])
    restored.load_state_dict(stats.state_dict())
    assert restored.state_dict() == stats.state_dict()
    older = {k: v for k, v in stats.state_dict().items() if k not in ("finished_best", "failure_stages")}
    restored.load_state_dict(older)  # a checkpoint from before these fields
    assert restored.finished_best == [None, None] and restored.failure_stages == {}
    merged = merge_episode_states([stats.state_dict(), _stats_after(IMPROVEMENT_STEPS[5:]).state_dict()])
    assert merged["failure_stages"] == stats.failure_stages and merged["programs"] == 7
    assert merged["estimator_counts"]["LogisticRegression"] == 3
    assert sorted(merged["finished_best"], key=str) == [0.8, None, None]
    lines = " ".join(run_logging.run_summary_lines([{"update": 1, "env_steps": 6}], stats.state_dict(), 6,
                                                   "programs", "ran", "AUC"))
    assert "failures by stage: build 1, extract 1, predict_proba 1" in lines
    assert "best AUC per improvement episode: mean 0.8000 over the 1 episode where a program ran" in lines
