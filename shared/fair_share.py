"""The claim's order: fair share between owners, priorities, quotas.

Among the jobs a worker can run, a claim prefers the owner who holds the fewest devices (the sum of
num_processes of their running jobs) divided by their share (Owner.share, default 1), then the job's
priority, then its age. A priority above GLUEJOBS_MAX_USER_PRIORITY (only admins may set one) goes
before fair share. With GLUEJOBS_FAIR_SHARE off the order is priority, then age, for everyone.
Quotas hold in both modes: an owner whose running jobs would exceed max_devices with this job, or who
has used max_device_hours_per_day, is skipped.

Everything here is one SELECT (the caller wraps it in its UPDATE … FOR UPDATE SKIP LOCKED): the
devices held per owner are a grouped subquery over running jobs (a few rows, on the status index),
joined to the queued jobs with the owners' rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, Select, case, func, literal, or_, select
from sqlalchemy.orm import aliased

from shared.config import Settings
from shared.models import ACTIVE_STATUSES, Job, Owner
from shared.quotas import QuotaDefaults


@dataclass(frozen=True)
class ClaimPolicy:
    """What a claim needs of the configuration (shared/ takes no globals: the worker builds it).

    The default (no settings) is the order before fair share: priority, then age, no quotas, no
    reservations, which is what the unit tests and benches that call claim_next directly expect."""

    fair_share: bool = False
    max_user_priority: int = 1000
    quotas: QuotaDefaults = field(default_factory=QuotaDefaults)
    reservation_after_s: float | None = None  # None: wide jobs reserve no worker
    lease_s: float = 60.0  # a reserving worker not heard from for this long is gone

    @classmethod
    def from_settings(cls, settings: Settings) -> ClaimPolicy:
        return cls(
            fair_share=settings.fair_share,
            max_user_priority=settings.max_user_priority,
            quotas=QuotaDefaults.from_settings(settings),
            reservation_after_s=settings.reservation_after_s,
            lease_s=settings.lease_s,
        )


def held_subquery() -> Any:
    """Devices held per owner: (owner, devices) over running and cancelling jobs."""
    running = aliased(Job, name="held_jobs")
    return (
        select(running.owner.label("owner"), func.sum(running.num_processes).label("devices"))
        .where(running.status.in_(ACTIVE_STATUSES), running.owner.is_not(None))
        .group_by(running.owner)
        .subquery("held")
    )


def ordered_candidates(
    policy: ClaimPolicy,
    conditions: Sequence[ColumnElement[bool]],
    *,
    over_hours: Sequence[str] = (),
) -> Select[Any]:
    """Job ids matching `conditions`, in the claim's order, with the quota filters applied."""
    query = select(Job.id).where(*conditions)
    if over_hours:
        query = query.where(or_(Job.owner.is_(None), Job.owner.not_in(list(over_hours))))
    # The owners' rows carry per-owner device limits, which any row may set: the join is always
    # made (against a table of a few dozen rows, and the few running jobs grouped by owner).
    held = held_subquery()
    devices = func.coalesce(held.c.devices, 0)
    query = query.outerjoin(held, held.c.owner == Job.owner).outerjoin(Owner, Owner.name == Job.owner)
    query = query.where(_within_device_quota(devices, policy.quotas.max_devices))
    if not policy.fair_share:
        return query.order_by(Job.priority.desc(), Job.id)
    cap = policy.max_user_priority
    override = case((Job.priority > cap, Job.priority), else_=literal(cap))
    usage = (devices * literal(1.0)) / func.coalesce(Owner.share, literal(1.0))
    return query.order_by(override.desc(), usage, Job.priority.desc(), Job.id)


def _within_device_quota(devices: Any, default: int | None) -> ColumnElement[bool]:
    """The job fits its owner's max_devices (an owner's own, else the default; none: no limit)."""
    limit = Owner.max_devices if default is None else func.coalesce(Owner.max_devices, default)
    return or_(Job.owner.is_(None), limit.is_(None), devices + Job.num_processes <= limit)
