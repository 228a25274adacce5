"""Per-owner quotas: devices held at once, jobs queued, device-hours in the last 24 hours, bytes held
in the store.

An owner's row (shared/core/tables.Owner) holds its own limits; a None column means the configured
default (GLUEJOBS_DEFAULT_MAX_…), which may itself be no limit. The claim skips an owner's jobs that
would exceed the devices or device-hours quota, a job's devices counted over every machine it
spans (num_processes × num_machines: shared/scheduling/machines.py); a submission, sweep or rerun
that would exceed the queued quota is refused with 429 (`check_queued`, inside the creating
transaction). Jobs without an owner (auth off) have no quota: there is no one to share with. The
storage quota (max_storage_bytes) refuses uploads past it with 429 (`check_storage`) and holds an
owner's queued jobs while it is at or over it (`storage_full`: the claim skips them, `quota_hold`
says why), so a job never starts only to fail for want of room; a running job may still take its
owner past it.

This module is the one home of the rule. The claim's SQL (`claim_filters`, `within_device_quota`)
and the reason the API shows for a held job (`quota_hold`) compare through the same two functions,
`device_room` and `hours_spent`, so the explanation cannot drift from what the claim does.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, func, or_, select
from sqlalchemy.orm import Session

from shared.core.config import Settings
from shared.core.errors import OverQuota
from shared.core.owners import ensure_owner
from shared.core.tables import ACTIVE_STATUSES, Job, JobStatus, Owner, OwnerStorageQuota, utcnow
from shared.scheduling.machines import devices_words, job_devices
from shared.scheduling.optional_tables import has_table
from shared.scheduling.storage_usage import human_bytes, own_storage_limits, storage_by_owner

QUOTA_FIELDS = ("max_devices", "max_queued", "max_device_hours_per_day", "max_storage_bytes")
DAY = timedelta(hours=24)


@dataclass(frozen=True)
class QuotaDefaults:
    """The configured defaults for an owner whose row sets no limit (None: no limit)."""

    max_devices: int | None = None
    max_queued: int | None = None
    max_device_hours_per_day: float | None = None
    max_storage_bytes: int | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> QuotaDefaults:
        return cls(
            max_devices=settings.default_max_devices,
            max_queued=settings.default_max_queued,
            max_device_hours_per_day=settings.default_max_device_hours_per_day,
            max_storage_bytes=settings.default_max_storage_bytes,
        )


@dataclass(frozen=True)
class Quota:
    """An owner's effective limits, and where each comes from ("owner" or "default")."""

    limits: dict[str, Any]
    source: dict[str, str]


def effective_quota(owner: Owner | None, defaults: QuotaDefaults, *, own_storage: int | None = None) -> Quota:
    """The owner's limits, defaults applied. Its own max_storage_bytes is a row of
    owner_storage_quotas (`own_storage`), not a column of its owners row."""
    limits: dict[str, Any] = {}
    source: dict[str, str] = {}
    for name in QUOTA_FIELDS:
        if name == "max_storage_bytes":
            own = own_storage
        else:
            own = getattr(owner, name) if owner is not None else None
        limits[name] = own if own is not None else getattr(defaults, name)
        source[name] = "owner" if own is not None else "default"
    return Quota(limits, source)


def device_room(quota: Quota, held: int) -> int | None:
    """How many devices the owner's next job may take: max_devices less what it holds (None: no
    limit). A job fits when its devices over all its machines (machines.job_devices) are at most this."""
    cap = quota.limits["max_devices"]
    return None if cap is None else cap - held


def hours_spent(quota: Quota, used: float) -> bool:
    """Whether the owner has used its device-hours of the last 24 hours: none of its jobs starts."""
    cap = quota.limits["max_device_hours_per_day"]
    return cap is not None and used >= cap


def storage_full(quota: Quota, stored: int) -> bool:
    """Whether the owner holds its max_storage_bytes (or more): none of its jobs starts."""
    cap = quota.limits["max_storage_bytes"]
    return cap is not None and stored >= cap


