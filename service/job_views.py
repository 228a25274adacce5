"""Jobs as the API shows them: JobPublic with `waiting_for` (why a queued job is held back) and a
pruned trial's search and stopping point, computed for a whole page at once
(shared/scheduling/wait_reasons.py, shared/searches/store.py), never one query per job; for a non-admin
key, its places named by API paths (service/user_views.py)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from service.accounts.auth import Principal
from service.schemas.jobs import JobPublic, WaitingFor
from service.user_views import job_fields_for_user
from shared.core.config import Settings
from shared.core.tables import Job
from shared.scheduling.fair_share import ClaimPolicy
from shared.scheduling.wait_reasons import waiting_for
from shared.searches.store import trials_of_jobs

# The fields of JobPublic that can hold a store URI, a worker's path or a traceback.
PLACE_FIELDS = ("output_dir", "result", "environment", "reproduction", "error")


def job_views(
    session: Session, settings: Settings, jobs: Sequence[Job], principal: Principal
) -> list[JobPublic]:
    reasons = waiting_for(session, jobs, ClaimPolicy.from_settings(settings))
    trials = trials_of_jobs(session, job_ids=[job.id for job in jobs])
    views = []
    for job in jobs:
        view = JobPublic.model_validate(job)
        if job.id in reasons:
            view.waiting_for = WaitingFor.model_validate(reasons[job.id])
        trial = trials.get(job.id)
        if trial is not None:
            view.search_id = trial.search_id
            if trial.pruned:  # the pruner's stop: {evaluation, epoch, step, metric, value, pruner}
                view.pruned = {"search_id": trial.search_id, "trial": trial.number, **trial.pruned}
        if not principal.is_admin:
            view = for_user(settings, job, view)
        views.append(view)
    return views


def job_view(session: Session, settings: Settings, job: Job, principal: Principal) -> JobPublic:
    return job_views(session, settings, [job], principal)[0]


def for_user(settings: Settings, job: Job, view: JobPublic) -> JobPublic:
    """`view` as a non-admin key reads it (also after `reproduction` is filled in)."""
    fields = {name: getattr(view, name) for name in PLACE_FIELDS}
    return view.model_copy(update=job_fields_for_user(settings, job, fields))
