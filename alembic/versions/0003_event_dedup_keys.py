"""event dedup keys

A job's process queues its events and writes them from a background thread that retries: a write
that committed but whose acknowledgement was lost must not add a second row when it is retried.
Events written by a job's process carry a key unique per job ("<attempt>-<process token>-<sequence>"); the
insert skips a key the job already has (ON CONFLICT DO NOTHING on both databases). Metric rows
are unique by (job_id, split, name, step) since 0001; checkpoints by (job_id, step).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 14:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0003'
down_revision: str | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('job_events', schema=None) as batch_op:
        batch_op.add_column(sa.Column('dedup_key', sa.String(length=64), nullable=True))
        batch_op.create_unique_constraint(
            batch_op.f('uq_job_events_job_id_dedup_key'), ['job_id', 'dedup_key']
        )


def downgrade() -> None:
    with op.batch_alter_table('job_events', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('uq_job_events_job_id_dedup_key'), type_='unique')
        batch_op.drop_column('dedup_key')
