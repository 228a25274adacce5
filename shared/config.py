"""Settings, read once from the environment (prefix GLUEJOBS_) by both the API and the workers."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

DEFAULT_VAR_DIR = Path("var")


def _split_keys(value: object) -> object:
    """Accept keys as a comma-separated string (how they arrive from the environment)."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


KeyList = Annotated[list[str], NoDecode]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GLUEJOBS_", extra="ignore")

    database_url: str = Field(
        default=f"sqlite:///{DEFAULT_VAR_DIR / 'gluejobs.db'}",
        description="SQLAlchemy URL: sqlite:///path (embedded) or postgresql+psycopg://user@host/db",
    )
    artifacts_dir: Path = Field(default=DEFAULT_VAR_DIR / "artifacts", description="Job outputs go here")
    data_dir: Path = Field(
        default=DEFAULT_VAR_DIR / "data", description="train_file/validation_file/test_file resolve here"
    )
    glue_dir: Path | None = Field(
        default=None, description="A local GLUE copy in the original release layout (SST-2/train.tsv …)"
    )
    models_dir: Path = Field(default=DEFAULT_VAR_DIR / "models", description="Local model folders")
    cache_dir: Path = Field(default=DEFAULT_VAR_DIR / "cache", description="Tokenised-dataset cache")

    lease_s: float = Field(default=60.0, gt=0, description="A running job's lease; renewed by heartbeats")
    heartbeat_s: float = Field(default=5.0, gt=0, description="How often a worker renews its lease")
    poll_interval_s: float = Field(default=2.0, gt=0, description="How often an idle worker looks for work")
    cancel_grace_s: float = Field(default=10.0, ge=0, description="SIGTERM→SIGKILL grace for a job's child")

    api_keys: KeyList = Field(default_factory=list, description="Bearer keys, or sha256:<hex> digests")
    admin_keys: KeyList = Field(default_factory=list, description="Keys that see and cancel every job")
    max_request_bytes: int = Field(default=1_048_576, gt=0, description="Larger request bodies get 413")
    check_data_on_submit: bool = Field(
        default=True,
        description="Read a job's data at submission and refuse (422) what would fail it on a worker; turn "
        "off for an API that cannot see GLUEJOBS_DATA_DIR/GLUEJOBS_GLUE_DIR (the dry run still reads them)",
    )

    @field_validator("api_keys", "admin_keys", mode="before")
    @classmethod
    def _parse_keys(cls, value: object) -> object:
        return _split_keys(value)

    @model_validator(mode="after")
    def _heartbeat_below_lease(self) -> Settings:
        if self.heartbeat_s >= self.lease_s:
            raise ValueError(
                f"GLUEJOBS_HEARTBEAT_S ({self.heartbeat_s}) must be shorter than GLUEJOBS_LEASE_S "
                f"({self.lease_s}), or every lease would expire between two heartbeats"
            )
        return self

    @property
    def auth_enabled(self) -> bool:
        return bool(self.api_keys or self.admin_keys)

    @property
    def api_key_digests(self) -> frozenset[str]:
        return frozenset(key_digest(k) for k in self.api_keys)

    @property
    def admin_key_digests(self) -> frozenset[str]:
        return frozenset(key_digest(k) for k in self.admin_keys)


def key_digest(key: str) -> str:
    """The sha256 hex digest of a key; a configured `sha256:<hex>` entry is already one."""
    if key.startswith("sha256:"):
        return key.removeprefix("sha256:").lower()
    return hashlib.sha256(key.encode()).hexdigest()


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
