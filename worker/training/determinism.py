"""use_deterministic_algorithms: deterministic kernels, and the environment they need.

microsoft/LoRA's shell configs export `CUBLAS_WORKSPACE_CONFIG=":16:8"` and `PYTHONHASHSEED=0`
and pass `--use_deterministic_algorithms`. Both variables only take effect when set before the
process they concern starts (Python reads PYTHONHASHSEED at start-up; cuBLAS reads its workspace
setting when CUDA creates its first handle), so the runner puts them in the job's child environment
(`job_environment`); the child then turns the deterministic kernels on (`deterministic_kernels`).

Torch-free at import: the runner imports this module and never loads torch.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

# The recipe's values (the shell configs' exports; ":16:8" is also what Trainer's full determinism sets).
DETERMINISTIC_ENVIRONMENT = {"CUBLAS_WORKSPACE_CONFIG": ":16:8", "PYTHONHASHSEED": "0"}


def job_environment(spec: Mapping[str, Any]) -> dict[str, str]:
    """Variables a job's child process must start with (none unless the job asks for determinism)."""
    return dict(DETERMINISTIC_ENVIRONMENT) if spec.get("use_deterministic_algorithms") else {}


@contextmanager
def deterministic_kernels(enabled: bool) -> Iterator[None]:
    """torch.use_deterministic_algorithms and cuDNN's deterministic mode for the run, as the recipe's
    `--use_deterministic_algorithms` does; the previous settings come back afterwards (a test process
    runs many jobs, a job's child one)."""
    if not enabled:
        yield
        return
    import torch

    # A run started without the runner (tests, notebooks) has not had the environment set before it
    # started: set the cuBLAS part now, which works as long as CUDA has not run a matmul yet.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", DETERMINISTIC_ENVIRONMENT["CUBLAS_WORKSPACE_CONFIG"])
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[1], before[2]
