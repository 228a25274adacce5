"""Request and response bodies of /v1/keys and /v1/audit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shared.core.owners import OWNER_NAME_SCHEMA, valid_owner_name
from shared.core.tables import ApiKey, AuditEntry, KeyRole, utcnow

# A key lives at most this long (and timedelta cannot overflow on the way).
MAX_EXPIRY_DAYS = 3650


class KeyCreate(BaseModel):
    """A key to make: its owner, role, label and optional expiry (a time, or days from now)."""

    model_config = ConfigDict(extra="forbid")

    owner: str = Field(
        description="The owner the key acts as (a person or team): letters, digits, `.`, `_`, `-`; "
        "not starting with `key-`",
        json_schema_extra={k: v for k, v in OWNER_NAME_SCHEMA.items() if k != "type"},
    )
    role: KeyRole = Field(KeyRole.user, description="user, admin or read-only")
    name: str | None = Field(
        None, min_length=1, max_length=64, description="A label to tell keys apart; default `<owner>-key`"
    )
    expires_at: datetime | None = Field(None, description="When it stops working (ISO 8601, in the future)")
    expires_in_days: float | None = Field(
        None, gt=0, le=MAX_EXPIRY_DAYS, description="Or: how many days from now it stops working"
    )

    @field_validator("owner")
    @classmethod
    def _owner_name(cls, owner: str) -> str:
        return valid_owner_name(owner, new=True)

    @field_validator("expires_at")
    @classmethod
    def _in_the_future(cls, when: datetime | None) -> datetime | None:
        if when is None:
            return None
        when = when if when.tzinfo else when.replace(tzinfo=UTC)  # a time without a zone is UTC
        try:
            # Stored in UTC: a time near the end of year 9999 in a zone west of it has no UTC time.
            when = when.astimezone(UTC)
        except OverflowError:
            raise ValueError(f"the expiry must be within {MAX_EXPIRY_DAYS} days from now") from None
        if when <= utcnow():
            raise ValueError("the expiry must be in the future")
        if when > utcnow() + timedelta(days=MAX_EXPIRY_DAYS):
            raise ValueError(f"the expiry must be within {MAX_EXPIRY_DAYS} days from now")
        return when

    @model_validator(mode="after")
    def _one_expiry(self) -> KeyCreate:
        if self.expires_at is not None and self.expires_in_days is not None:
            raise ValueError("give expires_at or expires_in_days, not both")
        return self

    def expiry(self) -> datetime | None:
        if self.expires_in_days is not None:
            return utcnow() + timedelta(days=self.expires_in_days)
        return self.expires_at

    @property
    def label(self) -> str:
        return self.name or f"{self.owner}-key"


class KeyPublic(BaseModel):
    """A stored key as lists show it: never its secret, nor the secret's digest."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    owner: str
    role: str = Field(description="user, admin or read-only")
    prefix: str = Field(description="The secret's first characters, to tell keys apart")
    created_at: datetime
    created_by: str | None = Field(description="The owner whose admin key made it")
    last_used_at: datetime | None = Field(description="To the minute: a key's use is written once a minute")
    expires_at: datetime | None
    revoked_at: datetime | None
    rotated_from: int | None = Field(description="The key this one replaced")


class KeyCreated(KeyPublic):
    """A key just made: the only answer that holds its secret."""

    secret: str = Field(description="The key itself: shown once, here, and stored only as a hash")

    @classmethod
    def of(cls, key: ApiKey, secret: str) -> KeyCreated:
        return cls.model_validate({**KeyPublic.model_validate(key).model_dump(), "secret": secret})


class KeyList(BaseModel):
    data: list[KeyPublic]


class AuditEntryPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    created_at: datetime
    actor: str | None = Field(description="The owner whose key acted (null: no auth, or the operator)")
    actor_key_id: int | None = Field(description="The stored key that acted (null: a configured key)")
    action: str = Field(description="key.create, key.rotate, key.revoke, quota.set …")
    target: str = Field(description="What it acted on: `key 12`, `owner alice` …")
    data: dict[str, Any]

    @classmethod
    def of(cls, entry: AuditEntry) -> AuditEntryPublic:
        return cls.model_validate(entry)
