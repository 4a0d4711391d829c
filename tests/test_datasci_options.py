"""DataSciCoding's options beyond the paper (docs/datasci.md, "Options beyond the paper"): graded failures
by stage, improvement episodes (their reward rule, their exact resume), the estimator class of a program,
and the paper's behaviour when they are off.

The programs run through the real sandbox; where the kernel refuses its namespaces the tests that run
programs skip (after checking that the env refuses too), as tests/test_datasci_sandbox.py does.
"""

from __future__ import annotations

import json
import types

import pytest

import envs_py
from envs_py.datasci import prompts, stages
from envs_py.datasci.env import DataSciEnv
from envs_py.datasci.estimators import estimator_class
from envs_py.datasci.sandbox import SandboxUnavailableError, sandbox_status

WALL_S = 60.0  # generous: honest programs must finish on a loaded 2-core machine

LOGISTIC = ("from sklearn.linear_model import LogisticRegression\n\ndef build_model(x_train, y_train):\n"
            "    return LogisticRegression(max_iter=500).fit(x_train, y_train)\n")
STUMP = ("from sklearn.tree import DecisionTreeClassifier\n\ndef build_model(x_train, y_train):\n"
         "    return DecisionTreeClassifier(max_depth=1, random_state=0).fit(x_train, y_train)\n")
TREE = ("from sklearn.tree import DecisionTreeClassifier\n\ndef build_model(x_train, y_train):\n"
        "    return DecisionTreeClassifier(max_depth=3, random_state=0).fit(x_train, y_train)\n")
FAILING = "def build_model(x_train, y_train):\n    raise ValueError('boom')\n"

# One hand-written program per stage it fails at (envs_py/datasci/stages.py).
AT_STAGE = {
    "extract": "def build_model(x_train, y_train)\n    return 1\n",
    "import": "import not_a_real_module_abc\n\ndef build_model(x_train, y_train):\n    return None\n",
    "build": FAILING,
    "limit": "def build_model(x_train, y_train):\n    while True:\n        pass\n",
    "predict_proba": "from sklearn.svm import SVC\n\ndef build_model(x_train, y_train):\n"
                     "    return SVC().fit(x_train, y_train)\n",
    "proba": "class Constant:\n    def predict_proba(self, x):\n        return [[0.5]] * len(x)\n\n"
             "def build_model(x_train, y_train):\n    return Constant()\n",
}
MORE_AT_STAGE = [  # other ways to fail at a stage
    ("extract", "I am sorry, I cannot write this function.\n"),  # prose, no code
    ("build", "def build_model(x_train, y_train):\n    return None\n"),
    ("limit", "def build_model(x_train, y_train):\n    return bytearray(8 << 30)\n"),  # MemoryError
    ("predict_proba", "class Broken:\n    def predict_proba(self, x):\n        raise RuntimeError('no')\n\n"
                      "def build_model(x_train, y_train):\n    return Broken()\n"),
    ("proba", "import numpy as np\nclass Nan:\n    classes_ = np.array([0, 1, 2])\n"
              "    def predict_proba(self, x):\n        return np.full((len(x), 3), np.nan)\n\n"
              "def build_model(x_train, y_train):\n    return Nan()\n"),
]
LIMIT_WALL_S = 4.0  # the endless loop's clock


def fenced(program: str) -> str:
    return f"```python\n{program}```"


@pytest.fixture(scope="module")
def sandbox_holds():
    """Skips where the kernel refuses the sandbox's namespaces (the env must refuse too), fails where
    the sandbox does not hold for another reason."""
    status = sandbox_status()
    if not status.ok:
        with pytest.raises(SandboxUnavailableError):
            DataSciEnv(timeout_s=WALL_S)
        if "bwrap:" in status.reason and "namespace" in status.reason:
            pytest.skip(f"the kernel refuses the sandbox's namespaces: {status.reason}")
        pytest.fail(f"the sandbox does not hold here: {status.reason}")


def make_env(**kwargs) -> DataSciEnv:
    return envs_py.make("datasci/balance_scale", **{"template": "chat", "timeout_s": WALL_S, **kwargs})


@pytest.fixture(scope="module")
def scores(sandbox_holds):
    """The mean AUC of LOGISTIC, STUMP and TREE on balance_scale, scored by the env directly."""
    env = make_env()
    found = {}
    for name, program in (("logistic", LOGISTIC), ("stump", STUMP), ("tree", TREE)):
        result = env.score_program(prompts.PRELUDE + program)
        assert result.success, result.error
        found[name] = result.mean_auc
    assert len(set(found.values())) == 3
    return found


