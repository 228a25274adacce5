"""what an owner holds in the store (issue 33 item 5): the bytes of each declared checkpoint
(checkpoint_sizes) and of each finished job's other files (job_output_sizes), written by the API's
storage sweep; an owner's own storage quota (owner_storage_quotas); and store_deletions, the store
folders whose rows are gone and whose removal is not finished yet (a crash between the two leaves
them to the sweep). New tables only: builds without them go on, on either schema.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07 04:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "checkpoint_sizes",
        sa.Column("checkpoint_id", BigId, nullable=False, autoincrement=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["checkpoint_id"],
            ["checkpoints.id"],
            name=op.f("fk_checkpoint_sizes_checkpoint_id_checkpoints"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("checkpoint_id", name=op.f("pk_checkpoint_sizes")),
    )
    op.create_table(
        "job_output_sizes",
        sa.Column("job_id", BigId, nullable=False, autoincrement=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_output_sizes_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_job_output_sizes")),
    )
    op.create_table(
        "owner_storage_quotas",
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("max_storage_bytes", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("owner", name=op.f("pk_owner_storage_quotas")),
    )
    op.create_table(
        "store_deletions",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("key", sa.String(length=1024), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_store_deletions")),
    )


def downgrade() -> None:
    op.drop_table("store_deletions")
    op.drop_table("owner_storage_quotas")
    op.drop_table("job_output_sizes")
    op.drop_table("checkpoint_sizes")
