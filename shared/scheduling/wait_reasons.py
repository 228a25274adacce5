"""Why a queued job waits: `waiting_for` on every job the API shows.

None unless the job is queued and held back; else a reason and a sentence:
- retry_backoff: a retried job is not claimed before its not_before;
- quota: its owner holds max_devices (with this job, more), or used max_device_hours_per_day;
- storage: its owner holds its max_storage_bytes in the store (or more): it starts once the owner
  is under it again (checkpoints, files or models removed, or the quota raised);
- reservation: it has reserved a worker and waits for that worker's devices to free up, or it
  would fit only on a worker that another job has reserved;
- devices: it needs more devices than any worker has (or has free), or no worker is running; a job
  on N machines (a gang) needs N workers with its devices each, free at once ("waiting for 2 free
  workers with 4 devices each (1 free now)"), and says so when fewer than N live workers have them;
- build: its spec uses a field that no running worker's build supports (each would hand it back
  untouched: shared/jobspec/capability.py), so it waits for a worker of a build that does.
A job merely behind others in the queue waits for nothing in particular: None.

Computed for a whole page at once, in a fixed number of queries (owners' holdings and rows, workers
and what they run, reservations), never per job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from shared.core.db import read
from shared.core.tables import (
    ACTIVE_STATUSES,
    LIVE_WORKER_STATES,
    Job,
    JobStatus,
    Worker,
    WorkerBuild,
    utcnow,
)
from shared.jobspec.capability import is_off
from shared.scheduling.fair_share import ClaimPolicy
from shared.scheduling.machines import machines_of, seats_by_worker
from shared.scheduling.quotas import (
    device_hours_24h,
    devices_held,
    effective_quota,
    owner_rows,
    quota_hold,
    storage_full,
    storage_limited,
)
from shared.scheduling.storage_usage import storage_by_owner


@dataclass(frozen=True)
class Fleet:
    """What the page's queued jobs wait on: live workers' total and free devices, reservations,
    owners' holdings, rows and device-hours."""

    total: dict[str, int]
    free: dict[str, int]
    reserved: dict[str, int]  # worker id → the job that reserved it
    held: dict[str, int]
    hours: dict[str, float]
    owners: dict[str, Any]
    # The spec fields each live worker's build supports; None when a worker's build is not on record
    # (a build from before builds were recorded: what it supports cannot be told).
    builds: list[frozenset[str]] | None = None
    # Owners' bytes in the store and own storage limits; only read when a storage quota applies.
    stored: dict[str, int] | None = None
    storage_limits: dict[str, int] | None = None


def waiting_for(
    session: Session, jobs: Sequence[Job], policy: ClaimPolicy, *, now: datetime | None = None
) -> dict[int, dict[str, str]]:
    """job id → {"reason", "message"} for the queued jobs of `jobs` that are held back."""
    queued = [job for job in jobs if job.status == JobStatus.queued]
    if not queued:
        return {}
    now = now or utcnow()
    fleet = _fleet(session, {job.owner for job in queued if job.owner}, policy, now)
    reasons = {}
    for job in queued:
        reason = _reason(job, fleet, policy, now)
        if reason is not None:
            reasons[job.id] = {"reason": reason[0], "message": reason[1]}
    return reasons


def _fleet(session: Session, owners: set[str], policy: ClaimPolicy, now: datetime) -> Fleet:
    alive = now - timedelta(seconds=policy.lease_s)
    with read(session):
        workers = session.execute(
            select(Worker.id, Worker.devices, Worker.version).where(
                Worker.state.in_(LIVE_WORKER_STATES),
                Worker.stopped_at.is_(None),
                Worker.last_heartbeat_at >= alive,
            )
        ).all()
        ids = [worker_id for worker_id, _, _ in workers]
        builds = _builds(session, [version for _, _, version in workers])
        busy = dict(
            session.execute(
                select(Job.worker_id, func.sum(Job.num_processes))
                .where(Job.status.in_(ACTIVE_STATUSES), Job.worker_id.in_(ids))
                .group_by(Job.worker_id)
            ).all()
        )
        reserved = dict(
            session.execute(
                select(Job.reserved_by, Job.id).where(
                    Job.status == JobStatus.queued, Job.reserved_by.in_(ids)
                )
            ).all()
        )
        # A gang member other than rank 0 holds the job's devices on its own worker (the job's row
        # names rank 0's worker): its seat is busy too.
        for worker_id, devices in seats_by_worker(session, ids).items():
            busy[worker_id] = int(busy.get(worker_id) or 0) + devices
        rows = owner_rows(session, owners)
        limited = policy.quotas.max_device_hours_per_day is not None or any(
            row.max_device_hours_per_day is not None for row in rows.values()
        )
        fleet = Fleet(
            total={worker_id: len(devices or []) for worker_id, devices, _ in workers},
            free={
                worker_id: len(devices or []) - int(busy.get(worker_id) or 0)
                for worker_id, devices, _ in workers
            },
            reserved={str(worker): int(job) for worker, job in reserved.items()},
            held=devices_held(session, owners),
            hours=device_hours_24h(session, owners, now=now) if limited else {},
            owners=rows,
            builds=builds,
        )
        limits = storage_limited(session, policy.quotas, owners) if owners else None
        if limits is not None:
            usage = storage_by_owner(session, owners)
            stored = {owner: used.total for owner, used in usage.items()}
            fleet = replace(fleet, stored=stored, storage_limits=limits)
    return fleet