def quota_hold(
    owner: str,
    quota: Quota,
    *,
    held: int,
    used_hours: float,
    processes: int,
    stored: int = 0,
    machines: int = 1,
) -> str | None:
    """Why the claim skips a job of `owner` needing `processes` devices on each of `machines`, in
    words; None when the quotas let it start. The same comparisons as `claim_filters` and
    `within_device_quota`."""
    if storage_full(quota, stored):
        return (
            f"{owner} holds {human_bytes(stored)} in the store, its max_storage_bytes is "
            f"{human_bytes(quota.limits['max_storage_bytes'])} (max_storage_bytes): remove checkpoints "
            "(DELETE /v1/jobs/{id}/checkpoints), files or models, or ask an admin to raise the quota"
        )
    room = device_room(quota, held)
    if room is not None and processes * machines > room:
        words = f"{owner} holds {held} of {quota.limits['max_devices']} devices (max_devices)"
        # A gang's N × D may pass the quota on its own: the message says what the job needs.
        return words + (f"; this job needs {devices_words(processes, machines)}" if machines > 1 else "")
    if hours_spent(quota, used_hours):
        return (
            f"{owner} used {used_hours:.1f} of {quota.limits['max_device_hours_per_day']:g} device-hours "
            "in the last 24 h (max_device_hours_per_day)"
        )
    return None


@dataclass(frozen=True)
class ClaimFilters:
    """The quota conditions every job a claim picks must meet, as SQL."""

    conditions: list[ColumnElement[bool]]
    # Whether any owner's devices are limited (its own max_devices or the default): only then must
    # a claim re-check the picked job's owner under its row lock (`within_device_quota`).
    devices_limited: bool


def claim_filters(
    session: Session,
    defaults: QuotaDefaults,
    *,
    held: dict[str, int],
    rows: dict[str, Owner],
    now: datetime,
) -> ClaimFilters:
    """The quotas as SQL conditions on Job (inside the claim's transaction), from what each owner
    holds (`held`, devices_held) and the owners' rows: a job of a device-limited owner must fit in
    `device_room`; an owner whose `hours_spent` is skipped whole."""
    conditions: list[ColumnElement[bool]] = []
    known = sorted(set(held) | {name for name, row in rows.items() if row.max_devices is not None})
    for owner in known:
        room = device_room(effective_quota(rows.get(owner), defaults), held.get(owner, 0))
        if room is not None:
            conditions.append(or_(Job.owner.is_(None), Job.owner != owner, job_devices <= room))
    default_room = device_room(effective_quota(None, defaults), 0)
    if default_room is not None:  # owners holding nothing, without a limit of their own
        unknown = and_(Job.owner.is_not(None), Job.owner.not_in(known)) if known else Job.owner.is_not(None)
        conditions.append(or_(~unknown, job_devices <= default_room))
    over = owners_over_hours(session, defaults, now=now, rows=list(rows.values()))
    if over:
        conditions.append(or_(Job.owner.is_(None), Job.owner.not_in(over)))
    full = owners_over_storage(session, defaults, cache_s=OVER_STORAGE_CACHE_S)
    if full:
        conditions.append(or_(Job.owner.is_(None), Job.owner.not_in(full)))
    limited = defaults.max_devices is not None or any(r.max_devices is not None for r in rows.values())
    return ClaimFilters(conditions, limited)


