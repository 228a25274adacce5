"""What `pip install gluejobs` and the images contain: the client without the server's stack, the
API without torch, the dashboard's files in the wheel, an API image and a worker image."""

from __future__ import annotations

import email
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import yaml

from tests.kit import REPO


def stages(dockerfile: str) -> dict[str, list[str]]:
    """Each build stage's instructions (continuation lines joined), by stage name."""
    text = re.sub(r"\\\n\s*", " ", dockerfile)
    found: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.IGNORECASE)
        if match:
            current = found.setdefault(match.group(1), [])
        current.append(line)
    return found


def test_the_dockerfile_builds_an_api_image_without_torch_and_a_worker_image_with_it() -> None:
    built = stages((REPO / "Dockerfile").read_text())
    assert {"api", "worker"} <= built.keys()
    api_runs = " ".join(i for i in built["api"] if i.startswith("RUN"))
    worker_runs = " ".join(i for i in built["worker"] if i.startswith("RUN"))
    assert "torch" not in api_runs.lower() and "pip install -e ." in api_runs
    assert "[worker]" not in api_runs and "[worker]" in worker_runs and "TORCH_SPEC" in worker_runs
    assert built["api"][-1] == 'CMD ["gluejobs", "serve", "--host", "0.0.0.0", "--port", "8000"]'
    assert built["worker"][-1] == 'CMD ["gluejobs", "worker"]'
    # Every folder the packages need is copied in.
    copied = " ".join(built["source"])
    for folder in ("alembic", "shared", "service", "gluejobs", "worker"):
        assert f"COPY {folder} /app/{folder}" in copied


def test_compose_runs_the_api_image_and_the_worker_image() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    assert services["api"]["build"]["target"] == "api"
    assert services["api"]["command"][:2] == ["gluejobs", "serve"]
    assert services["worker"]["build"]["target"] == "worker"
    assert services["worker"]["command"][:2] == ["gluejobs", "worker"]
    # The worker's health port backs its healthcheck (liveness; /readyz says "waiting" for Postgres).
    port = services["worker"]["command"][services["worker"]["command"].index("--health-port") + 1]
    assert f":{port}/healthz" in " ".join(services["worker"]["healthcheck"]["test"])
    # The worker writes job folders that the API serves: both mount the same volume there.
    assert set(services["api"]["volumes"]) == set(services["worker"]["volumes"]) == {"data:/data"}


def test_the_client_loads_neither_the_server_stack_nor_torch() -> None:
    code = (
        "import sys, gluejobs; from gluejobs import Client, AsyncClient; "
        "heavy = [m for m in sys.modules if m.split('.')[0] in "
        "('pydantic', 'shared', 'service', 'worker', 'fastapi', 'sqlalchemy', 'torch')]; "
        "sys.exit(', '.join(heavy) or None)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, f"importing the client loaded: {result.stderr}"


def test_the_wheel_has_the_dashboard_and_no_torch_in_its_base_requirements(tmp_path: Path) -> None:
    # Built from a copy, so the build leaves nothing in the working tree.
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for package in ("gluejobs", "service", "shared", "worker"):
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            ".",
        ],
        cwd=source,
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("gluejobs-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = email.message_from_bytes(archive.read(next(n for n in names if n.endswith("METADATA"))))
    for asset in (
        "service/static/index.html",
        "service/static/dashboard.js",
        "service/static/dashboard.css",
        "service/static/vendor/uPlot.iife.min.js",
        "service/static/vendor/uPlot.min.css",
        "service/static/vendor/uPlot.LICENSE",
        "gluejobs/client.py",
    ):
        assert asset in names, asset
    base = [r for r in metadata.get_all("Requires-Dist") or [] if "extra ==" not in r]
    assert not any(r.startswith("torch") for r in base)
    assert {"httpx", "prometheus-client", "rich", "fastapi"} <= {re.split(r"[<>=\[ ;]", r)[0] for r in base}
    worker = [r for r in metadata.get_all("Requires-Dist") or [] if 'extra == "worker"' in r]
    assert any(r.startswith("torch") for r in worker)
