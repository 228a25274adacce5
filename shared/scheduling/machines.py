"""A job's devices over every machine it spans (issue 37), and the gangs' seats: the one home of both.

A job asks for `num_processes` devices on each of `num_machines` workers (the spec's field, null or
absent for one machine; a gang of several otherwise: shared/jobs_repo/gangs.py). It holds N × D
devices while it runs, so fair share, `max_devices`, device-hours and the usage figures shown to
users and operators count N × D (`job_devices`); what a single worker must have free for it stays
D (`Job.num_processes`: the fit, reservations, joining a gang).

The machine count is read from the spec's JSON rather than a column: the jobs table keeps the shape
a worker of the previous release reads (a fleet mid-upgrade), and only running jobs' counts are
summed, a handful of rows.

A gang's members other than rank 0 hold D devices each on their own worker, but the job's row names
rank 0's worker alone: `seats_by_worker` gives what the other members hold, so that a worker's free
devices count its seat. The gang tables are 0017's: on an older schema (a fleet mid-upgrade) there
are no gangs, and `has_gang_tables` says so without failing.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from shared.core.tables import ACTIVE_STATUSES, Job, JobGang, JobGangMember
from shared.scheduling.optional_tables import has_table

# The job's machines: the spec's num_machines, 1 when it has none (stored as null when 1).
job_machines: ColumnElement[int] = func.coalesce(Job.spec["num_machines"].as_integer(), 1)
# The devices a job holds while it runs, over all its machines: num_processes × machines.
job_devices: ColumnElement[int] = Job.num_processes * job_machines
# The same in the one-statement claim's SQL (Postgres), for a `jobs` row named `alias`.
JOB_DEVICES_SQL = "({alias}.num_processes * COALESCE(({alias}.spec ->> 'num_machines')::int, 1))"


def machines_of(spec: Mapping[str, Any] | None) -> int:
    """The machines a job's spec asks for (1 without num_machines)."""
    value = (spec or {}).get("num_machines")
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 1 else 1


def devices_of(job: Job) -> int:
    """The devices a job holds while it runs (`job_devices`, for a row in hand)."""
    return job.num_processes * machines_of(job.spec)


def devices_words(processes: int, machines: int) -> str:
    """ "6 devices (2 machines × 3)", or "3 devices" for one machine."""
    total = processes * machines
    noun = "device" if total == 1 else "devices"
    return f"{total} {noun} ({machines} machines × {processes})" if machines > 1 else f"{total} {noun}"


def has_gang_tables(session: Session) -> bool:
    """Whether the database has 0017's gang tables (job_gangs, job_gang_members)."""
    return has_table(session, JobGangMember.__tablename__)


def seats_by_worker(session: Session, workers: Collection[str] | None = None) -> dict[str, int]:
    """Devices each worker holds as a gang member other than rank 0 (rank 0's are its job's row):
    the job's num_processes per seat of an active job. Empty without the gang tables."""
    if not has_gang_tables(session):
        return {}
    query = (
        select(JobGangMember.worker_id, func.sum(Job.num_processes))
        .join(JobGang, JobGang.id == JobGangMember.gang_id)
        .join(Job, Job.id == JobGang.job_id)
        .where(JobGangMember.rank > 0, Job.status.in_(ACTIVE_STATUSES), Job.attempts == JobGang.attempt)
        .group_by(JobGangMember.worker_id)
    )
    if workers is not None:
        query = query.where(JobGangMember.worker_id.in_(list(workers)))
    return {str(worker): int(devices or 0) for worker, devices in session.execute(query)}
