"""What one candidate run may use and what it gives back: `SandboxLimits`, `CandidateResult`.

Also the runner script every path starts (`RUNNER`) and the environment it
sees (`scrubbed_environment`): nothing of the trainer's.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib

import numpy as np

# The runner (cold) and zygote (warm) script, beside this package; never imported by the trainer.
RUNNER = pathlib.Path(__file__).parent.parent / "_runner.py"

ERROR_TAIL_CHARS = 2000
NOBODY_UID = 65534

_GIB = 1 << 30
_MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Limits of one candidate run.

    Attributes:
      wall_seconds: wall clock of each split's run (its interpreter start,
        imports, fit and predict).  A program that overruns it fails at that
        split; a whole run is bounded by number of splits x wall_seconds.
      cpu_seconds: CPU time (RLIMIT_CPU).
      memory_bytes: address space (RLIMIT_AS).
      file_bytes: largest file the candidate may write (RLIMIT_FSIZE).
      max_processes: RLIMIT_NPROC for the candidate's uid (every process and
        thread of that uid on the machine counts).
      max_output_chars: characters the candidate may print (through Python or
        raw descriptors) before it fails.
      workdir_bytes: size of the candidate's private tmpfs working directory.
      run_as_uid: host uid of the candidate when the trainer is root.
      allow_unsandboxed: run candidates without bubblewrap when it cannot be
        used (unsafe; a warning is logged).  `$POAD_ALLOW_UNSANDBOXED=1` does
        the same.  Has no effect where the sandbox works.
      warm: score a program in one sandbox whose zygote imports scikit-learn
        once and forks a freshly isolated process per split (the default);
        False gives each split a sandbox and an interpreter of its own (the
        cold path, as before).  Unsandboxed runs are always cold.
    """

    wall_seconds: float = 30.0
    cpu_seconds: int = 60
    memory_bytes: int = 4 * _GIB
    file_bytes: int = 64 * _MIB
    max_processes: int = 64
    max_output_chars: int = 1 * _MIB
    workdir_bytes: int = 256 * _MIB
    run_as_uid: int = NOBODY_UID
    allow_unsandboxed: bool = False
    warm: bool = True

    def __post_init__(self):
        for field in ("wall_seconds", "cpu_seconds", "memory_bytes", "file_bytes", "max_processes",
                      "max_output_chars", "workdir_bytes", "run_as_uid"):
            if getattr(self, field) <= 0:
                raise ValueError(f"SandboxLimits.{field} must be positive, got {getattr(self, field)}")


@dataclasses.dataclass(frozen=True)
class CandidateResult:
    """Outcome of one candidate.

    Attributes:
      success: True when every split produced valid probabilities.
      auc_per_split: ROC AUC of each split (empty on failure).
      error: one message for the agent on failure ("" on success).
      seconds: wall-clock seconds the run took.
      network_isolated: whether the candidate saw no network interface but loopback.
      sandboxed: whether it ran inside bubblewrap (False only when allowed unsandboxed).
      splits_run: how many splits were started (each had its own wall clock).
      warm: whether the warm sandbox (a zygote forking each split) scored it.
      start_seconds: seconds this program waited for a warm sandbox to start
        (bounded by START_WALL_S; 0 in a kept sandbox already started, and
        on the cold path, where each split's clock covers its start).
      failure_stage: how far a failing program got, one of
        `envs_py.datasci.stages.STAGES` (None on success).
    """

    success: bool
    auc_per_split: tuple[float, ...] = ()
    error: str = ""
    seconds: float = 0.0
    network_isolated: bool = False
    sandboxed: bool = False
    splits_run: int = 0
    warm: bool = False
    start_seconds: float = 0.0
    failure_stage: str | None = None

    @property
    def mean_auc(self) -> float:
        return float(np.mean(self.auc_per_split)) if self.auc_per_split else float("nan")


def scrubbed_environment(workdir: str | os.PathLike) -> dict[str, str]:
    """Returns the candidate's environment: nothing from the trainer but PATH basics."""
    single_thread = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(workdir),
        "TMPDIR": str(workdir),
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        **single_thread,
    }
