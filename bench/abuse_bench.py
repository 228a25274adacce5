"""What slow clients and a database outage cost the API. Prints one JSON line per scenario.

slow-clients: hundreds of connections that send their request head a byte a second (and some that
send garbage), against `python -m service` (or, with --plain-uvicorn, the same app under uvicorn's
defaults, as before the connection guard); a normal client asks GET /v1/jobs on a fresh connection
once a second. Figures: its latency (median, max), the API's open file descriptors (before, peak),
how many slow connections the API closed, the API's log lines.

outage: the database goes away for 5 s (SQLite: its write lock held, the busy timeout 1 s;
Postgres with --postgres ADMIN_URL: ALTER DATABASE … ALLOW_CONNECTIONS false and its sessions
terminated) while 4 clients on keep-alive connections send 200 mixed requests and a stream follows
a job. Figures: status counts, failed connections, stream events lost or repeated, log lines.

dedup: whether an upload's time tells that another owner holds the same bytes (issue 21, finding 9).
An S3 store (moto's server, tests/support/s3_endpoint.py); one owner uploads a file of --file-mb MB;
then, per trial, a fresh owner uploads those same bytes ("someone else has them") and bytes nobody
has (the same size), in turn. Figures: each case's seconds per trial and the ratio of the medians.

    python bench/abuse_bench.py slow-clients [--slow 600] [--max-connections 200] [--plain-uvicorn]
    python bench/abuse_bench.py outage [--postgres postgresql+psycopg://postgres@127.0.0.1/test]
    python bench/abuse_bench.py dedup [--file-mb 40] [--trials 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.harness import scratch_postgres  # noqa: E402
from shared import jobs_repo  # noqa: E402
from shared.core.db import Database  # noqa: E402
from shared.core.migrate import upgrade  # noqa: E402
from tests.support.outages import outage  # noqa: E402

SPEC = {"model_name_or_path": "bert-base-uncased", "task_name": "sst2", "seed": 1}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def api(
    database_url: str, root: Path, log: Path, *, plain: bool, **settings: Any
) -> Iterator[tuple[str, int]]:
    port = free_port()
    env = {
        **os.environ,
        "GLUEJOBS_DATABASE_URL": database_url,
        "GLUEJOBS_ARTIFACTS_DIR": str(root),
        "GLUEJOBS_DATA_DIR": str(root),
        "GLUEJOBS_MODELS_DIR": str(root),
        "GLUEJOBS_CACHE_DIR": str(root),
        "PYTHONPATH": str(REPO),
        **{f"GLUEJOBS_{k.upper()}": str(v) for k, v in settings.items()},
    }
    if plain:
        command = [
            sys.executable,
            "-m",
            "uvicorn",
            "service.main:create_app",
            "--factory",
            "--port",
            str(port),
        ]
    else:
        command = [sys.executable, "-m", "service", "--port", str(port)]
    with log.open("wb") as out:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the API did not start")
            time.sleep(0.2)
        yield base, process.pid
    finally:
        process.terminate()
        process.wait(30)


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


# --- slow clients -------------------------------------------------------------------------------------


def slow_clients(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="gluejobs-abuse-"))
    url = f"sqlite:///{root / 'gluejobs.db'}"
    upgrade(Database(url))
    log = root / "api.log"
    settings = {"max_connections": args.max_connections, "client_log_interval_s": 5}
    with api(url, root, log, plain=args.plain_uvicorn, **settings) as (base, pid):
        where = ("127.0.0.1", int(base.rsplit(":", 1)[1]))
        before = descriptors(pid)
        head = b"GET /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 4000
        slow: list[list[Any]] = []  # [socket, bytes sent]
        reopened = 0
        for _ in range(args.slow):
            sock = socket.create_connection(where)
            sock.setblocking(False)
            slow.append([sock, 0])
        latencies, peak = [], before
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            started = time.monotonic()
            for entry in slow:
                try:
                    if entry[0].recv(1, socket.MSG_PEEK) == b"":
                        raise ConnectionResetError
                except BlockingIOError:
                    pass
                except OSError:
                    entry[0].close()
                    entry[0], entry[1] = socket.create_connection(where), 0
                    entry[0].setblocking(False)
                    reopened += 1
                    continue
                try:
                    entry[0].send(head[entry[1] % len(head) : entry[1] % len(head) + 1])
                    entry[1] += 1
                except OSError:
                    pass
            for _ in range(10):
                with socket.create_connection(where) as garbage:
                    garbage.sendall(b"NOT HTTP\r\n\r\n")
            with httpx.Client(base_url=base, timeout=30) as normal:
                asked = time.monotonic()
                status = normal.get("/v1/jobs").status_code
                latencies.append((time.monotonic() - asked, status))
            peak = max(peak, descriptors(pid))
            time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
        for entry in slow:
            entry[0].close()
    lines = log.read_text(errors="replace").splitlines()
    seconds = [t for t, _ in latencies]
    return {
        "scenario": "slow-clients",
        "server": "uvicorn defaults" if args.plain_uvicorn else "gluejobs serve",
        "slow_connections": args.slow,
        "max_connections": args.max_connections,
        "seconds": args.seconds,
        "normal_client_ms_median": round(1000 * statistics.median(seconds)),
        "normal_client_ms_max": round(1000 * max(seconds)),
        "normal_client_statuses": dict(Counter(s for _, s in latencies)),
        "descriptors_before": before,
        "descriptors_peak": peak,
        "slow_connections_closed_by_api": reopened,
        "log_lines": len(lines),
        "log_lines_about_clients": sum(
            "slow or broken clients" in line or "Invalid HTTP" in line for line in lines
        ),
    }


# --- a database outage --------------------------------------------------------------------------------


@contextmanager
def database(admin_url: str | None, root: Path) -> Iterator[str]:
    if admin_url is None:
        url = f"sqlite:///{root / 'gluejobs.db'}"
        upgrade(Database(url))
        yield url
        return
    with scratch_postgres(admin_url, f"gluejobs_abuse_{os.getpid()}") as url:
        db = Database(url)
        upgrade(db)
        db.dispose()
        yield url


def database_outage(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="gluejobs-outage-"))
    log = root / "api.log"
    with database(args.postgres, root) as url:
        api_url = url if args.postgres else f"{url}?timeout=1"
        db = Database(url)
        with api(api_url, root, log, plain=False) as (base, _):
            job = httpx.post(f"{base}/v1/jobs", json={"spec": SPEC}).json()["id"]
            streamed: list[str] = []

            def follow() -> None:
                try:
                    _follow()
                except Exception as exc:  # a benchmark reports, it does not hide
                    streamed.append(f"failed: {exc!r}")

            def _follow() -> None:
                with (
                    httpx.Client(base_url=base, timeout=120) as reader,
                    reader.stream("GET", f"/v1/jobs/{job}/stream") as response,
                ):
                    response.raise_for_status()
                    for line in response.iter_lines():
                        if line.startswith("data:") and '"message"' in line:
                            streamed.append(json.loads(line[5:])["message"])
                        if line.startswith("event: end"):
                            return

            def add(first: int) -> None:
                with db.session() as session:
                    for n in range(first, first + 5):
                        jobs_repo.add_event(session, job_id=job, message=f"row {n}")

            reader = threading.Thread(target=follow)
            reader.start()
            add(1)
            deadline = time.monotonic() + 30
            while len(streamed) < 5 and time.monotonic() < deadline:  # the stream is open and live
                time.sleep(0.05)
            answers: list[int] = []
            failed: list[str] = []
            mix = [
                ("GET", "/v1/jobs", None),
                ("GET", f"/v1/jobs/{job}", None),
                ("GET", f"/v1/jobs/{job}/metrics", None),
                ("POST", "/v1/jobs", {"spec": SPEC}),
                ("GET", "/healthz", None),
                ("GET", "/readyz", None),
                ("GET", "/metrics", None),
                (
                    "POST",
                    "/v1/sweeps",
                    {"spec": {k: v for k, v in SPEC.items() if k != "seed"}, "seeds": [1]},
                ),
            ]

            def hammer() -> None:
                with httpx.Client(base_url=base, timeout=60) as own:
                    for i in range(50):
                        method, path, body = mix[i % len(mix)]
                        try:
                            response = own.request(method, path, json=body)
                            answers.append(response.status_code)
                            if response.status_code == 503 and "retry-after" not in response.headers:
                                failed.append("503 without Retry-After")
                        except httpx.TransportError as exc:
                            failed.append(type(exc).__name__)
                        time.sleep(0.1)

            with outage(url, args.postgres):
                threads = [threading.Thread(target=hammer) for _ in range(4)]
                for thread in threads:
                    thread.start()
                time.sleep(5)
            for thread in threads:
                thread.join(120)
            add(6)
            httpx.post(f"{base}/v1/jobs/{job}/cancel")
            reader.join(60)
            time.sleep(6)  # the end of the outage is logged after a quiet spell
            httpx.get(f"{base}/readyz")
        db.dispose()
    lines = log.read_text(errors="replace").splitlines()
    expected = [f"row {n}" for n in range(1, 11)]
    return {
        "scenario": "outage",
        "database": "postgresql" if args.postgres else "sqlite",
        "requests": len(answers) + len(failed),
        "statuses": dict(sorted(Counter(answers).items())),
        "connection_failures": len(failed),
        "stream_rows_lost": len(set(expected) - set(streamed)),
        "stream_rows_repeated": len(streamed) - len(set(streamed)),
        "stream_errors": [row for row in streamed if row.startswith("failed")],
        "log_lines_outage": [
            line.split(": ", 1)[-1][:120]
            for line in lines
            if "database unreachable" in line or "reachable again" in line
        ],
        "tracebacks_logged": sum("Traceback" in line for line in lines),
    }


def dedup_timing(args: argparse.Namespace) -> dict[str, Any]:
    from tests.support.s3_endpoint import S3Endpoint

    owners = [f"owner{n}=owner-{n}-key-0123456789abcdef" for n in range(args.trials + 1)]

    def upload(base: str, entry: str, path: Path) -> tuple[int, float]:
        started = time.perf_counter()
        with path.open("rb") as content:
            answer = httpx.post(
                f"{base}/v1/files",
                files={"file": ("train.csv", content)},
                headers={"Authorization": f"Bearer {entry.split('=', 1)[1]}"},
                timeout=300,
            )
        return answer.status_code, time.perf_counter() - started

    def write(path: Path, tag: str) -> Path:
        line = b"a sentence of a size that makes a file quickly,1\n"
        with path.open("wb") as out:
            out.write(b"sentence,label\n" + f"{tag},0\n".encode())
            out.write(line * int(args.file_mb * 1e6 / len(line)))
        return path

    with tempfile.TemporaryDirectory(prefix="gluejobs-dedup-") as folder:
        root = Path(folder)
        endpoint = S3Endpoint(root / "moto.log")
        os.environ.update(endpoint.environment())
        try:
            settings = {
                "storage_url": "s3://bench/store",
                "api_keys": ",".join(owners),
                "max_upload_bytes": int(args.file_mb * 2e6),
                "rate_submits_per_minute": 0,
            }
            with api(f"sqlite:///{root / 'db.sqlite'}", root, root / "api.log", plain=False, **settings) as (
                base,
                _pid,
            ):
                shared_file = write(root / "shared.csv", "shared")
                first = upload(base, owners[0], shared_file)
                assert first[0] == 201, first
                known: list[float] = []
                new: list[float] = []
                statuses: Counter[str] = Counter()
                for trial, owner in enumerate(owners[1:]):
                    status, seconds = upload(base, owner, shared_file)  # bytes owner0 has
                    statuses[f"known {status}"] += 1
                    known.append(seconds)
                    status, seconds = upload(base, owner, write(root / f"new-{trial}.csv", f"new {trial}"))
                    statuses[f"new {status}"] += 1
                    new.append(seconds)
        finally:
            endpoint.close()
    return {
        "scenario": "dedup",
        "store": "s3 (moto)",
        "file_mb": args.file_mb,
        "statuses": dict(statuses),
        "someone_elses_bytes_s": [round(s, 2) for s in known],
        "new_bytes_s": [round(s, 2) for s in new],
        "median_ratio_known_to_new": round(statistics.median(known) / statistics.median(new), 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("scenario", choices=["slow-clients", "outage", "dedup"])
    parser.add_argument("--slow", type=int, default=600, help="slow connections")
    parser.add_argument("--max-connections", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--plain-uvicorn", action="store_true", help="the app under uvicorn's defaults")
    parser.add_argument(
        "--postgres", default=None, help="an admin URL: the outage on a fresh Postgres database"
    )
    parser.add_argument("--file-mb", type=float, default=40.0, help="dedup: the uploaded file's size")
    parser.add_argument("--trials", type=int, default=3, help="dedup: uploads of each kind")
    args = parser.parse_args()
    scenarios = {"slow-clients": slow_clients, "outage": database_outage, "dedup": dedup_timing}
    figures = scenarios[args.scenario](args)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
