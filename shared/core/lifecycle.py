"""The job's life in one table: every status move a job can make, each with why it makes it.

`transition()` (shared/jobs_repo/events.py), through which every status change is written, refuses a
move that is not here: a caller that tries one has a bug, and writing it anyway would leave a job in
a state nothing else expects (a finished job running again, a queued job "succeeding"). The users'
lifecycle table (docs/users/http-api.md, "Job lifecycle") is checked against this one by
tests/shared/test_lifecycle.py, so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, Literal

from shared.core.errors import GluejobsError
from shared.core.tables import JobStatus

# Where a job comes from when it is created: no status yet.
NEW: Final = "new"
Source = JobStatus | Literal["new"]

_q, _r, _c = JobStatus.queued, JobStatus.running, JobStatus.cancelling
_ok, _fail, _x = JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled

# FROM → {TO: why}. A finished status (succeeded, failed, cancelled) has no way out: a rerun is a
# new job. Who makes each move: jobs_repo.jobs (create, cancel, prune), jobs_repo.queue (claim,
# finish, fail, hand back, refuse, release, lease recovery), worker/fleet/supervisor.py (which outcome).
TRANSITIONS: Final[Mapping[Source, Mapping[JobStatus, str]]] = MappingProxyType(
    {
        NEW: {_q: "submitted (or rerun, or queued by a sweep or search)"},
        _q: {
            _r: "a worker claimed it (attempts + 1)",
            _x: "cancelled before it started",
        },
        _r: {
            _c: "cancel requested, or a search's pruner stopped it; its worker stops it",
            _ok: "the training finished",
            _fail: (
                "its own fault (invalid_data, model_load_failed, timeout, internal), or its attempts "
                "are spent, or its worker's disk or memory ran short past the hand-back limit"
            ),
            _q: (
                "retried after a cause outside the job (its lease expired, a device error …) while "
                "attempts remain; or handed back with no attempt spent (the worker's disk or memory "
                "ran short, its build cannot run the spec, the worker shut down or was preempted)"
            ),
        },
        _c: {
            _x: (
                "its worker stopped it; or the attempt failed, was handed back or lost its lease "
                "meanwhile (a cancel wins)"
            ),
            _ok: "the training finished before the stop took hold (the result is kept)",
        },
        _ok: {},
        _fail: {},
        _x: {},
    }
)


class IllegalTransition(GluejobsError):
    """A job was asked to make a status move its lifecycle does not have."""


def allowed(before: Source, to: JobStatus) -> bool:
    return to in TRANSITIONS[before]


def check_move(job_id: int | None, before: Source, to: JobStatus) -> None:
    """IllegalTransition unless `before → to` is in TRANSITIONS."""
    if not allowed(before, to):
        ways = ", ".join(TRANSITIONS[before]) or "none: it has finished"
        raise IllegalTransition(
            f"job {job_id} cannot move from {before} to {to} (the moves from {before}: {ways})"
        )
