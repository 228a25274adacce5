"""The gluejobs API: create_app(settings) mounts the routers; nothing here imports torch."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI, Request
from sqlalchemy import make_url
from sqlalchemy.exc import SQLAlchemyError

from service.accounts import api_keys
from service.accounts.auth import KeyRing, StoredKeysFlag
from service.background.search_driver import SearchDriverThread
from service.background.storage_sweep import StorageSweepThread
from service.background.stream_fanout import StreamFanout
from service.background.webhook_dispatcher import dispatching
from service.dry_run.slots import DryRunSlots
from service.edge import outage
from service.edge.disconnects import QuietDisconnects
from service.edge.guard import PROTECTED_PREFIX, RequestGuard
from service.edge.input_checks import reject_unstorable_values
from service.edge.origins import SAFE_METHODS, HostRules
from service.edge.rate_limits import RateLimits, StreamSlots
from service.errors import install_error_handlers
from service.files.check_runner import FileChecks
from service.files.stored_files import sweep_orphans
from service.openapi import document_error_responses
from service.prometheus import registry_for
from service.routes import (
    artifacts,
    dashboard,
    files,
    health,
    jobs,
    keys,
    leaderboard,
    models,
    owners,
    prometheus,
    searches,
    stream,
    submissions,
    sweeps,
    webhooks,
    workers,
)
from shared.core import release
from shared.core.config import Settings, get_settings
from shared.core.db import Database
from shared.core.owners import adopt_configured_owners
from shared.core.storage import Store, StoreUnavailable, open_store
from shared.core.tables import ApiKey
from shared.jobs_repo.model_objects import sweep_model_orphans

logger = logging.getLogger(__name__)

# A request waits this long for an unreachable store before it gets 503 (a worker waits longer).
API_STORE_RETRY_S = 10.0
# Postgres: the API's connections, all kept open. SQLAlchemy's default (5 kept, 10 more as needed)
# closed every connection above 5 as it came back, so 50 pollers made the API open a new
# connection (psycopg's connect and a server fork) for most polls: 30 connects for 51 polls in a
# profile of bench/api_polling.py. The same ceiling of 15 as before, none of them reopened.
API_POSTGRES_POOL = {"pool_size": 15, "max_overflow": 0}


def key_ring(settings: Settings, db: Database) -> KeyRing:
    """The configured keys (hashed once, here), the stored keys through the database; the rows of
    configured keys' owners moved to the names the configuration gives (shared/core/owners.py)."""

    def lookup(digest: str) -> ApiKey | None:
        with db.session() as session:
            return api_keys.find_live_key(session, digest)

    def any_keys() -> bool:
        with db.session() as session:
            return api_keys.any_stored_keys(session)

    ring = KeyRing.from_settings(settings, lookup, StoredKeysFlag(any_keys))
    try:
        with db.engine.begin() as connection:
            moved = adopt_configured_owners(connection, ring.configured.values())
    except SQLAlchemyError as exc:  # not migrated yet, or away: the next start adopts them
        logger.warning("could not move rows to the configured keys' owners (%s); the next start will", exc)
        return ring
    if moved:
        logger.info("moved %d row(s) to the owners the configured keys name", moved)
    return ring


def sweep_orphan_uploads(settings: Settings, db: Database, store: Store) -> None:
    """Uploaded bytes and registered models' objects that no row holds (an API that died between the
    two writes), and multipart uploads left open, leave the store; a store or database that is away
    leaves them to the next start."""
    try:
        store.once(lambda quick: sweep_orphans(db, quick, grace_s=settings.orphan_grace_s))
        store.once(lambda quick: sweep_model_orphans(db, quick, grace_s=settings.orphan_grace_s))
        # S3 multipart uploads a killed process left open (its parts stay stored, billed and unseen),
        # begun longer ago than the grace: a live one's parts go one at a time, far faster than that.
        store.once(lambda quick: quick.abort_uploads(older_than_s=settings.orphan_grace_s))
    except (StoreUnavailable, SQLAlchemyError, OSError) as exc:
        what = type(exc).__name__
        logger.warning("could not sweep the store's orphaned uploads (%s); the next start will", what)


def store_chores(settings: Settings, db: Database, store: Store, checked: threading.Event) -> None:
    """The start-up's store work: the bucket or folder made when missing (`checked` set then), then
    the sweep. Run beside the API, which waits for the first part at most STORE_CHECK_WAIT_S: listing
    a bucket takes as long as the bucket is big, and a store that is away held `gluejobs serve` for
    its whole retry window, while the API's readiness is about its database (a request that needs
    the store answers 503 meanwhile)."""
    try:
        store.check()
    except (StoreUnavailable, OSError) as exc:
        checked.set()
        logger.warning(
            "the store could not be reached at start (%s); the next start sweeps it", type(exc).__name__
        )
        return
    checked.set()
    sweep_orphan_uploads(settings, db, store)


# How long the API's start waits for the store's bucket (one request when it is there: a test server
# or a new MinIO starts empty, and the first upload needs it), and its shutdown for the sweep (a
# daemon thread: never longer).
STORE_CHECK_WAIT_S = 2.0
CHORES_JOIN_S = 5.0


_startup_frozen = False