# ---------------------------------------------------------------------------
# Graded failures.


def stage_of(program: str, stage: str, **kwargs):
    wall = LIMIT_WALL_S if stage == "limit" else WALL_S
    env = make_env(timeout_s=wall, max_attempts=3, **kwargs)
    env.reset()
    return env, env.step(program if program.startswith("I am") else fenced(program))


@pytest.mark.parametrize("stage", stages.STAGES)
def test_a_failure_at_each_stage_earns_its_stage_penalty(sandbox_holds, stage):
    env, result = stage_of(AT_STAGE[stage], stage, graded_failures=True)
    assert result.info["failure_stage"] == stage, result.info["error"]
    assert result.reward == pytest.approx(stages.DEFAULT_LADDER[stage] * -1.0)
    assert not result.info["success"] and not result.done
    assert result.observation.text == prompts.retry_prompt(  # the retry prompt as without the option
        "chat", "balance_scale", 125, 4, 3, previous_code=result.info["program"], error=result.info["error"],
        error_chars=env.error_chars, code_chars=env.code_chars)


@pytest.mark.parametrize("stage,program", MORE_AT_STAGE)
def test_other_failures_are_told_apart_by_stage(sandbox_holds, stage, program):
    _, result = stage_of(program, stage, graded_failures=True, failure_rewards={stage: -0.25})
    assert result.info["failure_stage"] == stage, result.info["error"]
    assert result.reward == -0.25


def test_graded_failures_off_every_failure_earns_failure_reward_as_in_the_paper(sandbox_holds):
    env = make_env(max_attempts=len(AT_STAGE) + 1)
    env.reset()
    for stage in ("extract", "import", "build", "predict_proba", "proba"):
        result = env.step(fenced(AT_STAGE[stage]))
        assert result.info["failure_stage"] == stage
        assert result.reward == -1.0 and not result.done
        assert result.info["attempt_kind"] == ("retry" if result.info["attempt"] > 1 else "first")
    success = env.step(fenced(LOGISTIC))
    assert success.done and success.reward == success.info["auc"] and success.info["failure_stage"] is None
    assert success.observation == env.reset()  # the episode ends with the first program that runs
    assert "episode_best_auc" not in success.info and env.episode_state() is None


def test_stage_rewards_ladder_and_overrides():
    assert stages.stage_rewards(-1.0, False) is None
    ladder = stages.stage_rewards(-1.0, True)
    assert ladder == {"extract": -1.0, "import": -0.8, "build": -0.6, "limit": -0.6, "predict_proba": -0.4,
                      "proba": -0.2}
    assert stages.stage_rewards(-2.0, True)["import"] == pytest.approx(-1.6)  # fractions of failure_reward
    assert stages.stage_rewards(-1.0, True, "limit=-0.5, proba=-0.1")["limit"] == -0.5
    assert stages.stage_rewards(-1.0, True, {"proba": 0})["proba"] == 0.0


@pytest.mark.parametrize("kwargs,said", [
    ({"graded_failures": True, "failure_rewards": {"compile": -0.5}}, "unknown stage(s) compile"),
    ({"graded_failures": True, "failure_rewards": "limit=-0.5,runtime=-0.2"}, "unknown stage(s) runtime"),
    ({"graded_failures": True, "failure_rewards": "limit"}, "must read stage=reward"),
    ({"graded_failures": True, "failure_rewards": {"limit": -1.5}}, "between failure_reward (-1) and 0"),
    ({"graded_failures": True, "failure_rewards": {"limit": 0.1}}, "between failure_reward (-1) and 0"),
    ({"failure_rewards": {"limit": -0.5}}, "needs graded_failures=True"),
    ({"improve_attempts": -1}, "improve_attempts must be an integer >= 0"),
])
def test_a_wrong_option_is_a_one_line_error_when_the_env_is_built(kwargs, said):
    with pytest.raises(ValueError) as raised:
        make_env(**kwargs)
    assert said in str(raised.value) and "\n" not in str(raised.value)


# ---------------------------------------------------------------------------
# Improvement episodes.


