"""Routes that take a job spec answer every problem it has at once, even when its fields are refused.

FastAPI validates a body before the route runs, so a spec with a typo in one flag is refused without
its data ever being read: the missing validation_file and the bad label in the train_file would
come one refusal at a time. `SpecCheckedRoute` (the route class of the routers whose bodies hold a
`spec`) catches that refusal, salvages what it can of the spec (service/edge/spec_salvage.py) and runs
the checks a job's spec goes through on it (shared/admission/job_checks.spec_problems: files, model, data),
adding what they find to the refusal: the spec's problems first, then the data's.

This is FastAPI's documented way to act on a request's validation error (a custom APIRoute whose
route handler catches RequestValidationError); the answer itself is still written by the one
handler in service/errors.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from service.accounts.auth import Principal
from service.deps import get_data_scope
from service.edge.spec_salvage import refused_keys, salvage
from shared.admission.job_checks import spec_problems
from shared.core.errors import GluejobsError, Problem

logger = logging.getLogger(__name__)

SPEC = "spec"
_TRUE = ("1", "true", "yes", "on")


class SpecCheckedRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def handle_checked(request: Request) -> Response:
            try:
                return await handle(request)
            except RequestValidationError as exc:
                more = await anyio.to_thread.run_sync(_more_problems, request, exc)
                if not more:
                    raise
                raise RequestValidationError([*exc.errors(), *more], body=exc.body) from exc

        return handle_checked


def _more_problems(request: Request, exc: RequestValidationError) -> list[dict[str, Any]]:
    """What the checks find in the salvaged spec, as pydantic-shaped errors located in the body."""
    body = exc.body
    if not isinstance(body, dict) or not isinstance(body.get(SPEC), dict):
        return []
    locations = [tuple(e.get("loc") or ()) for e in exc.errors()]
    in_spec = [loc[2:] for loc in locations if loc[:2] == ("body", SPEC)]
    refused = refused_keys(in_spec)
    if refused is None:
        return []  # the spec refused as a whole (not an object …): nothing to salvage
    salvaged = salvage(body[SPEC], refused)
    if salvaged is None:
        return []
    app = request.app
    settings = app.state.settings
    principal: Principal | None = getattr(request.state, "principal", None)
    try:
        if principal is None:
            principal = app.state.keys.principal(request.headers.get("authorization"))
        with app.state.db.session() as session:
            # Only to word the refusal: nothing is stored, so a job:N model it names is not pinned.
            scope = get_data_scope(settings, principal, session, app.state.store).without_pins()
            dry_run = request.query_params.get("dry_run", "").lower() in _TRUE
            read_data = settings.check_data_on_submit or dry_run  # a dry run always reads its data
            found = spec_problems(
                salvaged.spec, settings, scope=scope, skip=salvaged.dropped, read_data=read_data
            )
    except GluejobsError as exc:  # a check that could not run (the store away …): the refusal stands as is
        logger.warning("the salvaged spec's checks did not run: %s", type(exc).__name__)
        return []
    return [_as_error(problem) for problem in found]


def _as_error(problem: Problem) -> dict[str, Any]:
    loc = ("body", SPEC, *problem.field.split("."))
    return {"type": problem.code, "loc": loc, "msg": problem.message, "input": None}
