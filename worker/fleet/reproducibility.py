"""The reproducibility record: what an attempt runs with, stored on the job when the attempt starts.

Library versions (python, torch, transformers, accelerate, peft, datasets, tokenizers, gluejobs and
its git commit when it runs from a checkout), the device (CPU model, or GPU names, count and
memory, CUDA version), the sha256 of every data file the job reads and of the model's weight
files, and the resolved spec. A rerun's GET compares two records (service/research/reproduction.py).

Hashing a multi-gigabyte checkpoint takes seconds, so digests are cached on disk under
GLUEJOBS_CACHE_DIR keyed by (path, size, mtime): the tenth job on the same model reads nothing.
A record that cannot be collected never fails the job: it says what went wrong instead.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import subprocess
import time
import uuid
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from shared.core.config import Settings
from shared.core.tables import Job
from shared.data.reading import job_data_files
from shared.jobspec.capability import runnable_spec
from shared.jobspec.spec import JobSpec
from shared.model_folders.reading import local_model_folder, weight_files

logger = logging.getLogger(__name__)

PACKAGES = ("torch", "transformers", "accelerate", "peft", "datasets", "tokenizers", "numpy", "gluejobs")
GIT_TIMEOUT_S = 5.0
# git's "racily clean" rule: a file modified this recently may change again within the same mtime
# tick, so its digest is not cached (the next attempt hashes it again).
RECENT_MTIME_S = 2.0
HUB_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
REPO = Path(__file__).resolve().parents[2]


def environment_record(job: Job, settings: Settings) -> dict[str, Any]:
    """The record for the attempt that is starting (a job's process queues its write)."""
    try:
        return collect_environment(runnable_spec(job.spec), settings, attempt=job.attempts)
    except Exception as exc:  # the record documents a run; it must never be the reason a run fails
        logger.warning("job %s: could not collect the reproducibility record: %s", job.id, exc)
        return {"attempt": job.attempts, "error": f"{type(exc).__name__}: {exc}"}


def collect_environment(spec: JobSpec, settings: Settings, *, attempt: int | None = None) -> dict[str, Any]:
    commit, dirty = git_commit(REPO)
    return {
        "attempt": attempt,
        "collected_at": datetime.now(UTC).isoformat(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": {name: _version(name) for name in PACKAGES},
        "gluejobs_commit": commit,
        "gluejobs_checkout_modified": dirty,
        "device": device_info(),
        "data_files": data_file_hashes(spec, settings),
        "model_files": model_file_hashes(spec, settings),
        "spec": spec.model_dump(mode="json"),
    }


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def git_commit(folder: Path) -> tuple[str | None, bool | None]:
    """The checkout's commit and whether tracked files differ from it; (None, None) outside one."""
    if not (folder / ".git").exists():  # a file in a worktree, a folder in a clone
        return None, None
    try:
        commit = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=True,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    return commit or None, bool(status.strip())


def device_info() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda,
        "gpus": [],
    }
    if torch.cuda.is_available():
        info["gpus"] = [
            {
                "name": torch.cuda.get_device_name(i),
                "memory_bytes": torch.cuda.get_device_properties(i).total_memory,
            }
            for i in range(torch.cuda.device_count())
        ]
        info["gpu_count"] = len(info["gpus"])
        info["cudnn"] = torch.backends.cudnn.version()
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# ---------------------------------------------------------------------------------------------------
# Content hashes
# ---------------------------------------------------------------------------------------------------


def data_file_hashes(spec: JobSpec, settings: Settings) -> list[dict[str, Any]]:
    files = []
    for role, source in job_data_files(spec, settings).items():
        if isinstance(source, Path):
            files.append({"role": role, **file_record(source, settings.cache_dir)})
        else:  # the Hub's rows: identified by the dataset, read when the job loads it
            files.append({"role": role, "source": source, "sha256": None})
    return files


def model_file_hashes(spec: JobSpec, settings: Settings) -> list[dict[str, Any]]:
    if spec.registered_model is not None:  # its manifest's hash names every file's hash
        return [
            {
                "role": "registered model",
                "source": spec.model_name_or_path,
                "sha256": spec.registered_model.sha256,
            }
        ]
    folder = local_model_folder(spec.model_name_or_path, settings)
    if folder is not None:
        return [{"role": path.name, **file_record(path, settings.cache_dir)} for path in weight_files(folder)]
    from huggingface_hub import try_to_load_from_cache

    found = []
    for name in HUB_WEIGHT_FILES:
        cached = try_to_load_from_cache(spec.model_name_or_path, name)
        if isinstance(cached, str):  # the snapshot folder's name in the path is the Hub commit
            found.append({"role": name, **file_record(Path(cached), settings.cache_dir)})
    if not found:
        found.append(
            {
                "role": "hub",
                "source": f"the Hub's {spec.model_name_or_path} (not cached when the attempt started)",
                "sha256": None,
            }
        )
    return found


def file_record(path: Path, cache_dir: Path) -> dict[str, Any]:
    try:
        stat = path.stat()
        return {"path": str(path), "size": stat.st_size, "sha256": sha256_of(path, cache_dir)}
    except OSError as exc:
        return {"path": str(path), "sha256": None, "error": f"{type(exc).__name__}: {exc.strerror or exc}"}


def sha256_of(path: Path, cache_dir: Path) -> str:
    """The file's sha256, from the cache when the file's (path, size, mtime) has not changed."""
    resolved = path.resolve()
    stat = resolved.stat()
    key = hashlib.sha256(f"{resolved}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()
    entry = cache_dir / "sha256" / key
    try:
        cached = entry.read_text().strip()
        if len(cached) == 64:
            return cached
    except OSError:
        pass
    with resolved.open("rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    if time.time() - stat.st_mtime < RECENT_MTIME_S:
        return digest
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        partial = entry.with_name(f".{key}.{uuid.uuid4().hex}")
        partial.write_text(digest)
        partial.replace(entry)  # atomic: another worker hashing the same file at once is harmless
    except OSError as exc:  # a read-only cache costs time, not the record
        logger.info("could not cache the sha256 of %s: %s", path, exc)
    return digest
