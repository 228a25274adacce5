"""The wheels are the product: built from this repository, installed non-editable into virtualenvs
far from it, they migrate, serve, work and train with no source checkout, each role in its own folder
(a laptop, an API box, a worker box), the files and the model in an S3 store (moto's server), the
database in Postgres. The client's venv holds the client alone: nothing named service, shared or worker.

The client's venv and the API's are fresh installs, resolved by pip as docs/operators/install.md's lines do.
The worker's venv is a fair shortcut: a fresh venv with both wheels installed for real (non-editable,
--no-deps) over the training stack of the venv that runs the tests (the same pinned versions), reached
through a path file (not a site dir: that venv's editable install of the repository stays out of
it). A fresh worker venv (CPU torch and the training stack, about 1.4 GB) took about 5 minutes on the
loaded 2-core machine; GLUEJOBS_INSTALL_TEST_FRESH_WORKER=1 installs it for real. Each install's
size and time are printed (and docs/operators/install.md quotes them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import httpx
import pytest

from gluejobs.stack import free_port, stop, wait_ready
from tests.kit import REPO
from tests.s3_endpoint import S3Endpoint

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

DEMO_DATA = REPO / "gluejobs" / "demo_data"
FRESH_WORKER = os.environ.get("GLUEJOBS_INSTALL_TEST_FRESH_WORKER") == "1"


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


def megabytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink()) // 2**20


def make_venv(
    folder: Path, pip_args: list[str], *, cwd: Path, borrow: Path | None = None
) -> dict[str, float]:
    """A venv at `folder` with `pip install <pip_args>`; with `borrow`, that site-packages folder is on
    its path (after its own). Returns the install's seconds and megabytes."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    if borrow is not None:
        purelib = run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=cwd)
        (Path(purelib.strip()) / "borrowed_training_stack.pth").write_text(f"{borrow}\n")
    run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-compile", "-q", *pip_args],
        cwd=cwd,
        env=clean_environment(),
        timeout=1200,
    )
    return {"seconds": round(time.monotonic() - started, 1), "mb": megabytes(folder)}


def build_wheels(out: Path) -> dict[str, Path]:
    run(
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
            ".",
            "./server",
        ],
        cwd=REPO,
    )
    return {wheel.name.split("-")[0]: wheel for wheel in out.glob("*.whl")}


def register_model(client: Path, folder: Path, *, env: dict[str, str], cwd: Path) -> str:
    """MiniLM registered through the models route from the client venv's CLI: the API box and the
    worker box get it from the store, with no GLUEJOBS_MODELS_DIR on either. The name jobs use."""
    said = run(
        [str(client / "gluejobs"), "models", "upload", str(folder), "--name", "minilm"], env=env, cwd=cwd
    )
    assert '"model:minilm"' in said, said
    return "model:minilm"


def test_the_wheels_install_and_train_without_the_source_tree(
    tmp_path: Path, postgres_url: str, s3_endpoint: S3Endpoint, minilm_path: Path
) -> None:
    wheels = build_wheels(tmp_path / "wheels")
    assert wheels.keys() == {"gluejobs", "gluejobs_server"}
    machines = {name: tmp_path / name for name in ("laptop", "api", "box")}
    for folder in machines.values():
        folder.mkdir()
    links = ["--find-links", str(tmp_path / "wheels")]

    installs = {
        "client": make_venv(tmp_path / "venv-client", [str(wheels["gluejobs"])], cwd=machines["laptop"]),
        "api": make_venv(tmp_path / "venv-api", [*links, "gluejobs-server"], cwd=machines["api"]),
    }
    if FRESH_WORKER:
        worker_install = [*links, "torch==2.13.0", "gluejobs-server[worker]"]
        installs["worker"] = make_venv(tmp_path / "venv-worker", worker_install, cwd=machines["box"])
    else:
        borrowed = Path(sysconfig.get_path("purelib"))
        worker_install = ["--no-deps", str(wheels["gluejobs"]), str(wheels["gluejobs_server"])]
        installs["worker (wheels over the test venv's stack)"] = make_venv(
            tmp_path / "venv-worker", worker_install, cwd=machines["box"], borrow=borrowed
        )
    print("\ninstalls:", json.dumps(installs))  # noqa: T201  (the figures docs/operators/install.md quotes)
    client, api, worker = (tmp_path / f"venv-{role}" / "bin" for role in ("client", "api", "worker"))

    # The laptop: the client and the CLI alone; the API box: no torch.
    probe = "import importlib.util as u, sys; print([m for m in sys.argv[1:] if u.find_spec(m)])"
    generic = ["service", "shared", "worker", "alembic", "bench", "tests", "torch", "fastapi"]
    assert run([str(client / "python"), "-c", probe, *generic], cwd=machines["laptop"]).strip() == "[]"
    assert "torch" not in run(
        [str(api / "python"), "-c", probe, "torch", "transformers"], cwd=machines["api"]
    )
    # Every server-side import comes from the installed wheel, never from the repository.
    where = "import service, shared.core.migrate as m; print(service.__file__, m.migrations_dir())"
    for venv, machine in ((api, "api"), (worker, "box")):
        located = run([str(venv / "python"), "-c", where], cwd=machines[machine], env=clean_environment())
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

    # No GLUEJOBS_MODELS_DIR anywhere: the model travels through the store (register_model).
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
        model = register_model(client, minilm_path, env=laptop, cwd=machines["laptop"])
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
        assert {w["version"] for w in workers} == {"0.2.0"}

        # The laptop downloads the model; the worker box's transformers loads it.
        run([str(client / "gluejobs"), "download", str(job), "model"], env=laptop, cwd=machines["laptop"])
        load = (
            "import sys; from transformers import AutoModelForSequenceClassification as M; "
            "print(M.from_pretrained(sys.argv[1]).config.num_labels)"
        )
        downloaded = machines["laptop"] / "model"
        assert run([str(worker / "python"), "-c", load, str(downloaded)], cwd=machines["box"]).strip() == "2"
    finally:
        if box is not None:
            stop(box)
        stop(server)
