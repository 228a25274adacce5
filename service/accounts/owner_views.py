"""Owners as GET /v1/owners shows them (what each holds, queues and used, its bytes in the store; its
effective quota), and
the admins' change of an owner's share and quotas (PATCH /v1/owners/{name}), with its audit entry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.accounts import audit
from shared.core.config import Settings
from shared.core.db import read, write
from shared.core.errors import InvalidRequest, quote
from shared.core.owners import RESERVED_PREFIX, ensure_owner, is_reserved_owner_name
from shared.core.tables import ACTIVE_STATUSES, Job, JobStatus, Owner, OwnerStorageQuota
from shared.scheduling.machines import job_devices
from shared.scheduling.quotas import (
    QUOTA_FIELDS,
    QuotaDefaults,
    check_storage,
    device_hours_24h,
    effective_quota,
)
from shared.scheduling.storage_usage import StorageUsage, own_storage_limits, storage_by_owner

SETTABLE = ("share", *QUOTA_FIELDS)


@dataclass(frozen=True)
class OwnerView:
    name: str
    share: float
    running_jobs: int
    devices_in_use: int
    queued_jobs: int
    device_hours_24h: float
    quota: dict[str, Any]
    quota_source: dict[str, str]
    storage: dict[str, int]


def list_owners(session: Session, *, defaults: QuotaDefaults, owner: str | None = None) -> list[OwnerView]:
    """Every owner (those with a row, and those only jobs name), by name; with `owner`, only that one.
    A fixed number of queries however many owners there are."""
    with read(session):
        counts = select(
            Job.owner,
            Job.status,
            func.count(),
            func.coalesce(func.sum(job_devices), 0),  # a gang's devices on every machine
        ).where(Job.owner.is_not(None), Job.status.in_([JobStatus.queued, *ACTIVE_STATUSES]))
        if owner is not None:
            counts = counts.where(Job.owner == owner)
        tally: dict[str, dict[str, int]] = {}
        for name, status, jobs, devices in session.execute(counts.group_by(Job.owner, Job.status)):
            row = tally.setdefault(str(name), {"running": 0, "devices": 0, "queued": 0})
            if status == JobStatus.queued:
                row["queued"] += int(jobs)
            else:
                row["running"] += int(jobs)
                row["devices"] += int(devices)
        rows = select(Owner) if owner is None else select(Owner).where(Owner.name == owner)
        owners = {o.name: o for o in session.scalars(rows)}
        only = None if owner is None else [owner]
        stored = storage_by_owner(session, only)
        limits = own_storage_limits(session, only)
        names = sorted(set(owners) | set(tally) | set(stored) | ({owner} if owner else set()))
        hours = device_hours_24h(session, only)
    return [
        _view(
            name,
            owners.get(name),
            tally.get(name, {}),
            hours.get(name, 0.0),
            defaults,
            stored.get(name, StorageUsage()),
            limits.get(name),
        )
        for name in names
    ]


def _view(
    name: str,
    row: Owner | None,
    tally: dict[str, int],
    hours: float,
    defaults: QuotaDefaults,
    stored: StorageUsage,
    own_storage: int | None,
) -> OwnerView:
    quota = effective_quota(row, defaults, own_storage=own_storage)
    return OwnerView(
        name=name,
        share=row.share if row is not None else 1.0,
        running_jobs=tally.get("running", 0),
        devices_in_use=tally.get("devices", 0),
        queued_jobs=tally.get("queued", 0),
        device_hours_24h=round(hours, 4),
        quota=quota.limits,
        quota_source=quota.source,
        storage=stored.as_dict(),
    )


def check_room(session: Session, settings: Settings, owner: str | None, adding: int) -> None:
    """429 (over_quota) when storing `adding` more bytes would take the owner past its
    max_storage_bytes, or it holds that much already (`adding` 0: before an upload is read)."""
    with read(session):
        check_storage(session, owner=owner, adding=adding, defaults=QuotaDefaults.from_settings(settings))


def set_owner_quota(
    session: Session,
    *,
    name: str,
    changes: dict[str, Any],
    actor: str | None,
    actor_key_id: int | None,
    defaults: QuotaDefaults,
) -> OwnerView:
    """Set the given fields (None: back to the default; share None: 1) on the owner's row, made if
    new, with a "quota.set" audit entry in the same transaction; the owner's view afterwards."""
    unknown = set(changes) - set(SETTABLE)
    if unknown:
        raise ValueError(f"not an owner setting: {sorted(unknown)}")
    with write(session):
        if is_reserved_owner_name(name) and session.get(Owner, name) is None:
            # Only the owner of a configured key (its row made at every start) may have such a name.
            raise InvalidRequest(
                f"no owner {quote(name)}: names starting with {RESERVED_PREFIX!r} are the service's own",
                field="name",
            )
        ensure_owner(session.connection(), name)
        row = session.scalars(select(Owner).where(Owner.name == name).with_for_update()).one()
        storage = session.get(OwnerStorageQuota, name)
        before = {field: _setting(row, storage, field) for field in changes}
        for field, value in changes.items():
            if field == "max_storage_bytes":
                if storage is None:
                    storage = OwnerStorageQuota(owner=name)
                    session.add(storage)
                storage.max_storage_bytes = value
            else:
                setattr(row, field, 1.0 if field == "share" and value is None else value)
        audit.record(
            session,
            actor=actor,
            actor_key_id=actor_key_id,
            action="quota.set",
            target=f"owner {name}",
            data={"before": before, "after": {field: _setting(row, storage, field) for field in changes}},
        )
    return list_owners(session, defaults=defaults, owner=name)[0]


def _setting(row: Owner, storage: OwnerStorageQuota | None, field: str) -> Any:
    """An owner's own setting: a column of its row, or its storage quota's row."""
    if field == "max_storage_bytes":
        return storage.max_storage_bytes if storage is not None else None
    return getattr(row, field)
