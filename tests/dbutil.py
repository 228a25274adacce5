"""Reading the database directly in tests, to check what the code stored (or did not)."""

from __future__ import annotations

from sqlalchemy import func, select

from shared.db import Database
from shared.models import Base


def count_rows(db: Database, model: type[Base]) -> int:
    with db.engine.connect() as connection:
        return int(connection.scalar(select(func.count()).select_from(model)) or 0)