def test_an_improvement_episode_pays_its_best_auc_over_its_running_programs(scores):
    """LogisticRegression, a worse program, a better one, a failing one: the running programs' rewards
    sum to the episode's best AUC; the failing one earns its graded penalty."""
    worse, middle, better = sorted(scores.values())
    order = {value: name for name, value in scores.items()}
    programs = {"logistic": LOGISTIC, "stump": STUMP, "tree": TREE}
    env = make_env(improve_attempts=3, graded_failures=True, max_attempts=2)
    env.reset()
    retry = env.step(fenced(FAILING))
    assert retry.info["attempt_kind"] == "first" and retry.reward == -0.6 and not retry.done
    steps = [env.step(fenced(programs[order[auc]])) for auc in (middle, worse, better)]
    steps.append(env.step(fenced(FAILING)))
    assert [s.info["attempt_kind"] for s in steps] == ["retry", "improve", "improve", "improve"]
    assert [s.done for s in steps] == [False, False, False, True]
    assert [s.info.get("auc") for s in steps] == [middle, worse, better, None]
    assert [s.info["episode_best_auc"] for s in steps] == [middle, middle, better, better]
    assert [s.reward for s in steps[:3]] == [middle, 0.0, better - middle]
    assert sum(s.reward for s in steps if s.info["success"]) == pytest.approx(better, abs=1e-12)
    assert steps[3].reward == -0.6 and steps[3].info["failure_stage"] == "build"
    assert all(s.info["episode_success"] for s in steps)
    # What each observation shows: the best so far with its AUC, and how the last attempt went.
    fit = lambda auc: programs[order[auc]].splitlines()[-1].strip()  # noqa: E731 - the program's own line
    assert f"ROC AUC {middle:.4f}" in steps[0].observation.text and fit(middle) in steps[0].observation.text
    assert f"scored ROC AUC {worse:.4f}, not better" in steps[1].observation.text
    assert fit(middle) in steps[1].observation.text
    assert f"ROC AUC {better:.4f}" in steps[2].observation.text and fit(better) in steps[2].observation.text
    assert "boom" in steps[3].observation.text and fit(better) in steps[3].observation.text


def test_failures_before_the_first_running_program_still_end_the_episode_at_max_attempts(sandbox_holds):
    env = make_env(improve_attempts=2, max_attempts=2)
    env.reset()
    assert not env.step(fenced(FAILING)).done
    last = env.step(fenced(FAILING))
    assert last.done and last.reward == -1.0 and last.info["episode_success"] is False
    assert last.info["episode_best_auc"] is None


def test_the_first_program_that_runs_on_the_last_attempt_still_gets_its_improvements(scores):
    env = make_env(improve_attempts=1, max_attempts=1)
    env.reset()
    first = env.step(fenced(LOGISTIC))
    assert not first.done and first.reward == scores["logistic"]
    assert env.step(fenced(LOGISTIC)).done


def steps_of(vec, programs):
    return [vec.step([fenced(program)])[0] for program in programs]


def comparable(result):
    """A StepResult without the seconds its program took (the only thing a re-run may change)."""
    info = {k: v for k, v in result.info.items() if k not in ("seconds", "final_observation")}
    return result.observation, result.reward, result.done, info, result.info.get("final_observation")


def test_resume_mid_improvement_episode_is_exact_and_runs_no_program_again(scores, monkeypatch):
    kwargs = dict(template="chat", timeout_s=WALL_S, improve_attempts=3, graded_failures=True)
    with envs_py.VectorEnv("datasci/balance_scale", 1, seed=0, **kwargs) as first:
        first.reset()
        steps_of(first, [LOGISTIC, FAILING])
        saved = json.loads(json.dumps({"actions": first.episode_actions, "states": first.episode_states,
                                       "digest": envs_py.observation_digest(first._workers[0].env._observation()),
                                       "counters": first.episode_counters}))
        expected = [comparable(r) for r in steps_of(first, [STUMP, TREE])]
    assert saved["states"][0]["best_auc"] == scores["logistic"] and saved["states"][0]["last_error"]
    runs = []
    real = DataSciEnv.score_program
    monkeypatch.setattr(DataSciEnv, "score_program", lambda self, program: runs.append(program) or real(self, program))
    with envs_py.VectorEnv("datasci/balance_scale", 1, seed=0, **kwargs) as resumed:
        observations, restarted = resumed.resume(saved["counters"], saved["actions"], [saved["digest"]],
                                                 saved["states"])
        assert restarted == [] and runs == []  # restored, not replayed
        assert envs_py.observation_digest(observations[0]) == saved["digest"]
        assert resumed.episode_actions == saved["actions"]
        assert [comparable(r) for r in steps_of(resumed, [STUMP, TREE])] == expected
    assert expected[-1][2]  # the episode ended at its third improvement attempt


