"""builds and migrations identified by content: the builds workers run (worker_builds: release, build
hash, commit, schema head, the spec fields each supports) and the content hash of every migration
the database has been through (gluejobs_release.migration_digests), so that a renumbered or edited
migration never reads as applied (shared/core/release.py). Additive: 0.2.0 builds without it go on.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07 12:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "worker_builds",
        sa.Column("build", sa.String(length=64), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("commit", sa.String(length=64), nullable=True),
        sa.Column("schema_head", sa.String(length=32), nullable=False),
        sa.Column("spec_fields", sa.JSON(), nullable=False),
        sa.Column("first_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("build"),
    )
    with op.batch_alter_table("gluejobs_release") as table:
        table.add_column(sa.Column("migration_digests", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gluejobs_release") as table:
        table.drop_column("migration_digests")
    op.drop_table("worker_builds")
