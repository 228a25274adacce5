"""fleet, sweeps, idempotency, reproducibility

Jobs gain what fleets, retries, sweeps and reruns need; metric rows and events record the attempt
that wrote them; workers list their devices, version and state (their jobs are the jobs that
name them); sweeps and idempotency keys get tables of their own.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 11:02:44.524872
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0002'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')
Json = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql')
UTC = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table('sweeps',
    sa.Column('id', BigId, autoincrement=True, nullable=False),
    sa.Column('owner', sa.String(length=64), nullable=True),
    sa.Column('spec', Json, nullable=False),
    sa.Column('seeds', Json, nullable=False),
    sa.Column('grid', Json, nullable=False),
    sa.Column('metadata', Json, nullable=False),
    sa.Column('created_at', UTC, nullable=False),
    sa.Column('cancel_requested_at', UTC, nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_sweeps'))
    )
    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.create_index('ix_sweeps_owner_id', ['owner', 'id'], unique=False)

    op.create_table('idempotency_keys',
    sa.Column('id', BigId, autoincrement=True, nullable=False),
    sa.Column('owner', sa.String(length=64), nullable=False),
    sa.Column('key', sa.String(length=255), nullable=False),
    sa.Column('request_hash', sa.String(length=64), nullable=False),
    sa.Column('job_id', BigId, nullable=False),
    sa.Column('created_at', UTC, nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_idempotency_keys_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_idempotency_keys')),
    sa.UniqueConstraint('owner', 'key', name=op.f('uq_idempotency_keys_owner_key'))
    )
    with op.batch_alter_table('idempotency_keys', schema=None) as batch_op:
        batch_op.create_index('ix_idempotency_keys_created_at', ['created_at'], unique=False)

    with op.batch_alter_table('job_events', schema=None) as batch_op:
        batch_op.add_column(sa.Column('attempt', sa.Integer(), nullable=True))

    with op.batch_alter_table('job_metrics', schema=None) as batch_op:
        batch_op.add_column(sa.Column('attempt', sa.Integer(), nullable=True))

    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('error_code', sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column('not_before', UTC, nullable=True))
        batch_op.add_column(sa.Column('num_processes', sa.Integer(), server_default='1', nullable=False))
        batch_op.add_column(sa.Column('devices', Json, nullable=True))
        batch_op.add_column(sa.Column('sweep_id', BigId, nullable=True))
        batch_op.add_column(sa.Column('rerun_of', BigId, nullable=True))
        batch_op.add_column(sa.Column('environment', Json, nullable=True))
        batch_op.create_index('ix_jobs_sweep_id', ['sweep_id'], unique=False)
        batch_op.create_index('ix_jobs_worker_id', ['worker_id'], unique=False)
        batch_op.create_foreign_key(batch_op.f('fk_jobs_rerun_of_jobs'), 'jobs', ['rerun_of'], ['id'], ondelete='SET NULL')
        batch_op.create_foreign_key(batch_op.f('fk_jobs_sweep_id_sweeps'), 'sweeps', ['sweep_id'], ['id'], ondelete='SET NULL')
    # Jobs queued before this revision need as many devices as their spec asks for.
    if op.get_bind().dialect.name == 'postgresql':
        op.execute("UPDATE jobs SET num_processes = COALESCE((spec->>'num_processes')::int, 1)")
    else:
        op.execute("UPDATE jobs SET num_processes = COALESCE(json_extract(spec, '$.num_processes'), 1)")

    # The workers table is a registry of live processes: old rows carry nothing worth converting.
    op.execute('DELETE FROM workers')
    with op.batch_alter_table('workers', schema=None) as batch_op:
        batch_op.add_column(sa.Column('host', sa.String(length=255), nullable=False))
        batch_op.add_column(sa.Column('version', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('devices', Json, nullable=False))
        batch_op.add_column(sa.Column('state', sa.String(length=16), nullable=False))
        batch_op.add_column(sa.Column('last_heartbeat_at', UTC, nullable=False))
        batch_op.drop_column('heartbeat_at')
        batch_op.drop_column('current_job_id')
        batch_op.drop_column('hostname')


def downgrade() -> None:
    op.execute('DELETE FROM workers')
    with op.batch_alter_table('workers', schema=None) as batch_op:
        batch_op.add_column(sa.Column('hostname', sa.String(length=255), nullable=False))
        batch_op.add_column(sa.Column('current_job_id', BigId, nullable=True))
        batch_op.add_column(sa.Column('heartbeat_at', UTC, nullable=False))
        batch_op.drop_column('last_heartbeat_at')
        batch_op.drop_column('state')
        batch_op.drop_column('devices')
        batch_op.drop_column('version')
        batch_op.drop_column('host')

    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('fk_jobs_sweep_id_sweeps'), type_='foreignkey')
        batch_op.drop_constraint(batch_op.f('fk_jobs_rerun_of_jobs'), type_='foreignkey')
        batch_op.drop_index('ix_jobs_worker_id')
        batch_op.drop_index('ix_jobs_sweep_id')
        batch_op.drop_column('environment')
        batch_op.drop_column('rerun_of')
        batch_op.drop_column('sweep_id')
        batch_op.drop_column('devices')
        batch_op.drop_column('num_processes')
        batch_op.drop_column('not_before')
        batch_op.drop_column('error_code')

    with op.batch_alter_table('job_metrics', schema=None) as batch_op:
        batch_op.drop_column('attempt')

    with op.batch_alter_table('job_events', schema=None) as batch_op:
        batch_op.drop_column('attempt')

    with op.batch_alter_table('idempotency_keys', schema=None) as batch_op:
        batch_op.drop_index('ix_idempotency_keys_created_at')
    op.drop_table('idempotency_keys')
    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.drop_index('ix_sweeps_owner_id')
    op.drop_table('sweeps')
