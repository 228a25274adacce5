"""The words the API, the workers, the client and the dashboard must spell alike: a job's statuses,
the webhook event types, and the fields that map a file's columns.

shared/core/tables.py stores JobStatus (the legal moves between statuses are
shared/core/lifecycle.py's table); the client reads these sets (gluejobs/_types.py, _files.py,
cli/webhooks.py) and the dashboard gets STATUSES and TERMINAL from GET /wire.js, written from here
(service/routes/dashboard.py). Standard library only: the client wheel carries it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class JobStatus(StrEnum):
    queued = "queued"
    running = "running"
    cancelling = "cancelling"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES


# Finished: nothing moves a job out of these (a rerun is a new job).
TERMINAL_STATUSES: Final = frozenset({JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled})

# Webhook events: what an endpoint can subscribe to (POST /v1/webhooks `event_types`);
# shared/webhooks/events.py records them, `gluejobs webhooks add --event` offers them.
JOB_SUCCEEDED: Final = "job.succeeded"
JOB_FAILED: Final = "job.failed"
JOB_CANCELLED: Final = "job.cancelled"
SWEEP_FINISHED: Final = "sweep.finished"
SEARCH_FINISHED: Final = "search.finished"
CHECKPOINT_DECLARED: Final = "checkpoint.declared"
EVENT_TYPES: Final = (
    JOB_SUCCEEDED,
    JOB_FAILED,
    JOB_CANCELLED,
    SWEEP_FINISHED,
    SEARCH_FINISHED,
    CHECKPOINT_DECLARED,
)
# What `gluejobs webhooks add` subscribes an endpoint to when given no --event.
JOB_EVENTS: Final = (JOB_SUCCEEDED, JOB_FAILED, JOB_CANCELLED)
# POST /v1/webhooks/{id}/test sends this to the one endpoint, whatever it subscribes to.
TEST_EVENT: Final = "webhook.test"

# A job spec's and an upload's column mapping (shared/jobspec/column_mapping.py reads them).
COLUMN_FIELDS: Final = ("text_column", "text_pair_column", "label_column")
