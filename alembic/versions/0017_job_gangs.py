"""job_gangs and job_gang_members (issue 37): a job's attempt across several worker machines, its
rendezvous (rank 0's advertised address and reserved port) and each member's rank and heartbeat. New
tables only: a worker of the previous release never reads them (it claims no job of several machines,
which the API refuses until the whole path works). Additive.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07 04:45:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "job_gangs",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("job_id", BigId, nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("token", sa.String(length=32), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("address", sa.String(length=255), nullable=False),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("full_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_gangs_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_gangs")),
        sa.UniqueConstraint("job_id", name=op.f("uq_job_gangs_job_id")),
    )
    op.create_table(
        "job_gang_members",
        sa.Column("gang_id", BigId, nullable=False, autoincrement=False),
        sa.Column("rank", sa.Integer(), nullable=False, autoincrement=False),
        sa.Column("worker_id", sa.String(length=255), nullable=False),
        sa.Column("joined_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["gang_id"],
            ["job_gangs.id"],
            name=op.f("fk_job_gang_members_gang_id_job_gangs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("gang_id", "rank", name=op.f("pk_job_gang_members")),
        sa.UniqueConstraint("gang_id", "worker_id", name=op.f("uq_job_gang_members_gang_id_worker_id")),
    )


def downgrade() -> None:
    op.drop_table("job_gang_members")
    op.drop_table("job_gangs")
