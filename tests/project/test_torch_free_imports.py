"""The API and the worker's parent process import no torch (ruff and mypy run in `make lint`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.kit import REPO


def test_the_service_never_imports_torch() -> None:
    code = "import sys, service.main, service.routes.jobs; sys.exit('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, "importing the API pulled in torch" + result.stderr


def test_the_worker_parent_never_imports_torch() -> None:
    code = "import sys, worker.fleet.runner; sys.exit('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, "importing the worker runner pulled in torch" + result.stderr


# What only uploads' checks, dry runs, file reads and a search's study need (numpy comes with pandas
# and with Optuna): imported when one first runs (or in the checks' forkserver children), never on the
# way to a ready API (issue 34 item 4: ~1.5 s of a restart's CPU).
READING_LIBRARIES = ("pandas", "pyarrow", "numpy", "torch")

READY_WITHOUT_THEM = """
import sys
from fastapi.testclient import TestClient
import service.server
from service.main import create_app
from shared.core.config import get_settings
from shared.core.db import Database
from shared.core.migrate import upgrade

service.server.import_the_api()
settings = get_settings()
upgrade(Database(settings.database_url))
with TestClient(create_app(settings), base_url="http://localhost") as client:
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.text
    loaded = sorted(name for name in {libraries!r} if name in sys.modules)
print(",".join(loaded))
"""


def test_a_ready_api_has_not_imported_the_file_readers(tmp_path: Path) -> None:
    """The API imported, its app created, its lifespan started and /readyz answered 200: no pandas,
    pyarrow, numpy or torch in the process."""
    env = {
        **os.environ,
        "GLUEJOBS_DATABASE_URL": f"sqlite:///{tmp_path / 'api.db'}",
        "GLUEJOBS_ARTIFACTS_DIR": str(tmp_path / "artifacts"),
        "GLUEJOBS_DATA_DIR": str(tmp_path / "data"),
    }
    code = READY_WITHOUT_THEM.format(libraries=READING_LIBRARIES)
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    loaded = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert loaded == "", f"a ready API had imported {loaded}"
