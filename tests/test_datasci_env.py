"""The `datasci/<dataset>` environment: prompts, code extraction, rewards, retries."""

from __future__ import annotations

import ast
import concurrent.futures
import threading
import time

import numpy as np
import pytest

import envs_py
from envs_py.datasci import extract, prompts
from envs_py.datasci.datasets import DatasetError, load_dataset
from envs_py.datasci.sandbox import SandboxLimits, evaluate_candidate

# An honest program runs five sandboxes (one per split, each importing scikit-learn): 7-10 s on a loaded
# 2-core machine (10.05 s timed out under load: issue 32).  No test here expects a timeout (those are in
# test_datasci_sandbox.py), so the wall clock is generous, as in test_datasci_attacks.py.
WALL_S = 60.0
FAST = SandboxLimits(wall_seconds=WALL_S)
BODY = "    from sklearn.linear_model import LogisticRegression\n    return LogisticRegression(max_iter=500).fit(x_train, y_train)\n"
FULL = "from sklearn.linear_model import LogisticRegression\n\n\ndef build_model(x_train, y_train):\n    return LogisticRegression(max_iter=500).fit(x_train, y_train)\n"


def _defines_build_model(program):
    tree = ast.parse(program)
    return any(isinstance(node, ast.FunctionDef) and node.name == "build_model" for node in tree.body)


# ---------------------------------------------------------------------------
# Extraction (pure text, no sandbox).


@pytest.mark.parametrize(
    "text",
    [
        FULL,
        f"Here is my solution:\n```python\n{FULL}```\nThis fits a logistic regression.",
        f"```\n{FULL}```",
        f"```python\n{FULL}",  # unclosed fence (cut by the token limit)
        f"{FULL}\nThe model above is a linear classifier that works well.",
        BODY,
        BODY + "\nThis is the body.\ndef unrelated(:\n",
        "from sklearn.linear_model import LogisticRegression\nreturn LogisticRegression().fit(x_train, y_train)\n",
        "```python\nimport numpy as np\n```\nand\n```python\n" + FULL + "```",
    ],
)
def test_extracted_program_defines_build_model(text):
    program = extract.extract_program(text)
    assert _defines_build_model(program), program
    assert "LogisticRegression" in program


def test_extraction_builds_one_syntax_tree_at_a_time_across_threads(monkeypatch):
    """An env pool's threads extract programs at once; CPython 3.11 shares the AST constructor's depth
    between threads (a spurious SystemError killed a training run), so no two trees are built at once."""
    active, most = [0], [0]
    guard = threading.Lock()
    real_parse = ast.parse

    def watched_parse(source, *args, **kwargs):
        with guard:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.002)  # a thread switch inside the parse, as the GIL allows
        try:
            return real_parse(source, *args, **kwargs)
        finally:
            with guard:
                active[0] -= 1

    monkeypatch.setattr(extract.ast, "parse", watched_parse)
    texts = [f"Here it is:\n```python\n{FULL}```\nIt works.", BODY, BODY + "\nThis is the body.\n"] * 8
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        programs = list(pool.map(extract.extract_program, texts))
    assert all(_defines_build_model(program) for program in programs)
    assert most[0] == 1


def test_a_spurious_ast_system_error_is_retried_once_and_a_lasting_one_is_not_a_syntax_error(monkeypatch):
    real_parse, failures = ast.parse, [1]

    def flaky_parse(source, *args, **kwargs):
        if failures[0]:
            failures[0] -= 1
            raise SystemError("AST constructor recursion depth mismatch (before=39, after=27)")
        return real_parse(source, *args, **kwargs)

    monkeypatch.setattr(extract.ast, "parse", flaky_parse)
    assert _defines_build_model(extract.extract_program(FULL))
    failures[0] = 2
    with pytest.raises(SystemError, match="depth mismatch"):
        extract.parses(FULL)


def test_body_stops_at_the_end_of_the_function():
    program = extract.extract_program(BODY + "\n\nprint('after the function')\nx = build_model(1, 2)\n")
    assert "after the function" not in program and "x = build_model" not in program


def test_example_usage_after_the_function_is_dropped():
    text = "```python\n" + FULL + "\n# Example usage\nmodel = build_model(X_train, y_train)\nprint(model)\n```"
    program = extract.extract_program(text)
    assert _defines_build_model(program)
    assert "X_train" not in program and "print" not in program


def test_unparseable_text_is_returned_for_an_honest_syntax_error():
    program = extract.extract_program("def build_model(x_train, y_train)\n    return 1\n")
    assert not extract.parses(program)


def test_body_cut_by_the_token_limit_keeps_its_syntax_error():
    assert not extract.parses(extract.extract_program(BODY.rstrip().rstrip(")")))
    assert not extract.parses(extract.extract_program("```python\n" + FULL.rstrip().rstrip(")")))