def within_device_quota(session: Session, defaults: QuotaDefaults, job_id: int) -> bool:
    """Whether the owner of the job a claim just picked may still take its devices (inside the
    claim's write transaction).

    Postgres runs claims side by side: two of them could each see an owner one device below its
    max_devices and both claim. The owner's row lock serialises the claims of a limited owner, and
    after it the count of what the owner holds includes every claim committed before (SQLite's one
    write lock serialises claims already). The caller then claims nothing this round."""
    if session.get_bind().dialect.name != "postgresql":
        return True
    owner, devices = session.execute(select(Job.owner, job_devices).where(Job.id == job_id)).one()
    if owner is None:
        return True
    row = session.scalars(select(Owner).where(Owner.name == owner)).first()
    quota = effective_quota(row, defaults)
    if device_room(quota, 0) is None:
        return True  # no limit: nothing to serialise
    if row is None:  # a default limit and no row yet: make the row there is to lock
        ensure_owner(session.connection(), owner)
    session.execute(select(Owner.name).where(Owner.name == owner).with_for_update())
    room = device_room(quota, devices_held(session, [owner]).get(owner, 0))
    return room is not None and devices <= room


def devices_held(session: Session, owners: Collection[str] | None = None) -> dict[str, int]:
    """Devices each owner's running jobs hold (the sum of their num_processes × machines)."""
    query = (
        select(Job.owner, func.sum(job_devices))
        .where(Job.status.in_(ACTIVE_STATUSES), Job.owner.is_not(None))
        .group_by(Job.owner)
    )
    if owners is not None:
        query = query.where(Job.owner.in_(list(owners)))
    return {owner: int(total or 0) for owner, total in session.execute(query) if owner is not None}


def device_hours_24h(
    session: Session, owners: Collection[str] | None = None, *, now: datetime | None = None
) -> dict[str, float]:
    """Device-hours each owner used in the last 24 hours: num_processes × machines × the part of
    each job's run (started_at to finished_at, or now while it runs) inside the window. Computed here rather
    than in SQL because interval arithmetic differs between SQLite and Postgres."""
    now = now or utcnow()
    since = now - DAY
    query = select(Job.owner, job_devices, Job.started_at, Job.finished_at).where(
        Job.owner.is_not(None),
        Job.started_at.is_not(None),
        or_(Job.finished_at.is_(None), Job.finished_at > since),
        or_(Job.finished_at.is_not(None), Job.status.in_(ACTIVE_STATUSES)),
    )
    if owners is not None:
        query = query.where(Job.owner.in_(list(owners)))
    used: dict[str, float] = {}
    for owner, devices, started, finished in session.execute(query):
        if started is None or owner is None:
            continue
        start, end = max(started, since), min(finished or now, now)
        if end > start:
            used[owner] = used.get(owner, 0.0) + devices * (end - start).total_seconds() / 3600
    return used


def owners_over_hours(
    session: Session,
    defaults: QuotaDefaults,
    *,
    now: datetime | None = None,
    rows: Iterable[Owner] | None = None,
) -> list[str]:
    """Owners at or over their device-hours quota (the claim skips them). Without any such limit
    (no default, no owner's own) this is one read of the owners table (`rows`, when the caller has
    read them) and nothing more."""
    limited = {
        owner.name: owner
        for owner in (rows if rows is not None else session.scalars(select(Owner)))
        if owner.max_device_hours_per_day is not None
    }
    if defaults.max_device_hours_per_day is None and not limited:
        return []
    owners = None if defaults.max_device_hours_per_day is not None else list(limited)
    used = device_hours_24h(session, owners, now=now)
    return sorted(
        owner
        for owner, hours in used.items()
        if hours_spent(effective_quota(limited.get(owner), defaults), hours)
    )


def has_storage_tables(session: Session) -> bool:
    """Whether the database has 0015's tables: a worker of this build on the previous schema (a
    fleet mid-upgrade) claims without the storage quota until it is migrated."""
    return has_table(session, OwnerStorageQuota.__tablename__)


def storage_limited(
    session: Session, defaults: QuotaDefaults, owners: Collection[str] | None = None
) -> dict[str, int] | None:
    """The owners' own storage limits (of `owners`, or all), or None when no storage quota applies
    (no default, no owner's own): then nothing is summed."""
    if not has_storage_tables(session):
        return None
    limited = own_storage_limits(session, owners)
    return None if defaults.max_storage_bytes is None and not limited else limited