def _builds(session: Session, versions: list[str | None]) -> list[frozenset[str]] | None:
    """The spec fields of each build the live workers run ("0.2.0+<build>"), or None when one is not
    on record."""
    if not all(version and "+" in version for version in versions):
        return None
    hashes = {str(version).partition("+")[2] for version in versions}
    known = dict(
        session.execute(
            select(WorkerBuild.build, WorkerBuild.spec_fields).where(WorkerBuild.build.in_(hashes))
        ).all()
    )
    if set(known) != hashes:
        return None
    return [frozenset(fields or []) for fields in known.values()]


def _reason(job: Job, fleet: Fleet, policy: ClaimPolicy, now: datetime) -> tuple[str, str] | None:
    if job.not_before is not None and job.not_before > now:
        when = job.not_before.strftime("%H:%M:%S")
        return "retry_backoff", f"retries at {when} UTC (backoff after attempt {job.attempts})"
    quota = _quota_reason(job, fleet, policy)
    if quota is not None:
        return quota
    need = job.num_processes
    mine = next((worker for worker, job_id in fleet.reserved.items() if job_id == job.id), None)
    if mine is not None:
        return "reservation", f"reserved worker {mine}; starts there once {need} of its devices are free"
    if not fleet.total:
        return "devices", f"needs {_devices(need)}; no worker is running"
    unsupported = _unsupported(job, fleet)
    if unsupported:
        return (
            "build",
            f"uses {', '.join(unsupported)}, which no running worker's build supports: it waits for a "
            "worker of a build that does (upgrade the workers)",
        )
    if max(fleet.total.values()) < need:
        return "devices", f"needs {_devices(need)}; no worker has that many"
    machines = machines_of(job.spec)
    if machines > 1:
        return _gang_reason(need, machines, fleet)
    open_free = [free for worker, free in fleet.free.items() if worker not in fleet.reserved]
    if max(open_free, default=0) >= need:
        return None
    held_back = [w for w, free in fleet.free.items() if w in fleet.reserved and free >= need]
    if held_back:
        return (
            "reservation",
            f"waits for worker {held_back[0]} reserved by job {fleet.reserved[held_back[0]]}",
        )
    if need > 1:
        return "devices", f"needs {_devices(need)}; no worker has that many free"
    return None


def _gang_reason(need: int, machines: int, fleet: Fleet) -> tuple[str, str] | None:
    """A job on `machines` workers of `need` devices each starts when that many are free at once (its
    first machine claims it and the others join: shared/jobs_repo/gangs.py); until then, what it
    waits for. Workers another job reserved do not count as free for it."""
    each = f"{_devices(need)} each"
    able = sum(1 for total in fleet.total.values() if total >= need)
    if able < machines:
        return "devices", f"needs {machines} workers with {each}; only {able} running have that many"
    free = sum(1 for worker, room in fleet.free.items() if room >= need and worker not in fleet.reserved)
    if free >= machines:
        return None
    return "devices", f"waiting for {machines} free workers with {each} ({free} free now)"


def _unsupported(job: Job, fleet: Fleet) -> list[str]:
    """The fields the job uses that the live builds lack (those of the build that lacks fewest), or
    nothing when some build supports them all or the builds are not all on record."""
    if not fleet.builds:
        return []
    used = {name for name, value in (job.spec or {}).items() if not is_off(value)}
    lacking: list[set[str]] = [set(used - fields) for fields in fleet.builds]
    if any(not missing for missing in lacking):
        return []
    fewest: set[str] = min(lacking, key=len)
    return sorted(fewest)


def _quota_reason(job: Job, fleet: Fleet, policy: ClaimPolicy) -> tuple[str, str] | None:
    """The claim's own quota rule (shared/scheduling/quotas.py), told in words: ("storage", …) when the
    owner's store is full, else ("quota", …)."""
    if job.owner is None:
        return None
    quota = effective_quota(
        fleet.owners.get(job.owner), policy.quotas, own_storage=(fleet.storage_limits or {}).get(job.owner)
    )
    stored = (fleet.stored or {}).get(job.owner, 0)
    message = quota_hold(
        job.owner,
        quota,
        held=fleet.held.get(job.owner, 0),
        used_hours=fleet.hours.get(job.owner, 0.0),
        processes=job.num_processes,
        stored=stored,
        machines=machines_of(job.spec),
    )
    if message is None:
        return None
    return ("storage" if storage_full(quota, stored) else "quota"), message


def _devices(count: int) -> str:
    return f"{count} device" if count == 1 else f"{count} devices"
