"""A fleet mid-upgrade fails safe (shared/core/release.py): the database records its schema revision and
the oldest release that may work on it; an API or a worker that does not fit refuses with one line;
a worker of the previous release finishes the job it runs while the database is migrated under it,
then stops claiming, and a worker of this release takes the queue on. Two releases' worth of schema:
the previous release's head (0008) and this one's."""

from __future__ import annotations

import fcntl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from gluejobs_server.stack import free_port, stop
from shared import jobs_repo
from shared.core import release
from shared.core.config import Settings
from shared.core.db import WRITE_OPTION, Database
from shared.core.migrate import upgrade
from tests.support.dbutil import downgrade
from tests.support.e2e import worker_env
from tests.support.kit import QUICK_JOB, REPO

# The schema of the release before this one (0.1.0), which predates the gluejobs_release row.
PREVIOUS_HEAD = "0008"
CLI = [sys.executable, "-m", "gluejobs.cli"]
# The previous release, as far as these checks see it: its version and its newest schema.
OLD_RELEASE = (
    "import sys\n"
    "from shared.core import release\n"
    "release.RELEASE = '0.1.0'\n"
    f"release.schema_head = lambda: {PREVIOUS_HEAD!r}\n"
    "from gluejobs.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def set_oldest_fitting(db: Database, version: str) -> None:
    """What a later release's `gluejobs migrate` writes when its schema leaves older releases behind."""
    with db.engine.begin() as connection:
        connection.execute(text("UPDATE gluejobs_release SET min_release = :v"), {"v": version})


def misfit(db: Database) -> str | None:
    with db.engine.connect() as connection:
        return release.misfit(connection)


def test_migrate_records_the_releases_that_fit_and_each_mismatch_has_its_line(db: Database) -> None:
    head = release.schema_head()
    with db.engine.connect() as connection:
        row = connection.execute(
            text("SELECT schema_revision, min_release, migrated_by FROM gluejobs_release")
        )
        assert row.one() == (head, release.OLDEST_FITTING_RELEASE, release.RELEASE)
    assert misfit(db) is None

    # A later release's migration that older releases must not work on.
    set_oldest_fitting(db, "9.0.0")
    assert misfit(db) == (
        f"the database (schema {head}) needs gluejobs 9.0.0 or newer, and this is gluejobs "
        f"{release.RELEASE}: upgrade it (pip install -U gluejobs-server==9.0.0 or newer)"
    )
    with pytest.raises(release.ReleaseMismatch, match=r"needs gluejobs 9\.0\.0 or newer"):
        upgrade(db)  # this release's migrate refuses too, and never lowers a later release's word
    assert "needs gluejobs 9.0.0 or newer" in (misfit(db) or "")

    # A newer schema than this release knows: it goes on only where the row admits it.
    with db.engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    assert "needs gluejobs 9.0.0 or newer" in (misfit(db) or "")
    set_oldest_fitting(db, release.RELEASE)
    assert misfit(db) is None
    with db.engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = :head"), {"head": head})

    # The previous release's schema: this release needs migrate first, which brings it back.
    downgrade(db, PREVIOUS_HEAD)
    assert misfit(db) == (
        f"gluejobs {release.RELEASE} needs the database schema at {head}, and it is at {PREVIOUS_HEAD}: "
        f"run `gluejobs migrate` with gluejobs {release.RELEASE}"
    )
    upgrade(db)
    assert misfit(db) is None


def previous_release_database(tmp_path: Path) -> tuple[str, Database]:
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    db = Database(url)
    upgrade(db, PREVIOUS_HEAD)
    return url, db


def refusals(commands: list[list[str]], settings: Settings) -> list[str]:
    """The last line each refusing process wrote (run side by side); each must have exited with 1 and
    no traceback."""
    running = [
        subprocess.Popen(
            command, env=worker_env(settings), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for command in commands
    ]
    lines = []
    for process in running:
        stdout, stderr = process.communicate(timeout=180)
        assert process.returncode == 1 and "Traceback" not in stdout + stderr, (stdout + stderr)[-3000:]
        lines.append(stderr.strip().splitlines()[-1])
    return lines


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_migrating_beside_a_busy_sqlite_writer_waits_for_the_lock_instead_of_failing(db: Database) -> None:
    """`gluejobs serve` migrates on start while workers write: on SQLite a transaction that read before
    it wrote failed at once with "database is locked" when a writer had committed meanwhile (an API
    restarted beside busy workers exited with status 1). The upgrade takes the write lock first."""
    holding, release_writer = threading.Event(), threading.Event()

    def writer() -> None:
        with db.engine.connect() as connection:
            connection.execution_options(**{WRITE_OPTION: True})  # BEGIN IMMEDIATE: a worker's write
            with connection.begin():
                connection.exec_driver_sql("UPDATE gluejobs_release SET migrated_at = migrated_at")
                holding.set()
                release_writer.wait(10)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert holding.wait(10)
        threading.Timer(0.5, release_writer.set).start()  # commits while the upgrade waits
        upgrade(db)
    finally:
        release_writer.set()
        thread.join(10)
    assert misfit(db) is None


@pytest.mark.e2e  # a process of its own, as a worker starts it
def test_an_api_and_a_worker_that_do_not_fit_the_database_refuse_with_one_line(
    tmp_path: Path, settings_factory
) -> None:  # type: ignore[no-untyped-def]
    url, db = previous_release_database(tmp_path)
    settings = settings_factory(url)
    head = release.schema_head()
    needs_migrate = (
        f"gluejobs {release.RELEASE} needs the database schema at {head}, and it is at {PREVIOUS_HEAD}: "
        f"run `gluejobs migrate` with gluejobs {release.RELEASE}"
    )
    serve = [*CLI, "serve", "--port", str(free_port())]
    assert refusals([[*serve, "--no-migrate"], [*CLI, "worker", "--no-migrate"]], settings) == [
        f"gluejobs serve: {needs_migrate}",
        f"gluejobs worker: {needs_migrate}",
    ]

    # Migrated by a later release that leaves this one behind: refused even without --no-migrate.
    upgrade(db)
    set_oldest_fitting(db, "9.0.0")
    too_old = f"needs gluejobs 9.0.0 or newer, and this is gluejobs {release.RELEASE}"
    for line in refusals([serve, [*CLI, "worker"], [*CLI, "migrate"]], settings):
        assert too_old in line
    db.dispose()


@pytest.mark.e2e
def test_migrating_while_a_worker_of_the_previous_release_drains(
    tmp_path: Path, settings_factory, postgres_url: str
) -> None:  # type: ignore[no-untyped-def]
    """Migrate while old workers drain: the previous release's worker finishes the job it runs on the
    migrated schema, then refuses to claim (one line, exit 3), and this release's worker runs the rest.
    On Postgres, as a fleet runs (SQLite's one writer would make the job wait on the migration)."""
    db = Database(postgres_url)
    downgrade(db, PREVIOUS_HEAD)
    settings = settings_factory(postgres_url)
    # Long enough (a few seconds of training) for the migration to land while it runs.
    spec = {**QUICK_JOB, "max_train_samples": 256, "num_train_epochs": 2, "seed": 1}
    with db.session() as session:
        first = jobs_repo.create_job(session, spec=spec).id
    old_log = tmp_path / "old-worker.log"
    with old_log.open("ab") as output:
        old = subprocess.Popen(
            [sys.executable, "-c", OLD_RELEASE, "worker"],
            env=worker_env(settings),
            cwd=REPO,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while _status(db, first) != "running":
            assert old.poll() is None and time.monotonic() < deadline, old_log.read_text()[-3000:]
            time.sleep(0.1)

        upgrade(db)  # this release's `gluejobs migrate`, under the running job
        with db.session() as session:
            second = jobs_repo.create_job(session, spec={**QUICK_JOB, "seed": 2}).id
        assert _status(db, first) == "running"  # the migration landed while the old worker worked

        assert old.wait(300) == 3, old_log.read_text()[-3000:]
    finally:
        stop(old)
    log = old_log.read_text()
    refusals = [line for line in log.splitlines() if "stops claiming" in line]
    assert len(refusals) == 1 and "needs gluejobs 0.2.0 or newer, and this is gluejobs 0.1.0" in refusals[0]
    assert _status(db, first) == "succeeded" and _status(db, second) == "queued"

    new = subprocess.run(
        [*CLI, "worker", "--exit-when-idle"], env=worker_env(settings), capture_output=True, timeout=300
    )
    assert new.returncode == 0, new.stderr[-3000:]
    assert _status(db, second) == "succeeded"
    with db.session() as session:
        # "0.2.0+<build>": each worker's release and the hash of its build's code (shared/core/build.py)
        versions = {
            row.id: (row.version or "").partition("+")[0]
            for row in jobs_repo.list_workers(session, lease_s=30)
        }
        ran = {job: jobs_repo.get_job(session, job_id=job).worker_id for job in (first, second)}
    assert versions[ran[first]] == "0.1.0" and versions[ran[second]] == release.RELEASE
    db.dispose()


def _status(db: Database, job_id: int) -> str:
    with db.session() as session:
        return str(jobs_repo.get_job(session, job_id=job_id).status)


def test_readyz_tells_warming_up_from_an_unreachable_database_and_a_release_mismatch(
    tmp_path: Path, settings_factory
) -> None:  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient

    from service.main import create_app
    from tests.support.e2e import LOOPBACK_URL

    url, db = previous_release_database(tmp_path)
    client = TestClient(create_app(settings_factory(url)), base_url=LOOPBACK_URL)

    def ready() -> tuple[int, dict[str, str], str | None]:
        response = client.get("/readyz")
        return response.status_code, response.json(), response.headers.get("retry-after")

    # The previous release's schema, and nobody migrating: warming up, waiting for `gluejobs migrate`.
    status, body, retry = ready()
    assert (status, body["status"], retry) == (503, "warming_up", "2")
    assert "not migrated" in body["detail"] and "run `gluejobs migrate`" in body["detail"]
    # While another process migrates (it holds the migration lock).
    with open(str(tmp_path / "fleet.db") + ".migrate.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        status, body, _ = ready()
        fcntl.flock(lock, fcntl.LOCK_UN)
    assert (status, body["status"]) == (503, "warming_up") and "being migrated" in body["detail"]

    upgrade(db)
    assert ready()[:2] == (200, {"status": "ok", "database": "sqlite", "detail": None})
    # A later release's migration left this one behind: no retry helps.
    set_oldest_fitting(db, "9.0.0")
    status, body, retry = ready()
    assert (status, body["status"], retry) == (503, "incompatible", None)
    assert "needs gluejobs 9.0.0 or newer" in body["detail"]
    # The database away: database_unreachable, whatever its schema.
    (tmp_path / "fleet.db").rename(tmp_path / "away.db")
    (tmp_path / "fleet.db").mkdir()  # SQLite cannot open a folder
    client.app.state.db.engine.dispose()  # no pooled connection to the moved file
    status, body, retry = ready()
    assert (status, body["status"], retry) == (503, "database_unreachable", "2")
    assert body["detail"].startswith("database unreachable")
    db.dispose()
