"""Issue 37, multi-machine jobs, first layer: num_machines in the spec and the launchers' multi-machine
flags as pasted. A job on several machines is accepted and stored as asked (up to MAX_MACHINES); more
is refused with a 422 that names the field, and never stored; the ranks are the service's to set."""

from __future__ import annotations

import re
import shlex

import pytest
from fastapi.testclient import TestClient

from gluejobs.cli.script_args import ScriptArgsError, command_to_spec
from service.main import create_app
from shared.core.config import Settings
from shared.core.db import Database
from shared.core.tables import Job
from shared.jobspec.spec import MAX_MACHINES, JobSpec
from tests.support.dbutil import count_rows
from tests.support.e2e import LOOPBACK_URL
from tests.support.kit import QUICK_JOB


@pytest.mark.parametrize(
    ("command", "machines"),
    [
        ("torchrun --nnodes 2 --nproc_per_node 4 run_glue.py", "2"),
        ("torchrun --nnodes=3:3 run_glue.py", "3"),
        ("accelerate launch --num_machines 2 --num_processes 8 run_glue_no_trainer.py", "2"),
        ("accelerate launch --num_machines 1 run_glue_no_trainer.py", None),  # one machine: left off
        ("python -m torch.distributed.run --nnodes 1 --standalone run_glue.py", None),
    ],
)
def test_the_launchers_machine_counts_become_num_machines(command: str, machines: str | None) -> None:
    spec = command_to_spec([*shlex.split(command), "--model_name_or_path", "m", "--task_name", "rte"]).spec

    assert spec.get("num_machines") == machines


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("torchrun --nnodes 1:4 run_glue.py", "--nnodes 1:4: needs a number of machines (a fixed one"),
        ("torchrun --node_rank 0 run_glue.py", "--node_rank 0: not supported (the service sets each machine"),
        ("torchrun --master_addr 10.0.0.1 run_glue.py", "--master_addr 10.0.0.1: not supported (the service"),
        ("torchrun --master_port 29500 run_glue.py", "--master_port 29500: not supported (the service"),
        ("accelerate launch --machine_rank 1 run_glue_no_trainer.py", "--machine_rank 1: not supported"),
        ("accelerate launch --main_process_ip 10.0.0.1 run_glue_no_trainer.py", "--main_process_ip 10.0.0.1"),
        ("accelerate launch --main_process_port=29500 run_glue_no_trainer.py", "--main_process_port 29500"),
        ("accelerate launch --num_machines 0 run_glue_no_trainer.py", "--num_machines 0: needs a number"),
    ],
)
def test_rank_and_rendezvous_flags_are_the_services_to_set(command: str, message: str) -> None:
    with pytest.raises(ScriptArgsError, match=re.escape(message)):
        command_to_spec([*shlex.split(command), "--model_name_or_path", "m"])


def test_one_machine_is_stored_as_off() -> None:
    assert JobSpec.model_validate({**QUICK_JOB, "num_machines": 1}).num_machines is None
    assert JobSpec.model_validate(QUICK_JOB).num_machines is None


def test_several_machines_are_accepted_up_to_the_limit(settings: Settings, db: Database) -> None:
    client = TestClient(create_app(settings, db), base_url=LOOPBACK_URL)
    accepted = client.post("/v1/jobs", json={"spec": {**QUICK_JOB, "num_machines": 2}})
    assert accepted.status_code == 201, accepted.text
    assert accepted.json()["spec"]["num_machines"] == 2
    for params in ({}, {"dry_run": "true"}):
        refused = client.post(
            "/v1/jobs", params=params, json={"spec": {**QUICK_JOB, "num_machines": MAX_MACHINES + 1}}
        )

        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["field"] == "spec.num_machines", error
        assert "Traceback" not in refused.text
    assert count_rows(db, Job) == 1
    # One machine is an ordinary job.
    assert client.post("/v1/jobs", json={"spec": {**QUICK_JOB, "num_machines": 1}}).status_code == 201
