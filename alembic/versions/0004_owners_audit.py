"""owners and the audit log

Owners (a person or a team) are what jobs, sweeps, files and keys belong to; the audit log records
changes made outside a job's own life (keys, quotas, shares). Keys, quotas and fair share (a team's
shared fleet) build on these two tables.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 18:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0004'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')
Json = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql')
UTC = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table('owners',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('created_at', UTC, nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_owners'))
    )
    op.create_table('audit_log',
    sa.Column('id', BigId, autoincrement=True, nullable=False),
    sa.Column('created_at', UTC, nullable=False),
    sa.Column('actor', sa.String(length=64), nullable=True),
    sa.Column('actor_key_id', BigId, nullable=True),
    sa.Column('action', sa.String(length=64), nullable=False),
    sa.Column('target', sa.String(length=255), nullable=False),
    sa.Column('data', Json, nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_audit_log'))
    )
    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.create_index('ix_audit_log_created_at', ['created_at'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.drop_index('ix_audit_log_created_at')
    op.drop_table('audit_log')
    op.drop_table('owners')
