"""searches: hyperparameter searches and their trials

A search's trials are ordinary jobs; search_trials names them with their parameters, what the pruner
was told and how they ended. Optuna's own storage tables are not used (shared/searches/__init__.py
says why).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 08:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
# JSON, not JSONB, on Postgres too (as 0009 made every other column): json keeps its keys' order.
Json = sa.JSON()
UTC = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "searches",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("spec", Json, nullable=False),
        sa.Column("space", Json, nullable=False),
        sa.Column("objective", Json, nullable=False),
        sa.Column("n_trials", sa.Integer(), nullable=False),
        sa.Column("parallelism", sa.Integer(), nullable=False),
        sa.Column("sampler", Json, nullable=False),
        sa.Column("pruner", Json, nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("metadata", Json, nullable=False),
        sa.Column("created_at", UTC, nullable=False),
        sa.Column("finished_at", UTC, nullable=True),
        sa.Column("cancel_requested_at", UTC, nullable=True),
        sa.Column("driver_id", sa.String(length=255), nullable=True),
        sa.Column("driver_lease_until", UTC, nullable=True),
        sa.Column("best_trial", sa.Integer(), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("rerun_seeds", Json, nullable=True),
        sa.Column("seeds_sweep_id", BigId, nullable=True),
        sa.ForeignKeyConstraint(
            ["seeds_sweep_id"],
            ["sweeps.id"],
            name=op.f("fk_searches_seeds_sweep_id_sweeps"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_searches")),
    )
    with op.batch_alter_table("searches", schema=None) as batch_op:
        batch_op.create_index("ix_searches_owner_id", ["owner", "id"], unique=False)
        batch_op.create_index("ix_searches_status", ["status"], unique=False)

    op.create_table(
        "search_trials",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("search_id", BigId, nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("job_id", BigId, nullable=True),
        sa.Column("params", Json, nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("intermediate", Json, nullable=False),
        sa.Column("system_attrs", Json, nullable=False),
        sa.Column("pruned", Json, nullable=True),
        sa.Column("created_at", UTC, nullable=False),
        sa.Column("finished_at", UTC, nullable=True),
        sa.ForeignKeyConstraint(
            ["search_id"],
            ["searches.id"],
            name=op.f("fk_search_trials_search_id_searches"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_search_trials_job_id_jobs"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_search_trials")),
        sa.UniqueConstraint("search_id", "number", name=op.f("uq_search_trials_search_id_number")),
    )
    with op.batch_alter_table("search_trials", schema=None) as batch_op:
        batch_op.create_index("ix_search_trials_job_id", ["job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("search_trials", schema=None) as batch_op:
        batch_op.drop_index("ix_search_trials_job_id")
    op.drop_table("search_trials")
    with op.batch_alter_table("searches", schema=None) as batch_op:
        batch_op.drop_index("ix_searches_status")
        batch_op.drop_index("ix_searches_owner_id")
    op.drop_table("searches")
