"""The API and the worker's parent process import no torch (ruff and mypy run in `make lint`)."""

from __future__ import annotations

import subprocess
import sys

from tests.kit import REPO


def test_the_service_never_imports_torch() -> None:
    code = "import sys, service.main, service.routes.jobs; sys.exit('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, "importing the API pulled in torch" + result.stderr


def test_the_worker_parent_never_imports_torch() -> None:
    code = "import sys, worker.runner; sys.exit('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, "importing the worker runner pulled in torch" + result.stderr
