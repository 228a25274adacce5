"""Webhooks: owners' endpoints, the events written for them in the transaction of the change that
causes them, and what the API's dispatcher needs to send them (Standard Webhooks signatures, the
outbound address rules).

Another part of gluejobs that wants to announce an event calls `enqueue_event` inside its own write
transaction (see events.py); a search marks its end with
`search_finished(session, owner=…, search_id=…, data={…})`.
"""

from shared.webhooks.events import checkpoint_declared, enqueue_event, job_finished, search_finished
from shared.wire.vocabulary import (
    CHECKPOINT_DECLARED,
    EVENT_TYPES,
    JOB_CANCELLED,
    JOB_FAILED,
    JOB_SUCCEEDED,
    SEARCH_FINISHED,
    SWEEP_FINISHED,
    TEST_EVENT,
)

__all__ = [
    "CHECKPOINT_DECLARED",
    "EVENT_TYPES",
    "JOB_CANCELLED",
    "JOB_FAILED",
    "JOB_SUCCEEDED",
    "SEARCH_FINISHED",
    "SWEEP_FINISHED",
    "TEST_EVENT",
    "checkpoint_declared",
    "enqueue_event",
    "job_finished",
    "search_finished",
]
