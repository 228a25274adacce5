"""A local stack: the database migrated, the API and workers each a process of its own, ready.

The API is `python -m service` and a worker `python -m worker` (what `gluejobs serve` and
`gluejobs worker` run), configured through their environment (the settings as GLUEJOBS_*
variables). `gluejobs demo`, the benchmarks in bench/ and the end-to-end tests start their parts
here, so each starts them the same way. This module sits in the top layer: it starts the service's
parts as processes and imports neither FastAPI nor torch.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from shared.core.config import Settings
from shared.core.db import Database
from shared.core.migrate import upgrade
from worker.fleet.launch import child_environment

# `gluejobs serve`: migrates, then serves with uvicorn (an access log line a request).
API_COMMAND = (sys.executable, "-m", "service")
READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 30.0


class StackError(RuntimeError):
    """A part of the local stack did not start."""


@dataclass(frozen=True)
class Stack:
    url: str  # the API's base URL ("" when the stack has no API)
    api: subprocess.Popen[bytes] | None
    workers: list[subprocess.Popen[bytes]]
    logs: Path


@contextmanager
def local_stack(
    settings: Settings,
    *,
    logs: Path,
    port: int | None = None,
    api: bool = True,
    workers: int = 1,
    worker_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    migrate: bool = True,
    api_command: Sequence[str] = API_COMMAND,
) -> Iterator[Stack]:
    """Migrate `settings`' database, start the API (on `port`, else a free one) and wait until it is
    ready, start `workers` workers with `worker_args`; stop them all (SIGTERM, then SIGKILL) on the
    way out. `env`: the processes' environment (default: stack_environment(settings)). Each process
    writes its output to a file in `logs` (api.log, worker-0.log, …). `api_command` runs the API
    (`--port N` is added)."""
    environment = dict(env) if env is not None else stack_environment(settings)
    logs.mkdir(parents=True, exist_ok=True)
    if migrate:  # once, before the processes start: two of them migrating at once could collide
        database = Database(settings.database_url)
        upgrade(database)
        database.dispose()
    started: list[subprocess.Popen[bytes]] = []
    try:
        server, url = None, ""
        if api:
            port = port or free_port()
            # Another API there would answer in this one's place (and take the caller's jobs).
            if not port_free(port):
                raise StackError(f"port {port} is taken; choose another")
            url = f"http://127.0.0.1:{port}"
            server = start_api(environment, port=port, log=logs / "api.log", command=api_command)
            started.append(server)
            wait_ready(url, process=server, log=logs / "api.log")
        running = []
        for index in range(workers):
            running.append(start_worker(environment, *worker_args, log=logs / f"worker-{index}.log"))
            started.append(running[-1])
        yield Stack(url=url, api=server, workers=running, logs=logs)
    finally:
        for process in reversed(started):
            stop(process)


def stack_environment(settings: Settings, **extra: str) -> dict[str, str]:
    """This process's environment with `settings` as GLUEJOBS_* variables (what a worker hands its
    jobs), and `extra` over them."""
    return {**child_environment(settings), **extra}


def start_api(
    env: Mapping[str, str],
    *,
    port: int,
    log: Path | None = None,
    args: Sequence[str] = (),
    command: Sequence[str] = API_COMMAND,
) -> subprocess.Popen[bytes]:
    return start_process([*command, "--port", str(port), *args], env, log)


def start_worker(env: Mapping[str, str], *args: str, log: Path | None = None) -> subprocess.Popen[bytes]:
    return start_process([sys.executable, "-m", "worker", *args], env, log)


def start_process(
    command: Sequence[str], env: Mapping[str, str], log: Path | None
) -> subprocess.Popen[bytes]:
    """`command` in a session of its own, so that a stop reaches its children (a worker's jobs) and
    it outlives the terminal that started it; its output appended to `log`."""
    if log is None:
        return _popen(command, env, subprocess.DEVNULL)
    with log.open("ab") as output:  # the child keeps its own copy of the file
        return _popen(command, env, output)


def _popen(
    command: Sequence[str], env: Mapping[str, str], output: IO[bytes] | int
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        list(command),
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def ready(url: str, path: str = "/readyz") -> bool:
    """Whether the API at `url` answers `path` (readiness: the database too) with 200."""
    try:
        return httpx.get(f"{url}{path}", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def wait_ready(
    url: str,
    *,
    process: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
    timeout_s: float = READY_TIMEOUT_S,
    path: str = "/readyz",
) -> None:
    """Wait until the API at `url` is ready; StackError when `process` (the API's) exits first, or
    when `timeout_s` passes. The error names `log`, where the API said why."""
    see = f"; see {log}" if log is not None else ""
    deadline = time.monotonic() + timeout_s
    while not ready(url, path):
        if process is not None and process.poll() is not None:
            raise StackError(
                f"the API exited with status {process.returncode} before it was ready{see}{last_lines(log)}"
            )
        if time.monotonic() > deadline:
            raise StackError(f"the API did not answer at {url} within {timeout_s:.0f}s{see}")
        time.sleep(0.2)


LOG_TAIL_LINES = 5


def last_lines(log: Path | None, count: int = LOG_TAIL_LINES) -> str:
    """The end of `log` (what a process said before it exited), indented on lines of their own; "" when
    there is no log. Reads at most 8 KiB of it, however long it grew."""
    if log is None or not log.is_file():
        return ""
    with log.open("rb") as file:
        file.seek(max(0, file.seek(0, os.SEEK_END) - 8192))
        tail = file.read().decode("utf-8", "replace").splitlines()[-count:]
    return "".join(f"\n    {line}" for line in tail)


def stop(process: subprocess.Popen[bytes], *, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM to the process's session (a worker then hands its jobs back), SIGKILL after grace_s."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        if process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):  # its session ended meanwhile
            os.killpg(process.pid, sig)
        try:
            process.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port nothing listens on now (the OS's pick)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
