"""owners, stored keys, quotas, reservations, rate limits

Jobs, sweeps, files and idempotency keys move from their key's digest to an owner's name (the
configured `name=<key>`, else key-<12 hex digits>); keys made over the API are stored as hashes;
owners get a fair-share weight and quotas; a wide job can reserve a worker; rate limits and open
streams are counted in the database so that every API process applies the same limits.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 01:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from shared.core.config import Settings
from shared.core.owners import adopt_configured_owners, configured_keys, name_digest_owners

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
UTC = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("created_at", UTC, nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=True),
        sa.Column("last_used_at", UTC, nullable=True),
        sa.Column("expires_at", UTC, nullable=True),
        sa.Column("revoked_at", UTC, nullable=True),
        sa.Column("rotated_from", BigId, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("digest", name=op.f("uq_api_keys_digest")),
    )
    op.create_index("ix_api_keys_owner", "api_keys", ["owner"], unique=False)
    op.create_table(
        "rate_windows",
        sa.Column("bucket", sa.String(length=96), nullable=False),
        sa.Column("window", sa.BigInteger(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("bucket", "window", name=op.f("pk_rate_windows")),
    )
    op.create_table(
        "open_streams",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("bucket", sa.String(length=96), nullable=False),
        sa.Column("job_id", BigId, nullable=False),
        sa.Column("opened_at", UTC, nullable=False),
        sa.Column("seen_at", UTC, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_open_streams")),
    )
    op.create_index("ix_open_streams_bucket", "open_streams", ["bucket"], unique=False)
    with op.batch_alter_table("owners", schema=None) as batch_op:
        batch_op.add_column(sa.Column("share", sa.Float(), server_default="1", nullable=False))
        batch_op.add_column(sa.Column("max_devices", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("max_queued", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("max_device_hours_per_day", sa.Float(), nullable=True))
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("reserved_by", sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column("reserved_at", UTC, nullable=True))
    # Each key's rows go to the owner the configuration names now; the rest to key-<12 hex>.
    connection = op.get_bind()
    try:
        keys = configured_keys(Settings())
    except ValueError:  # a configuration the API would refuse: its start names the owners instead
        keys = []
    adopt_configured_owners(connection, keys)
    name_digest_owners(connection)


def downgrade() -> None:
    # Owners' names stay in the owner columns: a downgraded API matches them to no key digest, so
    # only admin keys see those rows until the upgrade is run again.
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("reserved_at")
        batch_op.drop_column("reserved_by")
    with op.batch_alter_table("owners", schema=None) as batch_op:
        batch_op.drop_column("max_device_hours_per_day")
        batch_op.drop_column("max_queued")
        batch_op.drop_column("max_devices")
        batch_op.drop_column("share")
    op.drop_index("ix_open_streams_bucket", table_name="open_streams")
    op.drop_table("open_streams")
    op.drop_table("rate_windows")
    op.drop_index("ix_api_keys_owner", table_name="api_keys")
    op.drop_table("api_keys")
