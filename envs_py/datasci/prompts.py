"""Prompt templates of DataSciCoding: the task, the retry after a failure, and the request for a
better program in an improvement episode (`improve_prompt`).

Two templates:
  "chat": the user message for an instruct model (the trainer applies the
    tokenizer's chat template); the model answers with code.
  "plain": a complete completion prompt for a base model; it ends with the
    header `def build_model(x_train, y_train):\n`, so the model writes the body.

The prompt names the dataset and the data shape and nothing else (paper §5).
"""

from __future__ import annotations

import textwrap

TEMPLATES = ("chat", "plain")
FUNCTION_HEADER = "def build_model(x_train, y_train):\n"
# Imports the plain prompt shows above the header; every extracted program
# starts with them too, so code that relies on them runs.
PRELUDE = "import numpy as np\nimport sklearn\n"
DEFAULT_ERROR_CHARS = 600
DEFAULT_CODE_CHARS = 2000
COMMENT_WIDTH = 78
# Small instruct models otherwise spend the token budget on docstrings and
# example usage and get cut off mid-function.
CHAT_ANSWER_FORMAT = "Answer with short Python code only: the imports and the function, no docstring, no example usage."


class TemplateError(ValueError):
    """An unknown prompt template name."""


def check_template(template: str) -> str:
    """Returns `template` if it is known, else raises TemplateError."""
    if template not in TEMPLATES:
        raise TemplateError(f"unknown template {template!r}; choose one of {', '.join(TEMPLATES)}")
    return template


def truncate(text: str, max_chars: int) -> str:
    """Returns `text` cut to at most `max_chars` characters, keeping its end."""
    text = text.strip()
    if len(text) <= max_chars:
        return text
    return "..." + text[len(text) - max_chars + 3:]


def task_description(dataset: str, num_rows: int, num_features: int, num_classes: int) -> str:
    """Returns the one-paragraph task statement shared by both templates.

    It says that the scoring happens outside the function: wording that only
    said "scored by ROC AUC on held-out rows" made instruct models split
    x_train and evaluate inside build_model (returning a score, or nothing).
    """
    return (
        f"Dataset: {dataset}. x_train is a NumPy float array with {num_features} feature columns and "
        f"y_train holds integer class labels ({num_classes} classes); they are the training half of a table "
        f"of {num_rows} rows. Write the Python function `build_model(x_train, y_train)` that fits a "
        "scikit-learn classifier on all of x_train, y_train and returns the fitted classifier. Do not "
        "split or evaluate: the caller scores the returned classifier's predict_proba by ROC AUC on "
        "held-out rows."
    )


def task_prompt(template: str, dataset: str, num_rows: int, num_features: int, num_classes: int) -> str:
    """Returns the first observation text of an episode."""
    description = task_description(dataset, num_rows, num_features, num_classes)
    if check_template(template) == "chat":
        return description + "\n" + CHAT_ANSWER_FORMAT
    return _plain_prompt(description)


def retry_prompt(template: str, dataset: str, num_rows: int, num_features: int, num_classes: int,
                 previous_code: str, error: str, error_chars: int = DEFAULT_ERROR_CHARS,
                 code_chars: int = DEFAULT_CODE_CHARS) -> str:
    """Returns the observation after a failed attempt: the task, the code, the error."""
    description = task_description(dataset, num_rows, num_features, num_classes)
    code = truncate(previous_code, code_chars)
    message = truncate(error, error_chars)
    if check_template(template) == "chat":
        return (
            f"{description}\nYour previous code failed.\nPrevious code:\n```python\n{code}\n```\n"
            f"Error:\n{message}\nWrite a corrected version. {CHAT_ANSWER_FORMAT}"
        )
    commented = "\n".join("# " + line for line in (
        ["Previous attempt:"] + code.splitlines() + ["It failed with:"] + message.splitlines()
    ))
    return _plain_prompt(description + "\n", commented + "\n")


def improve_prompt(template: str, dataset: str, num_rows: int, num_features: int, num_classes: int,
                   best_code: str, best_auc: float, last_code: str | None = None, last_error: str | None = None,
                   last_auc: float | None = None, error_chars: int = DEFAULT_ERROR_CHARS,
                   code_chars: int = DEFAULT_CODE_CHARS) -> str:
    """Returns the observation of an improvement episode once a program has run: the task, the
    episode's best program and its ROC AUC, what the last attempt did when it was not that best
    program (`last_code` and `last_error` when it failed, `last_auc` when it ran and scored no
    better), and the request for a better program."""
    description = task_description(dataset, num_rows, num_features, num_classes)
    best = truncate(best_code, code_chars)
    chat = check_template(template) == "chat"
    last = []
    if last_error is not None:
        code = truncate(last_code or "", code_chars)
        last = ["Your last program failed.", "Its code:",
                *([f"```python\n{code}\n```"] if chat else code.splitlines()),
                "Error:", *truncate(last_error, error_chars).splitlines()]
    elif last_auc is not None:
        last = [f"Your last program ran and scored ROC AUC {last_auc:.4f}, not better."]
    ask = "Write a better version: a classifier whose ROC AUC on held-out rows is higher."
    if chat:
        return "\n".join([description, f"Your best program so far scores ROC AUC {best_auc:.4f}:",
                          f"```python\n{best}\n```", *last, f"{ask} {CHAT_ANSWER_FORMAT}"])
    commented = "\n".join("# " + line for line in (
        [f"Best program so far (ROC AUC {best_auc:.4f}):"] + best.splitlines() + last + [ask]))
    return _plain_prompt(description + "\n", commented + "\n")


def _plain_prompt(description: str, extra: str = "") -> str:
    comment = "\n".join("# " + line for line in textwrap.wrap(description, COMMENT_WIDTH))
    return f"{comment}\n{extra}{PRELUDE}\n\n{FUNCTION_HEADER}"
