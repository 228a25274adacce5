"""The common claim on Postgres in one statement: pick, claim, state event and NOTIFY in one round trip.

The multi-statement claim (queue._claim_stepwise) reads the running jobs and the owners, ranks owners
into fair-share tiers in Python, tries each tier with its own index scan, then claims in an UPDATE
and writes the event: about nine statements in two transactions (15 round trips with BEGIN, COMMIT
and the pool's pre-pings) and ~15 ms of the worker's Python per claim. Here the same steps are CTEs
of one statement, run in autocommit (no BEGIN, no COMMIT): 2 round trips with the pre-ping.

- `held`: devices each owner's running jobs hold; `levels`: owners of equal usage (held / share);
- `pick`: the tiers in the claim's order, UNION ALL of LIMIT 1 index-ordered scans (priority DESC,
  id; FOR UPDATE SKIP LOCKED): the override tier (priority above the users' range), owners holding
  nothing, then one scan per usage level (a LATERAL over the levels, lowest first). Postgres's
  Append runs its branches in order and the LIMIT stops at the first row found, so a claim reads
  one index range as before;
- `claimed`: the UPDATE of that row (re-checking it is queued); `event`: its state event; `notified`:
  pg_notify for the live streams (delivered at the statement's commit, as before).

What it leaves to the stepwise claim (the statement claims nothing and says so):
- a picked job whose owner has a device, device-hour or storage quota of its own: the stepwise claim
  serialises a device-limited owner's claims on its row lock and counts its devices again after it,
  which one statement cannot (READ COMMITTED gives it one snapshot: it would not see a claim
  committed while it waited); the device-hours and storage sums are the quota module's, in Python.
  (A second transaction that locks the owner's row and runs the statement again, 7 round trips
  alone, was tried: with 8 workers and every owner limited, the job first in the order had often
  been taken meanwhile, and the claims fell to the stepwise claim after it, p50 598 ms against
  530 ms and more CPU; bench/results/claim-2026-12-07.txt.)
  A job of an owner without a quota passes every quota filter, so the first job in the claim's
  order, quotas aside, is the stepwise claim's pick too: the statement claims it;
- this worker's own reservation, and a wide job waiting to reserve a worker (reservations.py: rare,
  and bookkeeping with its own event);
- a gang still filling (job_gangs with no full_at, where the schema has them) while reservations are on:
  which workers hold for it (reservations.gang_hold) is Python's over the fleet; the stepwise claim
  decides every claim until the gang is full or released, seconds at most (the gang's own bound).
  A gang job in the queue is the statement's like any other: its first machine is an ordinary claim
  (the fit is num_processes, per machine), and a running gang's devices count every machine in
  `held` (num_processes × num_machines, shared/scheduling/machines.py), as the stepwise claim counts them;
- configured default quotas (GLUEJOBS_DEFAULT_MAX_DEVICES, …_DEVICE_HOURS_PER_DAY,
  …_STORAGE_BYTES) limit every owner: every claim goes there without asking
  (`one_statement_applies`).
A job the statement picked and then handed over stays locked only while the statement runs (another
worker's claim skips it for that moment, as it skips a row any claim holds).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import timedelta
from enum import Enum
from functools import cache
from typing import Any, Literal

from sqlalchemy import Boolean, Executable, column, select, text
from sqlalchemy.orm import Session

from shared.core.tables import ACTIVE_STATUSES, LIVE_WORKER_STATES, Base, Job, JobStatus, utcnow
from shared.jobs_repo.events import STATE
from shared.jobs_repo.streams import NOTIFY_CHANNEL
from shared.scheduling.fair_share import ClaimPolicy
from shared.scheduling.machines import JOB_DEVICES_SQL


class _Stepwise(Enum):
    STEPWISE = "stepwise"


# What claim_in_one_statement answers when the stepwise claim must decide.
STEPWISE = _Stepwise.STEPWISE


def one_statement_applies(policy: ClaimPolicy) -> bool:
    """Whether the one statement may claim under `policy`: not with a default device, device-hour or
    storage quota (every owner is then limited)."""
    quotas = policy.quotas
    return all(getattr(quotas, name, None) is None for name in _DEFAULT_LIMITS)


# The configured defaults that limit every owner's claims (the stepwise claim then decides).
_DEFAULT_LIMITS = ("max_devices", "max_device_hours_per_day", "max_storage_bytes")


def _picked_owner_limited() -> list[str]:
    """SQL that is true when the picked job's owner has a quota of its own (the stepwise claim then
    decides): a device or device-hour quota on its owners row, a storage quota in its own table
    (where this schema has one). A job of an owner without one passes every quota filter of the
    stepwise claim, so the first job in the claim's order, quotas aside, is the stepwise claim's
    pick too."""
    limits = [
        "EXISTS (SELECT 1 FROM pick JOIN owners o ON o.name = pick.owner"
        " WHERE o.max_devices IS NOT NULL OR o.max_device_hours_per_day IS NOT NULL)"
    ]
    storage = Base.metadata.tables.get("owner_storage_quotas")
    if storage is not None and {"owner", "max_storage_bytes"} <= set(storage.c.keys()):
        limits.append(
            "EXISTS (SELECT 1 FROM pick JOIN owner_storage_quotas q ON q.owner = pick.owner"
            " WHERE q.max_storage_bytes IS NOT NULL)"
        )
    return limits


def _quoted(values: Collection[str]) -> str:
    return ", ".join(f"'{value}'" for value in sorted(values))


_ACTIVE = _quoted(ACTIVE_STATUSES)
_LIVE = _quoted(LIVE_WORKER_STATES)
# The job's columns by name, in the order `.columns()` below gives them (it matches them by position).
_JOB_COLUMNS = ", ".join(f'claimed."{c.name}"' for c in Job.__table__.columns)
_BY_ORDER = "ORDER BY j.priority DESC, j.id LIMIT 1 FOR UPDATE OF j SKIP LOCKED"


@cache
def _statement(
    *, fair_share: bool, fit: bool, skip: bool, reserving: bool, wide: bool, gangs: bool
) -> Executable:
    """The statement for one combination of the claim's options, as an ORM select of (whether the
    stepwise claim must decide, the claimed Job): built once per process and combination."""
    base = "j.status = 'queued' AND (j.not_before IS NULL OR j.not_before <= :now)"
    if skip:
        base += " AND j.id <> ALL(:skip)"
    fits = base + (" AND j.num_processes <= :max_processes" if fit else "")
    stepwise = _picked_owner_limited()
    if reserving:
        stepwise.append("EXISTS (SELECT 1 FROM jobs WHERE reserved_by = :worker_id AND status = 'queued')")
    if reserving and gangs:
        stepwise.append("EXISTS (SELECT 1 FROM job_gangs g WHERE g.full_at IS NULL)")
    if wide:
        stepwise.append(
            f"EXISTS (SELECT 1 FROM jobs j WHERE {base} AND j.num_processes > :free"
            " AND j.num_processes <= :capacity AND j.created_at <= :waited_since AND (j.reserved_by IS NULL"
            " OR NOT EXISTS (SELECT 1 FROM workers w WHERE w.id = j.reserved_by"
            f" AND w.state IN ({_LIVE}) AND w.stopped_at IS NULL AND w.last_heartbeat_at >= :alive_since)))"
        )
    if fair_share:
        pick = f"""
    held AS (
        SELECT owner, sum({JOB_DEVICES_SQL.format(alias="jobs")}) AS devices FROM jobs
        WHERE status IN ({_ACTIVE}) AND owner IS NOT NULL GROUP BY owner
    ),
    levels AS (
        SELECT h.devices::float8 / COALESCE(NULLIF(o.share, 0), 1.0)::float8 AS usage,
               array_agg(h.owner) AS owners
        FROM held h LEFT JOIN owners o ON o.name = h.owner
        GROUP BY 1
    ),
    pick AS (
        SELECT id, owner FROM (
            SELECT a.id, a.owner FROM (
                SELECT j.id, j.owner FROM jobs j WHERE {fits} AND j.priority > :max_user_priority {_BY_ORDER}
            ) a
            UNION ALL
            SELECT b.id, b.owner FROM (
                SELECT j.id, j.owner FROM jobs j
                WHERE {fits} AND (j.owner IS NULL OR j.owner <> ALL (ARRAY(SELECT owner FROM held)))
                {_BY_ORDER}
            ) b
            UNION ALL
            SELECT c.id, c.owner FROM (SELECT usage, owners FROM levels ORDER BY usage) t
            CROSS JOIN LATERAL (
                SELECT j.id, j.owner FROM jobs j WHERE {fits} AND j.owner = ANY (t.owners) {_BY_ORDER}
            ) c
        ) tiers
        LIMIT 1
    ),"""
    else:
        pick = f"""
    pick AS (SELECT j.id, j.owner FROM jobs j WHERE {fits} {_BY_ORDER}),"""
    textual = text(f"""