def test_the_trainer_checkpoints_and_restores_the_episode_state(scores):
    """`checkpoint_meta`'s episodes in progress carry the env's state; `restore_episodes` puts it back."""
    from poad_jax.agent.episodes import EpisodeStats
    from poad_jax.run import resume

    kwargs = dict(template="plain", timeout_s=WALL_S, improve_attempts=2)
    with envs_py.VectorEnv("datasci/balance_scale", 1, seed=0, **kwargs) as envs:
        observations = envs.reset()
        result = envs.step([fenced(LOGISTIC)])[0]
        collector = types.SimpleNamespace(observations=[result.observation], stats=EpisodeStats(running_return=[0.0]))
        collector.stats.record_step(0, result.reward, result.done, result.info, 1)
        meta = {"in_progress": json.loads(json.dumps(resume.episodes_in_progress(collector, envs)))}
    assert meta["in_progress"]["states"][0]["best_program"] == result.info["program"]
    with envs_py.VectorEnv("datasci/balance_scale", 1, seed=0, **kwargs) as envs:
        fresh = types.SimpleNamespace(observations=observations, stats=EpisodeStats(running_return=[0.0]))
        assert resume.restore_episodes(meta, fresh, envs, [0], 0, True) == []
        assert fresh.observations == [result.observation]
        assert fresh.stats.running_return == [scores["logistic"]]
        assert envs.step([fenced(LOGISTIC)])[0].reward == 0.0  # the best is back: no gain


# ---------------------------------------------------------------------------
# Prompts and the estimator class.


@pytest.mark.parametrize("template", prompts.TEMPLATES)
def test_the_improvement_prompt_shows_the_best_program_and_its_auc(template):
    best = "from sklearn.svm import SVC\n\ndef build_model(x_train, y_train):\n    return SVC(probability=True)\n"
    text = prompts.improve_prompt(template, "balance_scale", 125, 4, 3, best_code=best, best_auc=0.88341)
    assert "ROC AUC 0.8834" in text and "balance_scale" in text and "better" in text
    assert all(line.strip() in text for line in best.splitlines())
    failed = prompts.improve_prompt(template, "balance_scale", 125, 4, 3, best_code=best, best_auc=0.88341,
                                    last_code="def build_model(x_train, y_train):\n    return 1\n",
                                    last_error="TypeError: bad")
    assert "TypeError: bad" in failed and "return 1" in failed and "ROC AUC 0.8834" in failed
    if template == "plain":
        assert text.endswith(prompts.FUNCTION_HEADER) and failed.endswith(prompts.FUNCTION_HEADER)


@pytest.mark.parametrize("program,expected", [
    (LOGISTIC, "LogisticRegression"),
    ("def build_model(x_train, y_train):\n    from sklearn.ensemble import RandomForestClassifier as RF\n"
     "    model = RF(n_estimators=50)\n    model.fit(x_train, y_train)\n    return model\n", "RandomForestClassifier"),
    ("import sklearn.ensemble\ndef build_model(x_train, y_train):\n"
     "    clf = sklearn.ensemble.RandomForestClassifier()\n    clf = clf.fit(x_train, y_train)\n    return clf\n",
     "RandomForestClassifier"),
    ("from sklearn.pipeline import make_pipeline\ndef build_model(x_train, y_train):\n"
     "    return make_pipeline(StandardScaler(), SVC(probability=True)).fit(x_train, y_train)\n", "SVC"),
    ("def build_model(x_train, y_train):\n    pipe = Pipeline([('s', StandardScaler()), ('m', GaussianNB())])\n"
     "    return pipe.fit(x_train, y_train)\n", "GaussianNB"),
    ("def build_model(x_train, y_train):\n    search = GridSearchCV(estimator=SVC(probability=True), param_grid={})\n"
     "    search.fit(x_train, y_train)\n    return search.best_estimator_\n", "SVC"),
    ("def build_model(x_train, y_train):\n    search = GridSearchCV(HistGradientBoostingClassifier(), {})\n"
     "    return search.fit(x_train, y_train)\n", "HistGradientBoostingClassifier"),
    ("def build_model(x_train, y_train):\n    return helper(x_train, y_train)\n", None),
    (AT_STAGE["extract"], None),
    ("x = 1\n", None),
])
def test_estimator_class_follows_the_returned_value(program, expected):
    assert estimator_class(program) == expected
