"""Scoring a program: the splits, one split's result read and checked, its ROC AUC computed here.

The test labels never leave the trainer: a split's runner returns
probabilities, and `read_result` scores them.  Anything malformed on the
result stream becomes the candidate's error, never an exception here.
"""

from __future__ import annotations

import dataclasses
import io
import json
import signal
from typing import Sequence

import numpy as np

from envs_py.datasci.sandbox.limits import ERROR_TAIL_CHARS, SandboxLimits
from envs_py.datasci.stages import known_stage
from envs_py.datasci.sandbox.pipes import Exchange

NUM_SPLITS = 5
TEST_FRACTION = 0.5

# Bytes of the result stream beyond the probabilities themselves (status, zip headers).
RESULT_OVERHEAD_BYTES = 1 << 20


def split_indices(num_rows: int, num_splits: int = NUM_SPLITS, test_fraction: float = TEST_FRACTION):
    """Returns [(train_idx, test_idx)] of `train_test_split(random_state=s)`, s = 0..num_splits-1."""
    from sklearn.model_selection import train_test_split

    rows = np.arange(num_rows)
    return [tuple(train_test_split(rows, test_size=test_fraction, random_state=s)) for s in range(num_splits)]


def roc_auc(y_true: np.ndarray, proba: np.ndarray, classes: Sequence[int]) -> float:
    """Returns ROC AUC: positive-class column for 2 classes, one-vs-one macro above.

    Raises ValueError for NaN/inf probabilities or a split with one class.
    """
    from sklearn.metrics import roc_auc_score

    if not np.all(np.isfinite(proba)):
        raise ValueError("predict_proba returned NaN or infinite probabilities")
    if len(classes) == 2:
        return float(roc_auc_score(y_true, proba[:, 1]))
    present = np.unique(y_true)
    scores = proba[:, [list(classes).index(c) for c in present]]
    totals = scores.sum(axis=1, keepdims=True)
    if not np.allclose(totals, 1.0):
        # roc_auc_score needs rows summing to 1 over the classes present;
        # rows that already do are left untouched so that ties stay ties.
        scores = np.where(totals > 0, scores / np.where(totals > 0, totals, 1.0), 1.0 / len(present))
    return float(roc_auc_score(y_true, scores, multi_class="ovo", labels=present))


def result_cap_bytes(num_test: int, num_classes: int) -> int:
    """Bytes one split's result stream may hold: its float64 probabilities plus overhead."""
    return num_test * num_classes * 8 + RESULT_OVERHEAD_BYTES


@dataclasses.dataclass(frozen=True)
class SplitOutcome:
    """What one split's run gave: its AUC, or the error that fails the whole candidate and the
    stage it failed in (`envs_py.datasci.stages`)."""

    auc: float = float("nan")
    error: str = ""
    network_isolated: bool = False
    stage: str | None = None


def split_outcome(got: Exchange, returncode: int, y_test, classes, index: int, limits: SandboxLimits,
                  sandboxed: bool) -> SplitOutcome:
    """Turns one split's exchange into its AUC or the candidate's error."""
    if got.timed_out:
        return SplitOutcome(error=f"TimeoutError: the code ran longer than {limits.wall_seconds:g} s "
                                  f"on split {index}", stage="limit")
    if got.overflow == "log":
        return SplitOutcome(error=f"OverflowError: output limit of {limits.max_output_chars} characters exceeded",
                            stage="limit")
    if got.overflow:
        return SplitOutcome(error=f"the result stream passed {result_cap_bytes(len(y_test), len(classes))} bytes",
                            stage="proba")
    return read_result(bytes(got.result), bytes(got.log_tail), y_test, classes, index, returncode, sandboxed)


def read_result(data: bytes, log: bytes, y_test, classes, index: int, returncode: int,
                sandboxed: bool) -> SplitOutcome:
    """Scores one runner's .npz against the split's test labels (which never left this process)."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as result:
            status = json.loads(bytes(result["status"]).decode("utf-8"))
            arrays = {name: np.asarray(result[name]) for name in result.files if name == "proba"}
        if not isinstance(status, dict):
            raise ValueError("status is not an object")
    except Exception:  # noqa: BLE001 - anything the candidate could have written on the stream
        tail = log.decode("utf-8", "replace").strip()[-ERROR_TAIL_CHARS:]
        reason = describe_exit(returncode, sandboxed)
        return SplitOutcome(error=f"the process {reason} without a result" + (f":\n{tail}" if tail else ""),
                            stage="limit")
    isolated = bool(status.get("network_isolated", False))
    if not status.get("ok"):
        return SplitOutcome(error=str(status.get("error", "unknown error"))[:ERROR_TAIL_CHARS],
                            network_isolated=isolated, stage=known_stage(status.get("stage")))
    labels = [int(c) for c in classes]
    try:
        proba = np.asarray(arrays["proba"], dtype=np.float64)
        if proba.shape != (len(y_test), len(labels)):
            raise ValueError(f"probabilities of split {index} have shape {proba.shape}")
        return SplitOutcome(auc=roc_auc(y_test, proba, labels), network_isolated=isolated)
    except (KeyError, TypeError, ValueError) as error:
        return SplitOutcome(error=f"{type(error).__name__}: {error}", network_isolated=isolated, stage="proba")


def describe_exit(returncode: int | None, sandboxed: bool = False) -> str:
    if returncode is None:
        return "ended with its sandbox"
    # Inside bubblewrap a signal death reaches us as 128 + signal (timeout's and bwrap's convention).
    number = -returncode if returncode < 0 else (returncode - 128 if sandboxed and returncode > 128 else 0)
    if number:
        try:
            return f"was killed by {signal.Signals(number).name}"
        except ValueError:
            return f"was killed by signal {number}"
    return f"exited with code {returncode}"
