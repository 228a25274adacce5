"""claim indexes: jobs.reserved_by (every claim looks up its worker's reservation), and the queue's
index in the claim's order (priority DESC, id) so that a claim reads one row, not a sort

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02 09:15:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_jobs_reserved_by", "jobs", ["reserved_by"])
    op.drop_index("ix_jobs_status_priority_id", table_name="jobs")
    op.create_index("ix_jobs_status_priority_id", "jobs", ["status", sa.text("priority DESC"), "id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_status_priority_id", table_name="jobs")
    op.create_index("ix_jobs_status_priority_id", "jobs", ["status", "priority", "id"])
    op.drop_index("ix_jobs_reserved_by", table_name="jobs")
