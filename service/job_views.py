"""Jobs as the API shows them: JobPublic with `waiting_for` (why a queued job is held back), computed
for a whole page at once (shared/queue/wait_reasons.py), never one query per job."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from service.schemas.jobs import JobPublic, WaitingFor
from shared.core.config import Settings
from shared.core.tables import Job
from shared.queue.fair_share import ClaimPolicy
from shared.queue.wait_reasons import waiting_for


def job_views(session: Session, settings: Settings, jobs: Sequence[Job]) -> list[JobPublic]:
    reasons = waiting_for(session, jobs, ClaimPolicy.from_settings(settings))
    views = []
    for job in jobs:
        view = JobPublic.model_validate(job)
        if job.id in reasons:
            view.waiting_for = WaitingFor.model_validate(reasons[job.id])
        views.append(view)
    return views


def job_view(session: Session, settings: Settings, job: Job) -> JobPublic:
    return job_views(session, settings, [job])[0]
