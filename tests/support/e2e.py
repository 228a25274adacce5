"""Helpers for end-to-end tests: a real uvicorn server on a free port, and real worker processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from gluejobs._core import CLIENT_KEEPALIVE_S
from gluejobs_server import stack
from gluejobs_server.stack import free_port, stack_environment
from service.main import create_app
from shared.core.config import Settings

REPO = Path(__file__).resolve().parents[2]
# Starlette's TestClient names its server "testserver", a Host the API refuses (DNS rebinding): the
# in-process clients address it as a loopback address does.
LOOPBACK_URL = "http://127.0.0.1"
# Idle connections dropped before the API drops them (its keep-alive: 5 s), as the gluejobs client does:
# a request sent on a connection the server is closing at that instant is lost.
CLIENT_LIMITS = httpx.Limits(keepalive_expiry=CLIENT_KEEPALIVE_S)


@contextmanager
def live_api(settings: Settings) -> Iterator[httpx.Client]:
    """The real app behind a real socket, in a thread; a client for it. The socket is bound here and
    handed to uvicorn, so no other process can take its port between a probe and the bind."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = int(listener.getsockname()[1])
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the API did not start")
        time.sleep(0.05)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30, limits=CLIENT_LIMITS) as client:
            yield client
    finally:
        server.should_exit = True
        thread.join(10)
        listener.close()


def worker_env(settings: Settings) -> dict[str, str]:
    # No Hub here: fail at once instead of retrying.
    return stack_environment(settings, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")


def start_worker(settings: Settings, *args: str, log: Path | None = None) -> subprocess.Popen[bytes]:
    return stack.start_worker(worker_env(settings), *args, log=log)


def run_worker_until_idle(settings: Settings, log: Path, *args: str, timeout_s: float = 600) -> None:
    worker = start_worker(settings, "--exit-when-idle", *args, log=log)
    try:
        try:
            status = worker.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the worker still ran after {timeout_s:.0f}s:\n{log.read_text()[-3000:]}"
            ) from None
        assert status == 0, log.read_text()[-3000:]
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)


def submit(client: httpx.Client, spec: dict[str, Any], **body: Any) -> dict[str, Any]:
    response = client.post("/v1/jobs", json={"spec": spec, **body})
    assert response.status_code == 201, response.text
    job: dict[str, Any] = response.json()
    return job


def get(client: httpx.Client, path: str, **params: Any) -> Any:
    try:
        response = client.get(path, params=params)
    except httpx.RemoteProtocolError:
        # A kept-alive connection the API closed as the request went out: the expiry margin above
        # makes it rare, a machine loaded enough to hold the last answer back makes it possible (a
        # full run once lost a poll so). A GET is sent again, as the gluejobs client retries every
        # idempotent call after a transport error.
        response = client.get(path, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def all_metrics(client: httpx.Client, job_id: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    after = None
    while True:
        page = get(client, f"/v1/jobs/{job_id}/metrics", **({"after": after} if after else {}))
        rows += page["data"]
        if not page["has_more"]:
            return rows
        after = page["next_cursor"]


def run_python(code: str, *args: str, cwd: Path, env: dict[str, str]) -> str:
    """Run `code` in a fresh interpreter (the project importable) in `cwd` with exactly `env`; its
    standard output, once it has exited 0."""
    result = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def steps_of(rows: list[dict[str, Any]], split: str, name: str) -> list[int]:
    """The steps of one metric's rows (from `all_metrics`), in their order: each once, or a repeat shows."""
    return [r["step"] for r in rows if r["split"] == split and r["name"] == name]


def wait_for(predicate: Any, timeout_s: float = 300, interval_s: float = 0.3) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"condition not met within {timeout_s}s")


@contextmanager
def api_process(
    settings: Settings, *args: str, log: Path | None = None
) -> Iterator[tuple[httpx.Client, subprocess.Popen[bytes]]]:
    """The API as `python -m service` (what `gluejobs serve` runs) in a process of its own, with the
    settings in its environment: a client for it, and the process (to read its memory)."""
    process, url = start_api(stack_environment(settings), log=log, args=args)
    try:
        with httpx.Client(base_url=url, timeout=30, limits=CLIENT_LIMITS) as client:
            yield client, process
    finally:
        stack.stop(process, grace_s=10)


PORT_TAKEN = "address already in use"
START_TRIES = 3


def start_api(
    env: dict[str, str], *, log: Path | None = None, args: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[bytes], str]:
    """`python -m service` on a port the OS picked, once it answers /healthz: the process and its URL.
    A subprocess cannot be handed a bound socket through uvicorn's options, so the port is probed and
    let go first, and another process may take it before the API binds it (the suite's own clients
    use ephemeral ports of the same range). The API then exits saying so, and starts again on a newly
    picked port: never one it let go."""
    attempt = 1
    while True:
        said = log.stat().st_size if log is not None and log.exists() else 0
        port = free_port()
        process = stack.start_api(env, port=port, log=log, args=args)
        url = f"http://127.0.0.1:{port}"
        try:
            stack.wait_ready(url, process=process, log=log, path="/healthz")
            return process, url
        except stack.StackError:
            stack.stop(process)
            if attempt == START_TRIES or log is None or PORT_TAKEN not in _said_since(log, said):
                raise
            attempt += 1


def _said_since(log: Path, offset: int) -> str:
    with log.open("rb") as file:
        file.seek(offset)
        return file.read().decode("utf-8", "replace").lower()


def running(pid: int) -> bool:
    """Whether the process exists and is not a zombie (an orphan's new parent may reap it late)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
