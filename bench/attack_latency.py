"""What one hostile body costs everyone else (issue 32, item 1): /healthz's latency, asked by a second
client every 50 ms, while one client sends an attack back to back, against `python -m service` in a
process of its own (SQLite, or a scratch Postgres database with --postgres ADMIN_URL). Prints one
JSON line per attack (the attack's own answers and times; /healthz's median, p99 and worst) and then
the worst /healthz latency over every attack.

The attacks: the security report's spec of 70,000 unknown keys on POST /v1/jobs and of 20,000 on
/v1/sweeps and /v1/searches; the costliest specs that pass the edge's shape limits (500 names: every
problem found, the salvage's checks run); a wide list, many small containers (the JSON parser's
worst shape), a deep body. The submit rate limit is off (an attacker holds many keys).

    python bench/attack_latency.py [--seconds 5] [--only jobs-70k,wide-list] [--postgres ADMIN_URL]
    python bench/attack_latency.py --api-repo /tmp/before   # the API from another checkout (a baseline)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.harness import scratch_postgres  # noqa: E402
from gluejobs_server.stack import API_COMMAND, local_stack  # noqa: E402
from tests.support.kit import ALICE, auth, stack_settings  # noqa: E402

SPEC = {"model_name_or_path": "tiny-bert", "task_name": "sst2"}
SPACE = {"learning_rate": {"type": "float", "low": 1e-5, "high": 1e-3, "log": True}}
PROBE_EVERY_S = 0.05
# A probe slower than this is the failure the report saw (its client gave up at 30 s).
PROBE_TIMEOUT_S = 60.0


def unknown(count: int) -> dict[str, Any]:
    return {**SPEC, **{f"k{i}": i for i in range(count)}}


def attacks() -> dict[str, tuple[str, dict[str, Any] | str]]:
    """Each attack's path and body (a dict sent as compact JSON, or the raw text)."""
    return {
        "jobs-70k": ("/v1/jobs", {"spec": unknown(70_000)}),
        "sweeps-20k": ("/v1/sweeps", {"spec": unknown(20_000), "seeds": [1, 2]}),
        "searches-20k": ("/v1/searches", {"spec": unknown(20_000), "space": SPACE}),
        "jobs-500": ("/v1/jobs", {"spec": unknown(498)}),
        "sweeps-500": ("/v1/sweeps", {"spec": unknown(498), "seeds": [1, 2]}),
        "searches-500": ("/v1/searches", {"spec": unknown(498), "space": SPACE}),
        "wide-list": ("/v1/sweeps", {"spec": SPEC, "seeds": [0] * 450_000}),
        "wide-containers": ("/v1/sweeps", {"spec": SPEC, "grid": {"learning_rate": [[]] * 330_000}}),
        "deep": ("/v1/jobs", '{"spec":' + "[" * 900 + "]" * 900 + "}"),
        "deeper-than-the-parser": ("/v1/jobs", '{"spec":' + "[" * 500_000 + "]" * 500_000 + "}"),
    }


def encoded(body: dict[str, Any] | str) -> bytes:
    text = body if isinstance(body, str) else json.dumps(body, separators=(",", ":"))
    return text.encode()


@contextmanager
def api(admin_url: str | None, api_repo: Path | None) -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="attack-latency-") as folder, _database(admin_url) as url:
        root = Path(folder)
        settings = stack_settings(root, database_url=url or None, api_keys=[ALICE], rate_submits_per_minute=0)
        (root / "data").mkdir(exist_ok=True)
        command = API_COMMAND
        if api_repo is not None:  # its `service` package first on the path, before this checkout's
            start = (
                f"import sys, runpy; sys.path.insert(0, {str(api_repo)!r}); "
                "runpy.run_module('service', run_name='__main__')"
            )
            command = (sys.executable, "-c", start)
        with local_stack(settings, logs=root / "logs", workers=0, api_command=command) as stack:
            yield stack.url


@contextmanager
def _database(admin_url: str | None) -> Iterator[str]:
    if admin_url is None:
        yield ""
        return
    with scratch_postgres(admin_url, f"attack_latency_{uuid.uuid4().hex[:8]}") as url:
        yield url


def probe(url: str, stop: threading.Event, latencies: list[float], failures: list[str]) -> None:
    """/healthz every PROBE_EVERY_S on a connection of its own, each latency in seconds."""
    with httpx.Client(base_url=url, timeout=PROBE_TIMEOUT_S) as client:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                response = client.get("/healthz")
                if response.status_code != 200:
                    failures.append(f"status {response.status_code}")
            except httpx.HTTPError as exc:
                failures.append(type(exc).__name__)
            latencies.append(time.perf_counter() - started)
            stop.wait(PROBE_EVERY_S)


def run_attack(url: str, name: str, path: str, body: bytes, seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    failures: list[str] = []
    stop = threading.Event()
    prober = threading.Thread(target=probe, args=(url, stop, latencies, failures), daemon=True)
    times: list[float] = []
    statuses: dict[int, int] = {}
    headers = {**auth(ALICE), "Content-Type": "application/json"}
    with httpx.Client(base_url=url, timeout=PROBE_TIMEOUT_S) as attacker:
        attacker.post(path, content=body, headers=headers)  # warm: first-use imports are not the attack's
        prober.start()
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            response = attacker.post(path, content=body, headers=headers)
            times.append(time.perf_counter() - started)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
    stop.set()
    prober.join(PROBE_TIMEOUT_S)
    return {
        "attack": name,
        "path": path,
        "body_bytes": len(body),
        "requests": len(times),
        "statuses": statuses,
        "attack_median_s": round(statistics.median(times), 4),
        "attack_max_s": round(max(times), 4),
        "healthz_probes": len(latencies),
        "healthz_median_ms": round(1000 * statistics.median(latencies), 1),
        "healthz_p99_ms": round(1000 * sorted(latencies)[int(0.99 * (len(latencies) - 1))], 1),
        "healthz_max_ms": round(1000 * max(latencies), 1),
        "healthz_failures": failures[:5],
    }


def cpu_model() -> str:
    try:
        found = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown"
    names = [line.split(":", 1)[1].strip() for line in found.splitlines() if line.startswith("Model name")]
    return names[0] if names else "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="how long each attack runs")
    parser.add_argument("--only", default="", help="comma-separated attack names (default: all)")
    parser.add_argument("--postgres", metavar="ADMIN_URL", help="a scratch database on this server")
    parser.add_argument("--api-repo", type=Path, help="run the API's code from this checkout")
    args = parser.parse_args()
    chosen = attacks()
    if args.only:
        names = args.only.split(",")
        unknown_names = [name for name in names if name not in chosen]
        if unknown_names:
            parser.error(f"no attack named {', '.join(unknown_names)}; the attacks: {', '.join(chosen)}")
        chosen = {name: chosen[name] for name in names}
    worst = 0.0
    with api(args.postgres, args.api_repo) as url:
        for name, (path, body) in chosen.items():
            result = run_attack(url, name, path, encoded(body), args.seconds)
            worst = max(worst, result["healthz_max_ms"])
            print(json.dumps(result), flush=True)
    database = "postgres" if args.postgres else "sqlite"
    print(json.dumps({"worst_healthz_ms": worst, "database": database, "cpu": cpu_model()}), flush=True)


if __name__ == "__main__":
    main()
