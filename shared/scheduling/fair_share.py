"""The claim's order: fair share between owners, priorities, quotas.

Among the jobs a worker can run, a claim prefers the owner who holds the fewest devices (the sum of
num_processes × num_machines of their running jobs: a gang counts every machine) divided by their
share (Owner.share, default 1), then the job's priority, then its age. A priority above
GLUEJOBS_MAX_USER_PRIORITY (only admins may set one) goes before fair share. With GLUEJOBS_FAIR_SHARE
off the order is priority, then age, for everyone.
Quotas hold in both modes: an owner whose running jobs would exceed max_devices with a job, or who
has used max_device_hours_per_day, is skipped (the rule and its SQL: shared/scheduling/quotas.py).

Why tiers rather than one ORDER BY: sorting 10,000 queued jobs by a computed per-owner usage costs a
full scan and sort on every claim (30–50 ms measured). Usage belongs to owners, not jobs, and only the
few owners with running jobs have any: `plan_claim` reads them (the running jobs grouped by owner,
and the small owners table) and ranks owners into tiers of equal usage: first the override tier
(priority above the users' range), then everyone holding nothing, then each usage level upwards.
`first_claimable` tries the tiers in order, each an index-ordered `priority DESC, id` scan with
LIMIT 1 (FOR UPDATE SKIP LOCKED on Postgres), so a claim usually reads one index range and stops.
Both run inside the stepwise claim's one short write transaction. On Postgres the common claim does
the same in SQL, in one statement (shared/jobs_repo/claim_statement.py: the same tiers, in the same
order); a change to the order here must be made there too (tests/shared/test_claim_statement.py compares
the two).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import ColumnElement, or_, select
from sqlalchemy.orm import Session

from shared.core.config import Settings
from shared.core.tables import Job, Owner
from shared.scheduling.quotas import QuotaDefaults, claim_filters, devices_held


@dataclass(frozen=True)
class ClaimPolicy:
    """What a claim needs of the configuration (shared/ takes no globals: the worker builds it).

    The default (no settings) is the order before fair share: priority, then age, no reservations;
    owners' own quotas still hold. Unit tests and benches that call claim_next directly use it."""

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


@dataclass(frozen=True)
class ClaimPlan:
    """The quota filters every candidate must pass, and the owner tiers to try in order."""

    quota: list[ColumnElement[bool]]
    tiers: list[ColumnElement[bool] | None]  # None: any owner
    # Whether any owner's devices are limited: only then must a claim re-check the picked job's
    # owner under its row lock (quotas.within_device_quota), two round trips.
    devices_limited: bool = True


def plan_claim(session: Session, policy: ClaimPolicy, *, now: datetime) -> ClaimPlan:
    """Read what the order depends on (inside the caller's transaction): a few small queries."""
    held = devices_held(session)
    rows = {o.name: o for o in session.scalars(select(Owner))}
    quota = claim_filters(session, policy.quotas, held=held, rows=rows, now=now)
    if not policy.fair_share:
        return ClaimPlan(quota.conditions, [None], quota.devices_limited)
    usage: dict[float, list[str]] = {}
    for owner, devices in held.items():
        share = rows[owner].share if owner in rows and rows[owner].share else 1.0
        usage.setdefault(devices / share, []).append(owner)
    holding = sorted(held)
    tiers: list[ColumnElement[bool] | None] = [Job.priority > policy.max_user_priority]
    tiers.append(or_(Job.owner.is_(None), Job.owner.not_in(holding)) if holding else None)
    tiers += [Job.owner.in_(sorted(owners)) for _level, owners in sorted(usage.items())]
    return ClaimPlan(quota.conditions, tiers, quota.devices_limited)


def first_claimable(
    session: Session, plan: ClaimPlan, conditions: Sequence[ColumnElement[bool]]
) -> int | None:
    """The first job matching `conditions` in the plan's order, locked (Postgres: rows another claim
    holds are skipped); None when there is none."""
    for tier in plan.tiers:
        query = select(Job.id).where(*conditions, *plan.quota)
        if tier is not None:
            query = query.where(tier)
        found = session.scalars(
            query.order_by(Job.priority.desc(), Job.id).limit(1).with_for_update(skip_locked=True)
        ).first()
        if found is not None:
            return int(found)
    return None
