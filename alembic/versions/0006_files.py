"""uploaded files and the jobs that use them

POST /v1/files keeps a file's description here and its bytes in the store (files/<sha256>);
job_files records which spec field of which job names which file, so that a file a queued or
running job uses cannot be deleted.

Revision ID: 0006
Revises: 0004
Create Date: 2026-12-01 21:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0006'
down_revision: str | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')
Json = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql')
UTC = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table('files',
    sa.Column('id', BigId, autoincrement=True, nullable=False),
    sa.Column('owner', sa.String(length=64), nullable=True),
    sa.Column('filename', sa.String(length=255), nullable=False),
    sa.Column('format', sa.String(length=16), nullable=False),
    sa.Column('purpose', sa.String(length=16), nullable=False),
    sa.Column('task_name', sa.String(length=16), nullable=True),
    sa.Column('bytes', sa.BigInteger(), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('rows', sa.BigInteger(), nullable=False),
    sa.Column('columns', Json, nullable=False),
    sa.Column('checks', Json, nullable=False),
    sa.Column('created_at', UTC, nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_files'))
    )
    with op.batch_alter_table('files', schema=None) as batch_op:
        batch_op.create_index('ix_files_owner_id', ['owner', 'id'], unique=False)
        batch_op.create_index('ix_files_sha256', ['sha256'], unique=False)

    op.create_table('job_files',
    sa.Column('job_id', BigId, nullable=False),
    sa.Column('field', sa.String(length=32), nullable=False),
    sa.Column('file_id', BigId, nullable=False),
    sa.ForeignKeyConstraint(['file_id'], ['files.id'], name=op.f('fk_job_files_file_id_files'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_job_files_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('job_id', 'field', name=op.f('pk_job_files'))
    )
    with op.batch_alter_table('job_files', schema=None) as batch_op:
        batch_op.create_index('ix_job_files_file_id', ['file_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('job_files', schema=None) as batch_op:
        batch_op.drop_index('ix_job_files_file_id')
    op.drop_table('job_files')
    with op.batch_alter_table('files', schema=None) as batch_op:
        batch_op.drop_index('ix_files_sha256')
        batch_op.drop_index('ix_files_owner_id')
    op.drop_table('files')
