"""Ruff (with the no-print rule) and mypy over the code, as part of the suite."""

from __future__ import annotations

import subprocess
import sys

from tests.kit import REPO


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *command], cwd=REPO, capture_output=True, text=True, timeout=600
    )


def test_ruff_check() -> None:
    result = run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format() -> None:
    result = run("ruff", "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy() -> None:
    result = run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_service_never_imports_torch() -> None:
    code = "import sys, service.main, service.routes.jobs; sys.exit('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, "importing the API pulled in torch" + result.stderr


def test_the_worker_parent_never_imports_torch() -> None:
    code = "import sys, worker.runner; sys.exit('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, "importing the worker runner pulled in torch" + result.stderr