def test_fenced_block_that_defines_build_model_wins():
    text = "```python\nprint('hello')\n```\n```python\n" + FULL + "```"
    assert "hello" not in extract.extract_program(text)


# ---------------------------------------------------------------------------
# Registration and prompts.


def test_every_dataset_is_registered():
    names = envs_py.registry()
    for dataset in ("balance_scale", "breast_w", "pharyngitis", "health_insurance", "spaceship_titanic",
                    "airlines", "sklearn_breast_cancer", "sklearn_wine"):
        assert f"datasci/{dataset}" in names


def test_chat_prompt_names_dataset_and_shape():
    env = envs_py.make("datasci/balance_scale", template="chat")
    observation = env.reset(seed=0)
    assert observation.actions is None
    assert "balance_scale" in observation.text
    assert "4 feature columns" in observation.text and "125 rows" in observation.text
    assert "build_model(x_train, y_train)" in observation.text


def test_plain_prompt_ends_with_the_function_header():
    env = envs_py.make("datasci/balance_scale", template="plain")
    observation = env.reset()
    assert observation.text.endswith("def build_model(x_train, y_train):\n")
    assert observation.actions is None
    # The prompt plus a body is a valid program.
    assert extract.parses(observation.text + BODY)


def test_unknown_template_and_dataset_are_clear_errors():
    with pytest.raises(prompts.TemplateError, match="unknown template"):
        envs_py.make("datasci/balance_scale", template="markdown")
    with pytest.raises(DatasetError, match="unknown dataset"):
        envs_py.make("datasci/balance_scale", dataset="iris")


def test_retry_prompt_truncates_long_errors_and_code():
    text = prompts.retry_prompt("chat", "d", 10, 2, 2, previous_code="x = 1\n" * 1000,
                                error="E" * 10_000 + " last words", error_chars=100, code_chars=200)
    assert "last words" in text and "E" * 200 not in text
    assert len(text) < 1500


# ---------------------------------------------------------------------------
# Episodes (sandboxed runs).


def test_success_gives_mean_auc_and_ends_the_episode():
    env = envs_py.make("datasci/balance_scale", template="plain", timeout_s=WALL_S)
    env.reset()
    result = env.step(BODY)
    assert result.done and result.info["success"] is True
    direct = evaluate_candidate(extract.extract_program(BODY), *load_dataset("balance_scale"), FAST)
    assert result.info["auc_per_split"] == direct.auc_per_split
    assert result.reward == pytest.approx(np.mean(direct.auc_per_split))
    assert 0.5 < result.reward <= 1.0
    with pytest.raises(envs_py.StepAfterDoneError):
        env.step(BODY)


def test_failure_gives_penalty_and_retry_prompt_until_max_attempts():
    env = envs_py.make("datasci/balance_scale", template="chat", max_attempts=2, timeout_s=WALL_S)
    env.reset()
    first = env.step("```python\nimport not_a_real_module_abc\n" + FULL + "```")
    assert first.reward == -1.0 and not first.done
    assert first.info["success"] is False and "not_a_real_module_abc" in first.info["error"]
    assert "not_a_real_module_abc" in first.observation.text  # error and previous code
    assert "Previous code" in first.observation.text
    second = env.step("no code at all, sorry")
    assert second.reward == -1.0 and second.done
    with pytest.raises(envs_py.StepAfterDoneError):
        env.step(FULL)
    # reset starts a fresh episode with the first prompt again
    assert "Previous code" not in env.reset().text


def test_plain_retry_prompt_still_ends_with_the_header():
    env = envs_py.make("datasci/balance_scale", template="plain", max_attempts=3, timeout_s=WALL_S)
    env.reset()
    result = env.step("    return None\n")
    assert not result.done
    assert result.observation.text.endswith(prompts.FUNCTION_HEADER)
    assert "predict_proba" in result.observation.text


def test_vector_env_threads_steps_sandboxes_concurrently():
    with envs_py.VectorEnv("datasci/balance_scale", num_envs=2, seed=0, mode="threads",
                           template="plain", timeout_s=WALL_S) as vec:
        observations = vec.reset()
        assert len(observations) == 2
        results = vec.step([BODY, "    raise ValueError('boom')\n"])
    assert results[0].done and results[0].info["success"]
    assert "final_observation" in results[0].info
    assert not results[1].done and "boom" in results[1].info["error"]


def test_kaggle_env_uses_data_dir(datasets_dir):
    env = envs_py.make("datasci/pharyngitis", data_dir=datasets_dir)
    text = env.reset().text
    assert "512 rows" in text and "18 feature columns" in text and "2 classes" in text