# The claim's answer of owners_over_storage, per database and defaults, for this long: the tally it
# sums moves with the storage sweep (GLUEJOBS_STORAGE_SWEEP_S) anyway, while a claim comes every poll
# of every worker slot. Uploads and removals show within this; the API's own checks are exact.
OVER_STORAGE_CACHE_S = 5.0
_over_storage: dict[tuple[str, int | None], tuple[float, list[str]]] = {}


def owners_over_storage(session: Session, defaults: QuotaDefaults, *, cache_s: float = 0.0) -> list[str]:
    """Owners at or over their max_storage_bytes (the claim skips their jobs). Without any such
    limit this sums nothing (one read of owner_storage_quotas). With `cache_s`, an answer that
    recent (from this process) is reused."""
    key = (str(session.get_bind().engine.url), defaults.max_storage_bytes)
    cached = _over_storage.get(key)
    if cache_s and cached is not None and time.monotonic() - cached[0] < cache_s:
        return cached[1]
    limited = storage_limited(session, defaults)
    over: list[str] = []
    if limited is not None:
        owners = None if defaults.max_storage_bytes is not None else list(limited)
        usage = storage_by_owner(session, owners)
        over = sorted(
            owner
            for owner, stored in usage.items()
            if storage_full(effective_quota(None, defaults, own_storage=limited.get(owner)), stored.total)
        )
    _over_storage[key] = (time.monotonic(), over)
    return over


def check_storage(session: Session, *, owner: str | None, adding: int, defaults: QuotaDefaults) -> None:
    """OverQuota (429) when the owner holds its max_storage_bytes already, or storing `adding` more
    bytes would take it past: the message names the quota, what the owner holds and the limit. Read
    in the caller's transaction; two uploads at one moment may together pass the limit by one file."""
    if owner is None:
        return
    own = own_storage_limits(session, [owner]).get(owner)
    limit = own if own is not None else defaults.max_storage_bytes
    if limit is None:
        return
    usage = storage_by_owner(session, [owner]).get(owner)
    stored = usage.total if usage is not None else 0
    if stored < limit and stored + adding <= limit:
        return
    more = f": {human_bytes(adding)} more would exceed it" if stored < limit else ""
    raise OverQuota(
        f"{owner} holds {human_bytes(stored)} ({stored} bytes) in the store and its max_storage_bytes is "
        f"{human_bytes(limit)} ({limit} bytes){more}. Remove checkpoints (gluejobs checkpoints prune JOB), "
        "files or models, or ask an admin to raise the quota",
        retry_after_s=60,
    )


def check_queued(session: Session, *, owner: str | None, adding: int, defaults: QuotaDefaults) -> None:
    """OverQuota when `adding` more queued jobs would take the owner past its max_queued. Called inside
    the creating write transaction: the owner's row is locked first (Postgres), so two concurrent
    submissions of one owner count one after the other."""
    if owner is None:
        return
    ensure_owner(session.connection(), owner)
    row = session.scalars(select(Owner).where(Owner.name == owner).with_for_update()).one()
    limit = effective_quota(row, defaults).limits["max_queued"]
    if limit is None:
        return
    queued = session.scalar(
        select(func.count()).select_from(Job).where(Job.owner == owner, Job.status == JobStatus.queued)
    )
    if int(queued or 0) + adding > limit:
        jobs = "job" if adding == 1 else f"{adding} jobs"
        raise OverQuota(
            f"{owner} has {queued} queued job(s); max_queued is {limit}, so {jobs} more would exceed "
            "it: wait for some to start, or ask an admin to raise the quota",
            retry_after_s=60,
        )


def owner_rows(session: Session, names: Iterable[str]) -> dict[str, Owner]:
    names = list(names)
    if not names:
        return {}
    return {o.name: o for o in session.scalars(select(Owner).where(Owner.name.in_(names)))}
