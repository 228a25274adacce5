"""What a worker runs on: GPUs it holds for its life, or CPU slots; and which of them are free.

A worker's devices are either CUDA devices ("0", "1" … as CUDA_VISIBLE_DEVICES names them) or CPU
slots ("cpu0", "cpu1" …). Each running job holds as many of them as its `num_processes`, and its
child sees only its own GPUs through CUDA_VISIBLE_DEVICES.

Two workers on one machine never share a GPU: a worker takes an exclusive lock file per GPU
(flock, in GLUEJOBS_DEVICE_LOCK_DIR) when it starts and holds it until its process ends — the
kernel drops the lock even after a SIGKILL, so a dead worker never leaves a GPU fenced off. CPU
slots take no lock: several CPU workers on one machine share its cores by design (`--slots`).

Torch-free: the worker's parent never imports torch, so GPUs are found with `nvidia-smi -L` (or
read from CUDA_VISIBLE_DEVICES when that is set), never by initialising CUDA.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from shared.core.errors import GluejobsError

logger = logging.getLogger(__name__)

CPU_PREFIX = "cpu"
NVIDIA_SMI_TIMEOUT_S = 10.0
# What CUDA_VISIBLE_DEVICES accepts: an index, or a GPU/MIG UUID.
_DEVICE_ID = re.compile(r"(\d+|(GPU|MIG)-[0-9A-Za-z/-]+)")
_SMI_LINE = re.compile(r"^GPU (\d+):", re.MULTILINE)


class DeviceError(GluejobsError):
    """The worker's devices could not be set up."""


def is_cpu(device: str) -> bool:
    return device.startswith(CPU_PREFIX)


def cpu_slots(count: int) -> list[str]:
    if count < 1:
        raise DeviceError(f"--slots must be at least 1, not {count}")
    return [f"{CPU_PREFIX}{i}" for i in range(count)]


def visible_gpus() -> list[str]:
    """The GPUs this process may use, without initialising CUDA: CUDA_VISIBLE_DEVICES when it is
    set (an empty value or -1 hides them all), else what `nvidia-smi -L` lists."""
    configured = os.environ.get("CUDA_VISIBLE_DEVICES")
    if configured is not None:
        gpus: list[str] = []
        for part in (p.strip() for p in configured.split(",")):
            # CUDA ignores everything from the first entry it cannot read on.
            if not _DEVICE_ID.fullmatch(part) or part.startswith("-"):
                break
            gpus.append(part)
        return gpus
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        listing = subprocess.run(
            [smi, "-L"], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("nvidia-smi -L failed (%s): running on the CPU", exc)
        return []
    if listing.returncode != 0:
        logger.warning("nvidia-smi -L exited with %d: running on the CPU", listing.returncode)
        return []
    return _SMI_LINE.findall(listing.stdout)


def parse_devices(text: str) -> list[str]:
    """`--devices 0,1,3` (CUDA indices or UUIDs) or `--devices cpu`."""
    parts = [p.strip() for p in text.split(",")]
    if parts == [CPU_PREFIX]:
        return [CPU_PREFIX]
    for part in parts:
        if not _DEVICE_ID.fullmatch(part):
            raise DeviceError(
                f"--devices: {part!r} is not a CUDA device (an index such as 0, or a GPU-… UUID); "
                "use --devices cpu (with --slots N) for the CPU"
            )
    duplicates = sorted({p for p in parts if parts.count(p) > 1})
    if duplicates:
        raise DeviceError(f"--devices names {', '.join(duplicates)} more than once")
    return parts


def resolve_devices(devices: str | None, slots: int | None) -> list[str]:
    """The worker's devices from its command line: the GPUs asked for, every visible GPU by
    default, else `slots` CPU slots (1 by default)."""
    asked = parse_devices(devices) if devices is not None else None
    if asked == [CPU_PREFIX] or (asked is None and slots is not None):
        return cpu_slots(slots if slots is not None else 1)
    visible = visible_gpus()
    if asked is not None:
        if slots is not None:
            raise DeviceError("--slots is for the CPU; on GPUs each device runs one job's process")
        unknown = [d for d in asked if visible and d not in visible]
        if unknown:
            raise DeviceError(
                f"--devices {','.join(unknown)}: not among this machine's visible GPUs ({','.join(visible)})"
            )
        if not visible:
            logger.warning("no GPU is visible here (nvidia-smi -L): trusting --devices %s", ",".join(asked))
        return asked
    return visible or cpu_slots(1)


@dataclass
class DeviceLocks:
    """Exclusive per-GPU lock files, held while this object is open (the worker's life)."""

    lock_dir: Path
    _files: dict[str, int] = field(default_factory=dict)

    def acquire(self, devices: Sequence[str], *, all_or_error: bool) -> list[str]:
        """Lock each GPU; the devices now held (CPU slots always). With all_or_error, a GPU that
        another worker holds is an error; otherwise it is skipped, and holding none is an error."""
        held: list[str] = []
        taken: list[str] = []
        for device in devices:
            if is_cpu(device) or self._lock(device):
                held.append(device)
            else:
                taken.append(f"{device} ({self._holder(device)})")
        if taken and (all_or_error or not held):
            self.release()
            raise DeviceError(
                f"GPU {', '.join(taken)} is held by another worker on this machine (lock files in "
                f"{self.lock_dir}); give this worker other devices with --devices"
            )
        if taken:
            logger.info("GPU(s) %s held by other workers: using %s", ", ".join(taken), ", ".join(held))
        return held

    def release(self) -> None:
        for fd in self._files.values():
            os.close(fd)  # closing the descriptor drops the flock
        self._files.clear()

    def _path(self, device: str) -> Path:
        return self.lock_dir / f"gpu-{device.replace('/', '_')}.lock"

    def _lock(self, device: str) -> bool:
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._path(device), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())  # who holds it, for the next worker's message
        self._files[device] = fd
        return True

    def _holder(self, device: str) -> str:
        try:
            pid = self._path(device).read_text().strip()
        except OSError:
            return "holder unknown"
        return f"pid {pid}" if pid else "holder unknown"


