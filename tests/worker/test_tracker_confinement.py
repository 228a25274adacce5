"""Every path that creates a job runs the same checks (shared.admission.job_checks.check_job_spec): a sweep
and a rerun are refused a tracker the workers do not serve, as POST /v1/jobs is; and a tracker never
writes outside the job's folder (a real MLflow and TensorBoard, in a process of their own whose
working directory and home folder are watched)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from service.main import create_app
from shared import jobs_repo
from shared.core.config import Settings
from shared.core.db import Database
from shared.core.tables import Job
from tests.support.dbutil import count_rows
from tests.support.e2e import LOOPBACK_URL, run_python

GOOD = {"model_name_or_path": "tiny-bert", "task_name": "sst2"}


@pytest.fixture
def client(settings_factory: Any, db: Database) -> TestClient:
    settings: Settings = settings_factory(db.url, trackers=["tensorboard"])
    return TestClient(create_app(settings, db), base_url=LOOPBACK_URL)


def test_every_way_to_create_a_job_checks_the_trackers(client: TestClient, db: Database) -> None:
    for body in (
        {"spec": {**GOOD, "report_to": ["mlflow"]}, "seeds": [1, 2]},
        {"spec": GOOD, "grid": {"report_to": [["tensorboard"], ["mlflow"]]}},
        {"spec": {**GOOD, "with_tracking": True, "report_to": "mlflow"}, "seeds": [3]},
    ):
        response = client.post("/v1/sweeps", json=body)
        assert response.status_code == 422, response.text
        assert (
            "tracker 'mlflow' is not served by this cluster's workers" in response.json()["error"]["message"]
        )
    for params in ({}, {"dry_run": "true"}):
        response = client.post("/v1/jobs", params=params, json={"spec": {**GOOD, "report_to": ["mlflow"]}})
        assert response.status_code == 422 and response.json()["error"]["field"] == "spec.report_to"
    assert count_rows(db, Job) == 0
    # A job stored while the cluster served MLflow: its rerun is checked against today's trackers.
    with db.session() as session:
        stored = jobs_repo.create_job(
            session,
            spec={**GOOD, "seed": 1, "report_to": ["mlflow"], "with_tracking": True},
            priority=0,
            metadata={},
            max_attempts=1,
            owner=None,
        )
    rerun = client.post(f"/v1/jobs/{stored.id}/rerun")
    assert rerun.status_code == 422, rerun.text
    assert rerun.json()["error"]["field"] == "spec.report_to"
    assert count_rows(db, Job) == 1
    # A sweep of a served tracker is stored with it resolved, as a job is.
    served = client.post("/v1/sweeps", json={"spec": {**GOOD, "with_tracking": True}, "seeds": [1]})
    assert served.status_code == 201, served.text


def test_gluejobs_trackers_names_only_trackers_kept_in_the_jobs_folder(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="'wandb' would write outside the job's folder"):
        Settings(database_url=f"sqlite:///{tmp_path}/x.db", trackers="tensorboard,wandb")  # type: ignore[arg-type]


TRACKED_RUN = """
import sys
from pathlib import Path

from accelerate import Accelerator

from shared.jobspec.spec import JobSpec
from worker.training import tracking

output_dir = Path(sys.argv[1])
spec = JobSpec(model_name_or_path="tiny-bert", task_name="sst2", report_to=["mlflow", "tensorboard"])
trackers = tracking.trackers_for(spec, output_dir)
accelerator = Accelerator(log_with=trackers, project_config=tracking.project_configuration(output_dir))
accelerator.init_trackers(
    tracking.PROJECT_NAME, config=tracking.tracker_config(spec), init_kwargs=tracking.init_kwargs(output_dir)
)
accelerator.log(tracking.tracker_values("train", {"loss": 0.5}), step=1)
accelerator.end_training()
"""


@pytest.mark.e2e  # a process of its own, as a worker starts it
def test_mlflow_and_tensorboard_write_only_into_the_jobs_folder(tmp_path: Path) -> None:
    work, home, job = tmp_path / "cwd", tmp_path / "home", tmp_path / "artifacts" / "jobs" / "7"
    for folder in (work, home, job):
        folder.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "XDG_"))}
    env.update(HOME=str(home), DO_NOT_TRACK="false")
    run_python(textwrap.dedent(TRACKED_RUN), str(job), cwd=work, env=env)
    assert sorted(p.relative_to(work).as_posix() for p in work.rglob("*")) == []
    assert sorted(p.relative_to(home).as_posix() for p in home.rglob("*")) == []
    written = {p.relative_to(job).parts[0] for p in job.rglob("*")}
    assert written == {"mlflow", "tensorboard"}, written
    assert (job / "mlflow" / "mlflow.db").stat().st_size > 0
