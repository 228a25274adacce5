"""resource hand-backs: jobs.resource_handbacks (attempts handed back because the worker ran out of
disk or memory, which spend none of the job's attempts but are bounded) and workers.disk_free_bytes
(what GET /v1/workers shows of a worker's disk). Both additive: a release before this one neither
reads nor writes them.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-08 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("resource_handbacks", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("workers", sa.Column("disk_free_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("disk_free_bytes")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("resource_handbacks")
