"""What `pip install gluejobs` and the images contain: the client and the CLI alone (the server's
stack and the worker's as extras), the API without torch, the dashboard's files in the wheel, an API
image and a worker image, and a compose file whose API and workers share no disk."""

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
    assert "torch" not in api_runs.lower() and 'pip install -e ".[server]"' in api_runs
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
    # No disk shared: the API and the workers keep every file in the S3-compatible store beside them.
    shared = set(services["api"].get("volumes", [])) & set(services["worker"].get("volumes", []))
    assert shared == set()
    environment = compose["x-gluejobs-env"]
    assert environment["GLUEJOBS_STORAGE_URL"].startswith("s3://")
    assert environment["AWS_ENDPOINT_URL"] == "http://minio:9000" and "minio" in services
    assert (
        {"postgres", "minio"} <= set(services["api"]["depends_on"]) <= set(services["worker"]["depends_on"])
    )


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
    requirements = metadata.get_all("Requires-Dist") or []

    def names(extra: str | None) -> set[str]:
        wanted = [
            r for r in requirements if ("extra ==" not in r if extra is None else f'extra == "{extra}"' in r)
        ]
        return {re.split(r"[<>=\[ ;]", r)[0] for r in wanted}

    # `pip install gluejobs`: the client and the CLI, nothing of the server's or the worker's stack.
    assert names(None) == {"httpx", "rich", "pydantic", "pydantic-settings", "pyyaml"}
    assert {"fastapi", "sqlalchemy", "pandas", "pyarrow", "fsspec", "s3fs", "python-multipart"} <= names(
        "server"
    )
    assert "torch" in names("worker") and "gluejobs" in names("worker")  # gluejobs[server] and torch


def test_the_command_line_works_without_the_server_or_worker_stack(tmp_path: Path) -> None:
    """A client-only install: the CLI's client commands import nothing of the server's stack (they
    are hidden here, as on a laptop with `pip install gluejobs` alone)."""
    data = tmp_path / "mine.csv"
    data.write_text("sentence,label\nfine,1\n")
    hidden = (
        "fastapi",
        "starlette",
        "sqlalchemy",
        "alembic",
        "pandas",
        "numpy",
        "pyarrow",
        "tokenizers",
        "fsspec",
        "s3fs",
        "torch",
        "transformers",
    )
    code = (
        "import importlib.abc, sys\n"
        "class Hidden(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        f"        if name.split('.')[0] in {hidden!r}: raise ImportError('not installed: ' + name)\n"
        "sys.meta_path.insert(0, Hidden())\n"
        "from gluejobs.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    nobody = "http://127.0.0.1:9"  # the discard port: nothing answers
    for command, status in (
        (["submit", "--dry-run", "--model_name_or_path", "bert-base-cased", "--task_name", "sst2"], 0),
        (
            [
                "submit",
                "--model_name_or_path",
                "m",
                "--train_file",
                str(data),
                "--validation_file",
                str(data),
            ],
            2,
        ),
        (["files", "upload", str(data)], 2),
    ):
        result = subprocess.run(
            [sys.executable, "-c", code, *command, "--url", nobody], cwd=REPO, capture_output=True, text=True
        )
        assert result.returncode == status, result.stderr
        assert (
            "not installed" not in result.stderr and "cannot reach the API" in result.stdout + result.stderr
        )
