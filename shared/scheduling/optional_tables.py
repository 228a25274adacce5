"""Whether the database has a table that a later migration added (a fleet mid-upgrade runs this build
on the previous schema until `migrate`): the claim does without such a table rather than fail.

Known for good once found; a miss is asked again after RECHECK_S, so a fleet picks the table up
within that much of the migration without asking on every claim.
"""

from __future__ import annotations

import time

from sqlalchemy import inspect
from sqlalchemy.orm import Session

RECHECK_S = 30.0
_missed: dict[tuple[str, str], float] = {}  # (database URL, table) → when it was last missing; inf: found


def has_table(session: Session, table: str) -> bool:
    """Whether the session's database has `table` (asked of the engine when the session has not
    begun: the one-statement claim's session has no autobegin)."""
    key = (str(session.get_bind().engine.url), table)
    missed = _missed.get(key)
    if missed == float("inf"):
        return True
    now = time.monotonic()
    if missed is not None and now - missed < RECHECK_S:
        return False
    where = session.connection() if session.in_transaction() else session.get_bind()
    found = inspect(where).has_table(table)
    _missed[key] = float("inf") if found else now
    return found