class DevicePool:
    """The worker's devices, handed out to jobs and given back; thread-safe."""

    def __init__(self, devices: Sequence[str]) -> None:
        if not devices:
            raise DeviceError("a worker needs at least one device or CPU slot")
        self.devices = list(devices)
        self._free = list(devices)
        self._lock = threading.Lock()

    @property
    def free(self) -> int:
        with self._lock:
            return len(self._free)

    def take(self, count: int) -> list[str]:
        with self._lock:
            if count > len(self._free):
                raise DeviceError(f"{count} device(s) asked for, {len(self._free)} free")
            taken, self._free = self._free[:count], self._free[count:]
            return taken

    def give_back(self, devices: Sequence[str]) -> None:
        with self._lock:
            self._free.extend(d for d in devices if d not in self._free)
            self._free.sort(key=self.devices.index)


def cpu_threads(held: Sequence[str], pool: Sequence[str], cores: int | None = None) -> dict[str, str]:
    """OMP_NUM_THREADS for a job's processes on CPU slots: the worker's cores shared among its slots
    (one process a slot). torch otherwise starts a thread per core in every process, and with two
    or more slots busy, OpenMP's spinning threads slow each other down many times over (two jobs
    on two cores ran several times slower than one after the other). Nothing for a GPU job, a worker
    of one slot (torch's default: every core), or an operator who set OMP_NUM_THREADS."""
    slots = sum(is_cpu(d) for d in pool)
    if "OMP_NUM_THREADS" in os.environ or slots <= 1 or not held or not all(is_cpu(d) for d in held):
        return {}
    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    return {"OMP_NUM_THREADS": str(max(1, cores // slots))}


def cuda_visible_devices(devices: Sequence[str]) -> str:
    """CUDA_VISIBLE_DEVICES for a job holding these devices; empty (no GPU) for CPU slots."""
    return ",".join(d for d in devices if not is_cpu(d))
