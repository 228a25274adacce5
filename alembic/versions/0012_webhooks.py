"""webhooks: owners' endpoints and the deliveries the API sends them

An endpoint's deliveries are written in the transaction of the change that causes them (a job's end,
a checkpoint, a sweep's end), and sent by the API's dispatcher with retries until they succeed.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
# JSON, not JSONB, on Postgres too (as 0009 made every other column): json keeps its keys' order.
Json = sa.JSON()
UTC = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "webhook_endpoints",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=True),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("event_types", Json, nullable=False),
        sa.Column("description", sa.String(length=255), nullable=True),
        sa.Column("secret", sa.String(length=128), nullable=False),
        sa.Column("disabled", sa.Boolean(), nullable=False),
        sa.Column("created_at", UTC, nullable=False),
        sa.Column("updated_at", UTC, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_endpoints")),
    )
    op.create_index("ix_webhook_endpoints_owner_id", "webhook_endpoints", ["owner", "id"], unique=False)
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("endpoint_id", BigId, nullable=False),
        sa.Column("message_id", sa.String(length=64), nullable=False),
        sa.Column("event_type", sa.String(length=32), nullable=False),
        sa.Column("event_key", sa.String(length=128), nullable=False),
        sa.Column("payload", Json, nullable=False),
        sa.Column(
            "status",
            sa.Enum("pending", "delivered", "failed", name="delivery_status", native_enum=False, length=16),
            nullable=False,
        ),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("attempt_log", Json, nullable=False),
        sa.Column("next_attempt_at", UTC, nullable=False),
        sa.Column("lease_token", sa.String(length=32), nullable=True),
        sa.Column("lease_expires_at", UTC, nullable=True),
        sa.Column("created_at", UTC, nullable=False),
        sa.Column("finished_at", UTC, nullable=True),
        sa.ForeignKeyConstraint(
            ["endpoint_id"],
            ["webhook_endpoints.id"],
            name=op.f("fk_webhook_deliveries_endpoint_id_webhook_endpoints"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_deliveries")),
        sa.UniqueConstraint(
            "endpoint_id", "event_key", name=op.f("uq_webhook_deliveries_endpoint_id_event_key")
        ),
    )
    op.create_index(
        "ix_webhook_deliveries_endpoint_id_id", "webhook_deliveries", ["endpoint_id", "id"], unique=False
    )
    op.create_index(
        "ix_webhook_deliveries_status_next_attempt_at",
        "webhook_deliveries",
        ["status", "next_attempt_at"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_webhook_deliveries_status_next_attempt_at", table_name="webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_endpoint_id_id", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_index("ix_webhook_endpoints_owner_id", table_name="webhook_endpoints")
    op.drop_table("webhook_endpoints")
