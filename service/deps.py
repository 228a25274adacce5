"""Route dependencies as Annotated aliases, so a route's signature says what it needs."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from shared import jobs_repo
from shared.config import Settings, key_digest
from shared.db import Database
from shared.errors import Unauthorized
from shared.models import Job, Sweep


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_database(request: Request) -> Database:
    db: Database = request.app.state.db
    return db


def get_session(db: Annotated[Database, Depends(get_database)]) -> Iterator[Session]:
    with db.session() as session:
        yield session


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]

_bearer = HTTPBearer(auto_error=False, description="An API key from GLUEJOBS_API_KEYS or GLUEJOBS_ADMIN_KEYS")


@dataclass(frozen=True)
class Principal:
    """Who is calling. `owner` is the digest of their key; None when auth is off."""

    owner: str | None
    is_admin: bool

    @property
    def owner_filter(self) -> str | None:
        """The owner a query must match: admins (and everyone when auth is off) see every job."""
        return None if self.is_admin else self.owner


def get_principal(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    if not settings.auth_enabled:
        return Principal(owner=None, is_admin=True)
    if credentials is None or not credentials.credentials:
        raise Unauthorized()
    digest = key_digest(credentials.credentials)
    if digest in settings.admin_key_digests:
        return Principal(owner=digest, is_admin=True)
    if digest in settings.api_key_digests:
        return Principal(owner=digest, is_admin=False)
    raise Unauthorized("the API key is not valid")


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def get_job(
    job_id: Annotated[int, Path(ge=1, description="The job's id")],
    session: SessionDep,
    principal: PrincipalDep,
) -> Job:
    """The job, or a 404 (also for another key's job: its existence is not revealed)."""
    return jobs_repo.get_job(session, job_id=job_id, owner=principal.owner_filter)


JobDep = Annotated[Job, Depends(get_job)]


def get_sweep(
    sweep_id: Annotated[int, Path(ge=1, description="The sweep's id")],
    session: SessionDep,
    principal: PrincipalDep,
) -> Sweep:
    """The sweep, or a 404 (also for another key's sweep)."""
    return jobs_repo.get_sweep(session, sweep_id=sweep_id, owner=principal.owner_filter)


SweepDep = Annotated[Sweep, Depends(get_sweep)]
