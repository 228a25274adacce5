"""registered models, and JSON columns that keep their keys' order on Postgres

POST /v1/models keeps a model folder's description here (its files in the store by sha256, its
manifest's sha256 as the model's hash); job_models records which job uses which model, so that a
model a queued or running job uses cannot be deleted.

Every JSONB column becomes json on Postgres: json keeps the text as written, so a spec comes back
in its field order and label counts in label order, as on SQLite. Rows written before keep the
order JSONB gave them. SQLite's JSON columns are unchanged.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
UTC = sa.DateTime(timezone=True)


def _json_columns(kind: type[sa.types.TypeEngine]) -> list[tuple[str, str]]:
    inspector = sa.inspect(op.get_bind())
    return [
        (table, column["name"])
        for table in inspector.get_table_names()
        for column in inspector.get_columns(table)
        if isinstance(column["type"], kind)
    ]


def _retype(kind: type[sa.types.TypeEngine], to: str) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, column in _json_columns(kind):
        op.execute(f'ALTER TABLE "{table}" ALTER COLUMN "{column}" TYPE {to} USING "{column}"::text::{to}')


def upgrade() -> None:
    _retype(postgresql.JSONB, "json")
    op.create_table(
        "models",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=True),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("model_type", sa.String(length=64), nullable=False),
        sa.Column("files", sa.JSON(), nullable=False),
        sa.Column("created_at", UTC, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_models")),
        sa.UniqueConstraint("owner", "name", name=op.f("uq_models_owner_name")),
    )
    with op.batch_alter_table("models", schema=None) as batch_op:
        batch_op.create_index("ix_models_owner_id", ["owner", "id"], unique=False)
        batch_op.create_index("ix_models_sha256", ["sha256"], unique=False)
    op.create_table(
        "job_models",
        sa.Column("job_id", BigId, nullable=False),
        sa.Column("model_id", BigId, nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_models_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["model_id"], ["models.id"], name=op.f("fk_job_models_model_id_models"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_job_models")),
    )
    with op.batch_alter_table("job_models", schema=None) as batch_op:
        batch_op.create_index("ix_job_models_model_id", ["model_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job_models", schema=None) as batch_op:
        batch_op.drop_index("ix_job_models_model_id")
    op.drop_table("job_models")
    with op.batch_alter_table("models", schema=None) as batch_op:
        batch_op.drop_index("ix_models_sha256")
        batch_op.drop_index("ix_models_owner_id")
    op.drop_table("models")
    _retype(sa.JSON, "jsonb")
