"""Two real builds on one database (issue 35 item 1): this one, and one from before its newest spec
field (keep_labels) and its newest migration (0014) — this tree as `git archive` gives it, without
them, run from a folder of its own as a worker. The older build hands back, untouched, the job that
uses keep_labels and runs the one that leaves it off; this build runs the first; GET /v1/workers
tells the two builds apart and says what each supports."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from shared import jobs_repo
from shared.core import build, release
from shared.core.db import Database
from shared.core.migrate import upgrade
from shared.core.tables import JobStatus
from shared.jobspec.spec import JobSpec
from tests.support.e2e import LOOPBACK_URL, worker_env
from tests.support.kit import QUICK_JOB, REPO

NEWEST_FIELD = "keep_labels"
NEWEST_MIGRATION = "alembic/versions/0014_build_identity.py"
# The older build's schema head: it lacks 0014 and every migration after it.
OLDER_HEAD = "0013"


def older_build(into: Path) -> Path:
    """This commit's tree without the newest spec field and migration: a build from before them."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD"], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    for migration in (into / "alembic/versions").glob("0*.py"):
        if migration.name >= Path(NEWEST_MIGRATION).name:
            migration.unlink()
    spec = into / "shared/jobspec/spec.py"
    source = spec.read_text()
    start = source.index(f"    {NEWEST_FIELD}: ")
    end = source.index("\n    )\n", start) + len("\n    )\n")
    spec.write_text(source[:start] + source[end:])
    return into


def run_worker(tree: Path, env: dict[str, str], log: Path) -> None:
    with log.open("ab") as output:
        done = subprocess.run(
            [sys.executable, "-m", "worker", "--exit-when-idle"],
            cwd=tree,
            env={**env, "PYTHONPATH": str(tree), "GLUEJOBS_BUILD_COMMIT": tree.name},
            stdout=output,
            stderr=subprocess.STDOUT,
            timeout=480,
        )
    assert done.returncode == 0, log.read_text()[-3000:]


@pytest.mark.e2e
def test_an_older_build_hands_back_what_it_cannot_run_and_this_build_runs_it(
    tmp_path: Path, settings_factory
) -> None:  # type: ignore[no-untyped-def]
    old_tree = older_build(tmp_path / "older")
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    db = Database(url)
    upgrade(db)  # this build's `gluejobs migrate`: schema 0014, which the older build does not know
    settings = settings_factory(url)
    env = {k: v for k, v in worker_env(settings).items() if k != "GLUEJOBS_BUILD_COMMIT"}
    full = JobSpec.model_validate(QUICK_JOB).model_dump(mode="json")
    with db.session() as session:
        uses = jobs_repo.create_job(session, spec={**full, NEWEST_FIELD: ["neutral"], "seed": 1}).id
        leaves_off = jobs_repo.create_job(session, spec={**full, "seed": 2}).id
    assert full[NEWEST_FIELD] is None  # stored specs carry every field, the newest one off

    log = tmp_path / "older-worker.log"
    run_worker(old_tree, env, log)
    with db.session() as session:
        job = jobs_repo.get_job(session, job_id=uses)
        assert (job.status, job.attempts, job.error, job.error_code) == (JobStatus.queued, 0, None, None)
        refusal = jobs_repo.list_events(session, job_id=uses)[0][-1]
        assert jobs_repo.get_job(session, job_id=leaves_off).status == JobStatus.succeeded
    assert refusal.data["missing_fields"] == [NEWEST_FIELD]
    assert "Traceback" not in log.read_text() and "invalid_data" not in log.read_text()

    run_worker(REPO, env, tmp_path / "worker.log")
    with db.session() as session:
        job = jobs_repo.get_job(session, job_id=uses)
        assert (job.status, job.attempts) == (JobStatus.succeeded, 1)
        ran = {j: jobs_repo.get_job(session, job_id=j).worker_id for j in (uses, leaves_off)}

    from service.main import create_app

    client = TestClient(create_app(settings), base_url=LOOPBACK_URL)
    workers = {w["id"]: w for w in client.get("/v1/workers").json()["data"]}
    older, this = workers[ran[leaves_off]], workers[ran[uses]]
    assert this["build"]["build"] == build.build_hash() != older["build"]["build"]
    assert (this["version"], this["build"]["version"]) == (build.version_string(), "0.2.0")
    assert older["version"] == f"0.2.0+{older['build']['build']}" and older["build"]["commit"] == "older"
    assert NEWEST_FIELD in this["build"]["spec_fields"] and NEWEST_FIELD not in older["build"]["spec_fields"]
    assert (older["build"]["schema_head"], this["build"]["schema_head"]) == (
        OLDER_HEAD,
        release.schema_head(),
    )
    assert refusal.message == (
        f"worker {older['id']} of gluejobs 0.2.0 (build {older['build']['build']}, commit older) cannot run "
        f"this job: its spec uses {NEWEST_FIELD}, which this build does not support; handed back untouched, "
        "no attempt spent"
    )
    db.dispose()
