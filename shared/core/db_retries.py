"""Riding out a database that goes away: which errors are worth a retry, and how long to wait.

Workers and job processes use these so that a Postgres restart, a failover or SQLite's write lock
held past its busy timeout costs a pause, never a job or a process.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout


def is_transient(exc: BaseException) -> bool:
    """Whether `exc` says the database could not be reached or was busy (retry), rather than that a
    statement was wrong (a bug: retrying cannot help)."""
    if isinstance(exc, (OperationalError, InterfaceError, DisconnectionError, PoolTimeout)):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


# Postgres' deadlock and lock-not-available errors (SQLSTATE): the transaction was rolled back whole
# because it and another waited on each other's locks; running it again can succeed.
LOCK_CONFLICTS = frozenset({"40P01", "55P03"})


def is_lock_conflict(exc: BaseException) -> bool:
    """Whether `exc` is Postgres aborting the transaction for a lock conflict (SQLite's errors carry no
    SQLSTATE: never)."""
    return isinstance(exc, OperationalError) and getattr(exc.orig, "sqlstate", None) in LOCK_CONFLICTS


@dataclass
class Backoff:
    """Capped exponential backoff with full jitter (AWS's "full jitter"): many workers that lost the
    same database do not come back in lock-step."""

    base_s: float = 0.2
    cap_s: float = 10.0
    failures: int = 0
    _random: random.Random = field(default_factory=random.Random, repr=False)

    def next_delay(self) -> float:
        self.failures += 1
        ceiling = min(self.cap_s, self.base_s * 2 ** min(self.failures - 1, 30))
        return self._random.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.failures = 0


def retry_delay_s(attempt: int, *, base_s: float, cap_s: float) -> float:
    """How long a job that failed for a reason outside itself waits before attempt `attempt + 1`:
    base · 2^(attempt-1), capped."""
    return min(cap_s, base_s * 2 ** max(0, min(attempt - 1, 30)))
