"""The Python client covers the API (issue 17, found 3), sync and async alike: keyword specs on
create, the dry run, rerun, sweeps, the leaderboard, and typed rows in the live stream."""

from __future__ import annotations

import asyncio

import pytest

from gluejobs import AsyncClient, Checkpoint, Client, Event, Metric, Plan, Sweep, TaskLeaderboard
from shared.core.db import Database
from tests.support import kit
from tests.support.dbutil import finish_as_a_worker

SPEC = {**kit.SPEC, "max_train_samples": 16}


# The client's side of the API: SQLite alone.
pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def test_the_sync_client_has_every_part_of_the_api(live_url: str, db: Database) -> None:
    with Client(live_url) as client:
        job = client.jobs.create(model_name_or_path="tiny-bert", task_name="sst2", priority=2, seed=4)
        merged = client.jobs.create(SPEC, learning_rate=1e-4, metadata={"team": "nlp"})
        plan = client.jobs.dry_run(SPEC, num_train_epochs=1.5)
        with pytest.raises(TypeError, match="the spec is a dict"):
            client.jobs.create(["tiny-bert"])  # type: ignore[arg-type]

        assert (job.priority, job.spec["seed"], job.spec["task_name"]) == (2, 4, "sst2")
        assert (merged.spec["learning_rate"], merged.metadata) == (1e-4, {"team": "nlp"})
        assert isinstance(plan, Plan) and plan.schedule["total_optimizer_steps"] == 3
        assert isinstance(job.warnings, list)

        finish_as_a_worker(db, job.id, {"accuracy": 0.75}, checkpoint="/jobs/1/checkpoints/checkpoint-4")
        rerun = client.jobs.rerun(job.id)
        assert (rerun.rerun_of, rerun.spec) == (job.id, client.jobs.get(job.id).spec)
        for queued in (merged, rerun):  # so that a sweep's job is the next one a worker claims
            client.jobs.cancel(queued.id)

        sweep_plan = client.sweeps.dry_run(SPEC, seeds=[1, 2], grid={"learning_rate": ["1e-4"]})
        assert [j["configuration"] for j in sweep_plan.jobs] == [
            "learning_rate=0.0001 seed=1",
            "learning_rate=0.0001 seed=2",
        ]
        sweep = client.sweeps.create(SPEC, seeds=[1, 2], grid={"learning_rate": [1e-4]})
        assert (
            isinstance(sweep, Sweep) and sweep.grid == {"learning_rate": [1e-4]} and len(sweep.job_ids) == 2
        )
        finish_as_a_worker(db, sweep.job_ids[0], {"accuracy": 0.8})
        shown = client.sweeps.get(sweep.id)
        assert shown.configurations and shown.configurations[0]["seeds_evaluated"] == 1
        assert [s.id for s in client.sweeps.list()] == [sweep.id]
        assert client.sweeps.cancel(sweep.id).job_counts.get("cancelled") == 1

        boards = client.leaderboard(task="sst2")
        assert [type(b) for b in boards] == [TaskLeaderboard] and boards[0].metric == "accuracy"
        assert {e["kind"] for e in boards[0].entries} == {"job", "sweep"}

        rows = {message.event: message.row for message in client.jobs.stream(job.id)}
    assert isinstance(rows["metric"], Metric) and rows["metric"].split in ("train", "eval")
    assert isinstance(rows["checkpoint"], Checkpoint) and rows["checkpoint"].step == 4
    assert isinstance(rows["status"], Event) and rows["status"].kind == "state"
    assert rows["end"] is None


def test_the_async_client_has_the_same_methods(live_url: str, db: Database) -> None:
    async def scenario() -> None:
        async with AsyncClient(live_url) as client:
            job = await client.jobs.create(model_name_or_path="tiny-bert", task_name="sst2")
            plan = await client.jobs.dry_run(model_name_or_path="tiny-bert", task_name="sst2")
            assert plan.spec["task_name"] == "sst2"
            finish_as_a_worker(db, job.id, {"accuracy": 0.7})
            assert (await client.jobs.rerun(job.id)).rerun_of == job.id
            sweep = await client.sweeps.create(SPEC, seeds=[1])
            assert (await client.sweeps.get(sweep.id)).id == sweep.id
            assert (await client.sweeps.dry_run(SPEC, seeds=[5])).seeds == [5]
            assert [s.id async for s in client.sweeps.list()] == [sweep.id]
            assert (await client.sweeps.cancel(sweep.id)).status == "cancelled"
            assert (await client.leaderboard())[0].task == "sst2"
            kinds = [type(m.row) async for m in client.jobs.stream(job.id) if m.event == "metric"]
            assert kinds and set(kinds) == {Metric}

    asyncio.run(scenario())
