"""Issue 37 end to end: jobs of several machines (gangs) run by real worker processes (`python -m
worker`) that share no folder: each "machine" has its own artifacts, data and cache folders and
advertises its own loopback address (127.0.0.2, 127.0.0.3, …); the store is S3 (moto's server), the
database the real one. Over gloo on the CPU, a tiny BERT, real GLUE rows.

- Two machines of one process each train to the same loss rows (within float tolerance) as one machine
  with two processes, at the same global batch and seed.
- One job, two failures, one fleet: the rank-1 worker SIGKILLed mid-run (rank 0 ends the attempt, "a
  machine of the gang was lost", naming it), then on the next gang a member paused (SIGSTOP, its worker
  and its processes) until its seat is gone. Each time the job resumes from its declared checkpoint on a
  new gang whose members fetch the job's uploaded files and the checkpoint from the store; every metric
  row is there once, and it succeeds. Fencing: the paused member, woken, writes nothing (no rows, no
  checkpoint, nothing in the store) and its processes exit.
"""

from __future__ import annotations

import csv
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from subprocess import Popen
from typing import Any

import httpx
import pytest

from shared.core.config import Settings
from shared.core.storage import open_store
from tests.support.e2e import all_metrics, api_process, get, running, start_worker, steps_of, submit, wait_for
from tests.support.kit import GLUE_DATA, TINY_MODEL

pytestmark = pytest.mark.e2e

LEASE_S = 8.0
# Common to every job here: a global batch of 16 (8 a process, two processes), logged at every step.
BASE = {
    "model_name_or_path": TINY_MODEL,
    "per_device_train_batch_size": 8,
    "per_device_eval_batch_size": 16,
    "learning_rate": 1e-3,
    "logging_steps": 1,
    "seed": 13,
}


class Fleet:
    """The API and the worker "machines" of one test, each machine with folders of its own."""

    def __init__(self, settings_factory: Any, tmp_path: Path, database_url: str, s3_url: str) -> None:
        self._factory, self._tmp = settings_factory, tmp_path
        self._common = {
            "database_url": database_url,
            "storage_url": s3_url,
            "lease_s": LEASE_S,
            "heartbeat_s": 0.5,
            "poll_interval_s": 0.3,
            "retry_backoff_s": 0.0,
            "cancel_grace_s": 3.0,
            "warm_start": False,  # every gang job starts fresh interpreters through accelerate launch
            "gang_fill_s": 60.0,
        }
        self.api = self.machine("api")
        self.workers: dict[str, Popen[bytes]] = {}

    def machine(self, name: str, **overrides: Any) -> Settings:
        root = self._tmp / name
        common = dict(self._common)
        settings: Settings = self._factory(
            common.pop("database_url"),
            artifacts_dir=root / "artifacts",
            data_dir=root / "data",
            cache_dir=root / "cache",
            **{**common, **overrides},
        )
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        return settings

    def start(self, name: str, address: str, *args: str) -> Popen[bytes]:
        settings = self.machine(name, gang_address=address)
        worker = start_worker(settings, *args, log=self._tmp / f"{name}.log")
        self.workers[name] = worker
        return worker

    def stop_all(self) -> None:
        for worker in self.workers.values():
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGCONT)
                os.killpg(worker.pid, signal.SIGTERM)
        for worker in self.workers.values():
            try:
                worker.wait(60)
            except Exception:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()

    def logs(self) -> str:
        return "\n".join(
            f"--- {name}\n{(self._tmp / f'{name}.log').read_text(errors='replace')[-3000:]}"
            for name in self.workers
        )


@pytest.fixture
def fleet(settings_factory: Any, tmp_path: Path, postgres_url: str, s3_url: str) -> Iterator[Fleet]:
    result = Fleet(settings_factory, tmp_path, postgres_url, s3_url)
    try:
        yield result
    finally:
        result.stop_all()


@contextmanager
def api(fleet: Fleet) -> Iterator[httpx.Client]:
    with api_process(fleet.api, log=fleet._tmp / "api.log") as (client, _):
        yield client


def _ended(client: httpx.Client, job_id: int, fleet: Fleet, timeout_s: float = 300) -> dict[str, Any]:
    try:
        job: dict[str, Any] = wait_for(
            lambda: (
                (j := get(client, f"/v1/jobs/{job_id}"))["status"] in ("succeeded", "failed", "cancelled")
                and j
            ),
            timeout_s=timeout_s,
        )
    except AssertionError:
        raise AssertionError(f"job {job_id} did not end:\n{fleet.logs()}") from None
    return job


