"""/v1/owners: the queue by owner (devices in use, queued jobs, device-hours, quota), and the admins'
change of an owner's share and quotas.

Admins (and everyone when auth is off) see every owner; any other key sees only its own owner.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path

from service.accounts.owner_views import list_owners, set_owner_quota
from service.deps import PrincipalDep, SessionDep, SettingsDep
from service.schemas.common import ErrorResponse
from service.schemas.owners import OwnerName, OwnerPublic, OwnersPublic, OwnerUpdate
from shared.scheduling.quotas import QuotaDefaults

router = APIRouter(prefix="/owners", tags=["owners"])


@router.get("", response_model=OwnersPublic)
def read_owners(session: SessionDep, settings: SettingsDep, principal: PrincipalDep) -> dict[str, Any]:
    """Each owner, by name: share, running jobs, devices in use, queued jobs, device-hours in the last
    24 hours, and the effective quota with where each limit comes from (the owner's own or the
    configured default)."""
    defaults = QuotaDefaults.from_settings(settings)
    if principal.owner_filter is None:
        return {"data": list_owners(session, defaults=defaults)}
    return {"data": list_owners(session, defaults=defaults, owner=principal.owner_filter)}


@router.patch("/{name}", response_model=OwnerPublic, responses={403: {"model": ErrorResponse}})
def update_owner(
    name: Annotated[OwnerName, Path(description="The owner's name")],
    body: OwnerUpdate,
    session: SessionDep,
    settings: SettingsDep,
    principal: PrincipalDep,
) -> Any:
    """Set an owner's share and quotas (admin keys only; 403 otherwise). A field given as null goes
    back to the configured default; one left out stays. An owner not seen yet is made. The change is
    in the audit log (action quota.set)."""
    principal.require_admin()
    changes = {field: getattr(body, field) for field in body.model_fields_set}
    return set_owner_quota(
        session,
        name=name,
        changes=changes,
        actor=principal.owner,
        actor_key_id=principal.key_id,
        defaults=QuotaDefaults.from_settings(settings),
    )