def _freeze_startup_objects() -> None:
    """Once a process: what it holds when the API starts (modules, the app, its routes and schemas,
    about 200,000 objects) is moved out of the cyclic garbage collector's sight with gc.freeze,
    CPython's tool for this. A full collection walked them all, about 100 ms on a 2-core Xeon, every
    dozen seconds while streams were open, and held every stream's next row back that long: the
    slowest rows of bench/api_polling.py's streams came every 13 s (docs/benchmarks.md). What is
    allocated later is collected as before; refcounting still frees frozen objects that die, but a
    frozen object that later becomes part of a garbage cycle stays.

    Only where the API owns the process: uvicorn runs the lifespan in the main thread. An API
    embedded in another program (a test's server thread, TestClient's portal) leaves that
    program's heap alone."""
    global _startup_frozen
    if not _startup_frozen and threading.current_thread() is threading.main_thread():
        _startup_frozen = True
        gc.collect()  # today's garbage goes first: a frozen cycle would never be collected
        gc.freeze()


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """While the API serves: the webhook dispatcher sends due deliveries in the background, the
    search driver (GLUEJOBS_SEARCH_DRIVER) drives searches, handing them back when it stops, the
    storage sweep sizes and removes what jobs stored (GLUEJOBS_STORAGE_SWEEP_S), and the start-up's
    store work (store_chores) runs once beside the first requests."""
    _freeze_startup_objects()
    settings = app.state.settings
    checked = threading.Event()
    chores = threading.Thread(
        target=store_chores,
        args=(settings, app.state.db, app.state.store, checked),
        name="gluejobs-store-chores",
        daemon=True,
    )
    chores.start()
    await asyncio.to_thread(checked.wait, STORE_CHECK_WAIT_S)
    driver = SearchDriverThread(app.state.db, settings) if settings.search_driver else None
    if driver is not None:
        driver.start()
    storage = StorageSweepThread(app.state.db, app.state.store, settings)
    storage.start()
    try:
        async with dispatching(settings, app.state.db) as dispatcher:
            app.state.webhooks = dispatcher
            yield
    finally:
        if driver is not None:
            await asyncio.to_thread(driver.stop)
        await asyncio.to_thread(storage.stop)
        await asyncio.to_thread(chores.join, CHORES_JOIN_S)


async def forget_keys_after_changes(request: Request) -> AsyncIterator[None]:
    """On the /v1/keys routes: a key made, revoked or rotated here drops this process's key cache,
    so that the change holds on its next request (service/accounts/auth.py: other processes within 1 s).
    Its scope is the route function's, so the cache is dropped before the answer leaves: a client that
    reads the answer and sends the old key at once is refused (the default scope runs this afterwards)."""
    yield
    if request.method not in SAFE_METHODS:
        request.app.state.keys.forget_stored()


def api_pool(url: str) -> dict[str, int]:
    """The API engine's pool settings: API_POSTGRES_POOL on Postgres, SQLAlchemy's defaults else."""
    return API_POSTGRES_POOL if make_url(url).get_backend_name() == "postgresql" else {}


def create_app(
    settings: Settings | None = None, db: Database | None = None, *, host: str | None = None
) -> FastAPI:
    """The API; `host` is the address it is bound to (None: the default, loopback), whose names the
    Host check accepts."""
    settings = settings or get_settings()
    app = FastAPI(
        title="gluejobs",
        version=release.RELEASE,
        summary="Fine-tuning jobs for GLUE-style classification and regression, as a REST service",
        # /docs is served from service/static (routes/dashboard.py), not from a CDN; no ReDoc.
        docs_url=None,
        redoc_url=None,
        # On every route, before its own validation: values no database stores faithfully.
        dependencies=[Depends(reject_unstorable_values)],
        lifespan=_lifespan,
    )
    app.state.settings = settings
    app.state.db = db or Database(settings.database_url, **api_pool(settings.database_url))
    app.state.store = open_store(settings, retry_s=min(settings.storage_retry_s, API_STORE_RETRY_S))
    app.state.outage = outage.watch(app.state.db.engine)
    app.state.keys = key_ring(settings, app.state.db)
    app.state.dry_runs = DryRunSlots(settings.max_dry_runs)
    app.state.file_checks = FileChecks(settings)
    app.state.stream_slots = StreamSlots(app.state.db, settings.max_streams_per_key)
    app.state.webhooks = None  # the dispatcher, while the lifespan runs it
    app.state.stream_fanout = StreamFanout(app.state.db)
    install_error_handlers(app)
    app.add_middleware(
        RequestGuard,
        keys=app.state.keys,
        hosts=HostRules.for_server(settings, host),
        max_body_bytes=settings.max_request_bytes,
        body_timeout_s=settings.body_timeout_s,
        max_upload_bytes=settings.max_upload_bytes,
        max_model_bytes=settings.max_model_bytes,
        limits=RateLimits.from_settings(settings, app.state.db),
    )
    # Outside the guard and every route: a client gone mid-answer is not an error (edge/disconnects.py).
    app.add_middleware(QuietDisconnects)

    # First: a probe's route is matched before the others, and FastAPI builds a route's handling on
    # its first match (about 0.6 s of CPU over the /v1 routes), which a probe need not wait for.
    app.include_router(health.router)
    v1 = APIRouter(prefix=PROTECTED_PREFIX)
    v1.include_router(jobs.router)
    v1.include_router(stream.router)
    v1.include_router(artifacts.router)
    v1.include_router(files.router)
    v1.include_router(models.router)
    v1.include_router(models.promote_router)
    v1.include_router(sweeps.router)
    v1.include_router(searches.router)
    v1.include_router(leaderboard.router)
    v1.include_router(submissions.router)
    v1.include_router(workers.router)
    v1.include_router(keys.router, dependencies=[Depends(forget_keys_after_changes, scope="function")])
    v1.include_router(owners.router)
    v1.include_router(webhooks.router)
    app.include_router(v1)
    # An admin's scrape (the whole fleet); other keys' are made per scrape, for their owner.
    app.state.prometheus = registry_for(app.state.db, lease_s=settings.lease_s, per_job=True)
    app.include_router(prometheus.router)
    app.include_router(dashboard.router)
    dashboard.mount_static(app)
    document_error_responses(app)
    return app