WITH
{pick}
    flags AS (SELECT ({" OR ".join(stepwise)}) AS stepwise),
    claimed AS (
        UPDATE jobs SET status = 'running', worker_id = :worker_id, attempts = jobs.attempts + 1,
            started_at = COALESCE(jobs.started_at, :now), lease_expires_at = :lease_expires_at,
            updated_at = :now, not_before = NULL, reserved_by = NULL, reserved_at = NULL
        FROM pick
        WHERE jobs.id = pick.id AND jobs.status = 'queued' AND NOT (SELECT stepwise FROM flags)
        RETURNING jobs.*
    ),
    event AS (
        INSERT INTO job_events (job_id, created_at, kind, level, message, data, attempt)
        SELECT id, :now, '{STATE}', 'info',
            'claimed by worker ' || CAST(:worker_id AS text)
                || ' (attempt ' || attempts || ' of ' || max_attempts || ')',
            json_build_object(
                'status', 'running', 'worker_id', CAST(:worker_id AS text), 'attempt', attempts
            ),
            attempts
        FROM claimed
    ),
    notified AS (SELECT pg_notify('{NOTIFY_CHANNEL}', id::text) FROM claimed)
SELECT flags.stepwise AS claim_stepwise, {_JOB_COLUMNS}
FROM flags LEFT JOIN claimed ON true
WHERE (flags.stepwise OR claimed.id IS NOT NULL) AND (SELECT count(*) FROM notified) >= 0
""").columns(column("claim_stepwise", Boolean), *Job.__table__.columns)
    return select(column("claim_stepwise", Boolean), Job).from_statement(textual)


def claim_in_one_statement(
    session: Session,
    *,
    worker_id: str,
    lease_s: float,
    max_processes: int | None,
    capacity: int | None,
    policy: ClaimPolicy,
    skip: Collection[int],
    gangs: bool = False,
) -> Job | Literal[_Stepwise.STEPWISE] | None:
    """The claim of queue.claim_next as one statement (Postgres, autocommit): the claimed job, None
    when there is nothing to claim, or STEPWISE when the stepwise claim must decide (nothing was
    written then). `gangs`: the schema has the gang tables (0017)."""
    now = utcnow()
    reserving = capacity is not None and max_processes is not None and policy.reservation_after_s is not None
    wide = reserving and capacity is not None and max_processes is not None and capacity > max_processes
    statement = _statement(
        fair_share=policy.fair_share,
        fit=max_processes is not None,
        skip=bool(skip),
        reserving=reserving,
        wide=wide,
        gangs=gangs,
    )
    params: dict[str, Any] = {
        "now": now,
        "worker_id": worker_id,
        "lease_expires_at": now + timedelta(seconds=lease_s),
        "max_user_priority": policy.max_user_priority,
    }
    if max_processes is not None:
        params["max_processes"] = max_processes
        params["free"] = max_processes
    if skip:
        params["skip"] = sorted(skip)
    if wide and policy.reservation_after_s is not None:
        params["capacity"] = capacity
        params["waited_since"] = now - timedelta(seconds=policy.reservation_after_s)
        params["alive_since"] = now - timedelta(seconds=policy.lease_s)
    try:
        with session.begin():
            session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
            row = session.execute(statement, params).first()
    finally:
        session.expunge_all()
    if row is None:
        return None
    if row[0]:
        return STEPWISE
    job: Job = row[1]
    assert job.status == JobStatus.running
    return job