def _events(client: httpx.Client, job_id: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = get(client, f"/v1/jobs/{job_id}/events", limit=500)["data"]
    return events


def _member(client: httpx.Client, job_id: int, rank: int, attempt: int) -> str:
    """The worker that joined the job's gang of `attempt` as machine `rank` (from its event)."""
    for event in _events(client, job_id):
        if (
            event["message"].startswith(f"attempt {attempt}: worker ")
            and f"as machine rank {rank} " in event["message"]
        ):
            return str(event["data"]["gang"]["worker_id"])
    raise AssertionError(f"no machine rank {rank} joined attempt {attempt} of job {job_id}")


def _worker_name(worker_id: str, fleet: Fleet) -> str:
    """Which of the fleet's workers has the id (its pid is in it: host-pid-hex)."""
    pid = int(worker_id.rsplit("-", 2)[1])
    return next(name for name, worker in fleet.workers.items() if worker.pid == pid)


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (a worker's job launchers and their ranks live in sessions of their own)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def _csv(path: Path, count: int, skip: int = 0) -> Path:
    lines = (GLUE_DATA / "SST-2" / "train.tsv").read_text().splitlines()[1 + skip : 1 + skip + count]
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["sentence", "label"])
        writer.writerows(line.split("\t") for line in lines)
    return path


def _upload(client: httpx.Client, path: Path, purpose: str) -> str:
    with path.open("rb") as handle:
        response = client.post("/v1/files", files={"file": (path.name, handle)}, data={"purpose": purpose})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _long_spec(client: httpx.Client, tmp_path: Path) -> dict[str, Any]:
    """A job on two machines long enough to be interrupted: uploaded files (each member fetches them
    from the store), a checkpoint every 8 steps, 96 steps."""
    train = _upload(client, _csv(tmp_path / "train.csv", 192), "train")
    dev = _upload(client, _csv(tmp_path / "dev.csv", 32, skip=192), "validation")
    return {
        **BASE,
        "train_file": train,
        "validation_file": dev,
        "num_machines": 2,
        "num_train_epochs": 8,
        "eval_strategy": "no",
        "save_strategy": "steps",
        "save_steps": 8,
        "save_total_limit": 2,
    }


def test_two_machines_train_as_one_machine_with_two_processes(fleet: Fleet) -> None:
    spec = {
        **BASE,
        "task_name": "sst2",
        "max_train_samples": 64,
        "max_eval_samples": 32,
        "num_train_epochs": 2,
    }
    with api(fleet) as client:
        gang = submit(client, {**spec, "num_machines": 2})
        assert gang["spec"]["num_machines"] == 2
        fleet.start("m1", "127.0.0.2")
        fleet.start("m2", "127.0.0.3")
        done = _ended(client, gang["id"], fleet)
        assert done["status"] == "succeeded", (done["error"], fleet.logs())
        assert done["attempts"] == 1
        messages = [e["message"] for e in _events(client, gang["id"])]
        assert any("opened a gang of 2 machines" in m for m in messages), messages
        assert sum("as machine rank 1 of 2" in m for m in messages) == 1, messages
        fleet.stop_all()

        single = submit(client, {**spec, "num_processes": 2})
        fleet.start("one", "127.0.0.4", "--slots", "2")
        done = _ended(client, single["id"], fleet)
        assert done["status"] == "succeeded", (done["error"], fleet.logs())

        rows = {job: all_metrics(client, job) for job in (gang["id"], single["id"])}
    # The train loss at every step and the eval loss at each epoch's end, from both jobs alike.
    losses = {
        job: [(r["split"], r["step"], r["value"]) for r in rows[job] if r["name"] == "loss"] for job in rows
    }
    gang_losses, single_losses = losses[gang["id"]], losses[single["id"]]
    assert steps_of(rows[gang["id"]], "train", "loss") == list(range(1, 9))  # 64 rows / 16 a step, 2 epochs
    assert [(split, step) for split, step, _ in gang_losses] == [
        (split, step) for split, step, _ in single_losses
    ]
    assert [value for *_, value in gang_losses] == pytest.approx(
        [value for *_, value in single_losses], rel=1e-4
    )
    accuracy = {job: [r["value"] for r in rows[job] if r["name"] == "accuracy"] for job in rows}
    assert accuracy[gang["id"]] == pytest.approx(accuracy[single["id"]])


def _checkpoint_past(client: httpx.Client, job_id: int, step: int) -> None:
    """Wait for a checkpoint of the job saved after `step`."""
    wait_for(
        lambda: any(c["step"] > step for c in get(client, f"/v1/jobs/{job_id}/checkpoints")["data"]),
        timeout_s=240,
        interval_s=0.1,
    )


def _resumed_steps(client: httpx.Client, job_id: int) -> list[int]:
    return [
        int(e["data"]["step"])
        for e in _events(client, job_id)
        if e["message"].startswith("resumed from checkpoint-")
    ]


def test_a_lost_member_then_a_paused_one_end_their_attempts_and_the_job_resumes_on_new_gangs(
    fleet: Fleet, tmp_path: Path
) -> None:
    """One job, two machine failures (one fleet for both: its start is most of the cost). Attempt 1 loses
    its rank-1 machine to SIGKILL (its worker and its job processes); attempt 2, on a new gang, has its
    rank-1 machine paused (SIGSTOP) until its seat is gone; attempt 3 succeeds. Each attempt resumes
    from the last declared checkpoint, and the paused machine, woken, writes nothing."""
    with api(fleet) as client:
        job = submit(client, _long_spec(client, tmp_path))
        fleet.start("m1", "127.0.0.2")
        fleet.start("m2", "127.0.0.3")
        _checkpoint_past(client, job["id"], 0)
        # Attempt 1: the rank-1 machine dies, its worker and its job processes.
        lost = _member(client, job["id"], rank=1, attempt=1)
        victim = fleet.workers[_worker_name(lost, fleet)]
        for pid in [victim.pid, *_descendants(victim.pid)]:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        victim.wait()
        # A third machine comes: attempt 2 is a new gang (the survivor and it).
        fleet.start("m3", "127.0.0.4")
        wait_for(lambda: _resumed_steps(client, job["id"]), timeout_s=240)
        [first_resume] = _resumed_steps(client, job["id"])
        assert first_resume > 0
        _checkpoint_past(client, job["id"], first_resume)

        # Attempt 2: its rank-1 machine is paused, worker and processes, until its seat is gone.
        paused_id = _member(client, job["id"], rank=1, attempt=2)
        paused = fleet.workers[_worker_name(paused_id, fleet)]
        processes = _descendants(paused.pid)
        assert processes, "the member runs its processes"
        for pid in [paused.pid, *processes]:
            os.kill(pid, signal.SIGSTOP)
        try:
            # Rank 0 ends the attempt once the member is silent for a lease; a fourth machine makes
            # the next gang, and the job succeeds without the paused one.
            fleet.start("m4", "127.0.0.5")
            done = _ended(client, job["id"], fleet)
        finally:
            snapshot_rows = all_metrics(client, job["id"])
            snapshot_checkpoints = get(client, f"/v1/jobs/{job['id']}/checkpoints")["data"]
            store = open_store(fleet.api)
            snapshot_store = [(f.path, f.size, f.modified) for f in store.list(f"jobs/{job['id']}")]
            for pid in [paused.pid, *processes]:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        assert done["status"] == "succeeded", (done["error"], fleet.logs())
        assert done["attempts"] == 3
        events = _events(client, job["id"])
        failed = [e["message"] for e in events if "a machine of the gang was lost" in e["message"]]
        assert len(failed) == 2, failed
        assert f"worker {lost} (machine rank 1)" in failed[0], failed
        assert f"worker {paused_id} (machine rank 1)" in failed[1], failed
        resumed = _resumed_steps(client, job["id"])
        assert len(resumed) == 2 and first_resume < resumed[1], resumed
        # Every step's row once: the steps a lost attempt logged past its checkpoint were logged again.
        assert steps_of(snapshot_rows, "train", "loss") == list(range(1, 97))

        # Awake: its watch finds the seat gone and its processes go, having written nothing.
        wait_for(lambda: not any(running(pid) for pid in processes), timeout_s=60)
        assert paused.poll() is None  # the worker itself serves on
        assert all_metrics(client, job["id"]) == snapshot_rows
        assert get(client, f"/v1/jobs/{job['id']}/checkpoints")["data"] == snapshot_checkpoints
        assert [(f.path, f.size, f.modified) for f in store.list(f"jobs/{job['id']}")] == snapshot_store
