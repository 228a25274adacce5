"""which releases may work on the database

One row, written by `gluejobs migrate`: the schema revision, the oldest release whose API and workers
may work on it, and the release that migrated it (shared/core/release.py). Additive: the API and workers of
0.1.0 go on working on it, but they never read it (docs/upgrading.md).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gluejobs_release",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("schema_revision", sa.String(length=32), nullable=False),
        sa.Column("min_release", sa.String(length=32), nullable=False),
        sa.Column("migrated_by", sa.String(length=32), nullable=False),
        sa.Column("migrated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )


def downgrade() -> None:
    op.drop_table("gluejobs_release")
