"""The Python client (sync and async) and every CLI command against a live API and a real worker;
logs and artifacts over HTTP; Prometheus /metrics. One worker run serves the whole module's checks."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gluejobs import ApiError, AsyncClient, Client
from gluejobs.cli import main as cli
from tests.support.e2e import REPO, all_metrics, live_api, start_worker
from tests.support.observe_helpers import TINY_SPEC, broken_model, observe_settings

pytestmark = pytest.mark.e2e


class DropFirstResponse(httpx.HTTPTransport):
    """A network that loses the first answer after the server has acted on the request: the
    client cannot know whether its create went through, and must retry it."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        response = super().handle_request(request)
        if len(self.requests) == 1:
            response.read()
            response.close()
            raise httpx.ReadError("connection reset after the request was sent", request=request)
        return response


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_client_cli_logs_artifacts_and_prometheus(
    settings_factory: Any, tmp_path: Path, glue_data: Path, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = observe_settings(settings_factory, tmp_path, glue_data, db_url)
    spec = {**TINY_SPEC, "save_strategy": "epoch"}
    with live_api(settings) as http:
        url = str(http.base_url).rstrip("/")
        transport = DropFirstResponse()
        with Client(url, transport=transport) as client:
            # A create whose answer is lost is retried under the same Idempotency-Key: one job.
            good = client.jobs.create(spec, metadata={"purpose": "test"})
            assert len(transport.requests) == 2
            keys = {r.headers["Idempotency-Key"] for r in transport.requests}
            assert len(keys) == 1
            assert [j.id for j in client.jobs.list()] == [good.id]
            assert client.request("GET", "/readyz")["status"] == "ok"  # any other endpoint
            # The same key with another body is refused, naming the header.
            with pytest.raises(ApiError) as conflict:
                client.jobs.create({**spec, "seed": 8}, idempotency_key=keys.pop())
            assert (conflict.value.status_code, conflict.value.field) == (409, "Idempotency-Key")

            bad = client.jobs.create({**spec, "model_name_or_path": broken_model(settings)})
            queued = client.jobs.create(spec)
            assert client.jobs.cancel(queued.id).status == "cancelled"

            worker = start_worker(settings, "--exit-when-idle", log=tmp_path / "worker.log")
            try:
                # follow=True keeps going while the job trains and stops when it ends.
                followed = list(client.jobs.metrics(good.id, follow=True))
                assert client.jobs.get(good.id).finished
                done = client.jobs.wait(bad.id, timeout=120, poll_interval=0.5)
                assert worker.wait(60) == 0
            finally:
                if worker.poll() is None:
                    os.killpg(worker.pid, signal.SIGTERM)
                    worker.wait(30)

            good = client.jobs.get(good.id)
            assert good.status == "succeeded", good.error
            assert [m.id for m in followed] == [r["id"] for r in all_metrics(http, good.id)]
            assert {m.split for m in followed} == {"train", "eval"}
            assert good.headline_metric and good.headline_metric["name"] == "accuracy"

            # Listing iterates across pages; filters by status.
            assert [j.id for j in client.jobs.list(page_size=1)] == [queued.id, bad.id, good.id]
            assert [j.id for j in client.jobs.list(status="failed")] == [bad.id]
            events = list(client.jobs.events(good.id))
            assert events[0].message == "job queued" and events[-1].message == "job succeeded"
            checkpoints = client.jobs.checkpoints(good.id)
            assert [c.step for c in checkpoints] == [4, 8] and sum(c.is_best for c in checkpoints) == 1

            # A failed job's traceback, over HTTP.
            assert done.status == "failed"
            log = client.jobs.logs(bad.id)
            assert "Traceback (most recent call last)" in log and "broken-model" in log
            assert client.jobs.logs(bad.id, tail=3) == "".join(log.splitlines(keepends=True)[-3:])
            with pytest.raises(ApiError) as missing:
                client.jobs.logs(bad.id, attempt=7)
            assert (missing.value.status_code, missing.value.field) == (404, "attempt")

            # Artifacts: listed by kind; the final model downloads and loads with from_pretrained.
            artifacts = {a.path: a for a in client.jobs.artifacts(good.id)}
            assert artifacts["model.safetensors"].kind == "model"
            assert artifacts["logs/attempt-1.log"].kind == "log"
            assert any(
                a.kind == "checkpoint" and a.path.startswith("checkpoints/checkpoint-8/")
                for a in artifacts.values()
            )
            model_dir = client.jobs.download(good.id, tmp_path / "model")
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            model = AutoModelForSequenceClassification.from_pretrained(model_dir)
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
            assert model.config.num_labels == 2
            assert model(**tokenizer(["a fine film"], return_tensors="pt")).logits.shape == (1, 2)
            # A checkpoint's folder comes as a tar stream, unpacked.
            client.jobs.download(good.id, tmp_path / "ckpt", checkpoint=8)
            assert (tmp_path / "ckpt" / "checkpoint-8" / "gluejobs_state.json").is_file()
            config = http.get(f"/v1/jobs/{good.id}/artifacts/config.json")
            assert (
                config.headers["content-type"] == "application/json" and config.json()["model_type"] == "bert"
            )

            # Paths that leave the job's folder are refused: dot-dot, absolute, a link pointing out.
            job_dir = settings.job_dir(good.id)
            os.symlink(settings.job_dir(bad.id), job_dir / "other-job")
            for path in ("..%2F..%2F..%2Fetc%2Fpasswd", "%2Fetc%2Fpasswd", "other-job/logs/attempt-1.log"):
                refused = http.get(f"/v1/jobs/{good.id}/artifacts/{path}")
                assert refused.status_code == 422, (path, refused.text)
                assert refused.json()["error"]["field"] == "path"
            assert not any(
                p.startswith("other-job") for p in (a.path for a in client.jobs.artifacts(good.id))
            )

        asyncio.run(_async_client_checks(url, good.id, bad.id, tmp_path))
        _prometheus_checks(http, good.id)
        # Another API process on the same database reports the same fleet: nothing is per-process.
        with live_api(settings) as second:
            assert _steady_samples(second) == _steady_samples(http)
        _cli_checks(capsys, url, good.id, bad.id, tmp_path)


async def _async_client_checks(url: str, good_id: int, bad_id: int, tmp_path: Path) -> None:
    async with AsyncClient(url) as client:
        job = await client.jobs.get(good_id)
        assert job.status == "succeeded"
        assert (await client.request("GET", f"/v1/jobs/{good_id}"))["id"] == good_id
        listed = [j.id async for j in client.jobs.list(page_size=2)]
        assert good_id in listed and bad_id in listed
        rows = [m async for m in client.jobs.metrics(good_id, split="eval", name="accuracy")]
        assert [r.step for r in rows] == [4, 8]
        followed = [m async for m in client.jobs.metrics(good_id, follow=True, split="eval")]
        assert {m.name for m in followed} >= {"accuracy", "loss"}
        assert [e.message async for e in client.jobs.events(bad_id)][-1].startswith("job failed")
        assert "Traceback" in await client.jobs.logs(bad_id)
        assert "Traceback" in "".join([text async for text in client.jobs.follow_logs(bad_id)])
        assert len(await client.jobs.checkpoints(good_id)) == 2
        assert any(a.kind == "model" for a in await client.jobs.artifacts(good_id))
        await client.jobs.download(good_id, tmp_path / "async-ckpt", checkpoint=4)
        assert (tmp_path / "async-ckpt" / "checkpoint-4" / "gluejobs_state.json").is_file()
        created = await client.jobs.create({**TINY_SPEC, "seed": 99}, idempotency_key="async-key")
        again = await client.jobs.create({**TINY_SPEC, "seed": 99}, idempotency_key="async-key")
        assert again.id == created.id
        assert (await client.jobs.cancel(created.id)).status == "cancelled"
        assert (await client.jobs.wait(created.id, timeout=5)).status == "cancelled"
        with pytest.raises(ApiError) as missing:
            await client.jobs.get(10_000)
        assert (missing.value.status_code, missing.value.code) == (404, "not_found")


def _prometheus_checks(http: httpx.Client, good_id: int) -> None:
    response = http.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }
    assert samples[("gluejobs_jobs", (("status", "succeeded"),))] == 1
    assert samples[("gluejobs_jobs", (("status", "failed"),))] == 1
    assert samples[("gluejobs_jobs", (("status", "cancelled"),))] == 2
    assert samples[("gluejobs_queue_depth", ())] == 0
    assert samples[("gluejobs_job_claims_total", ())] == 2
    assert sum(v for (name, _), v in samples.items() if name == "gluejobs_job_failures_total") == 1
    assert samples[("gluejobs_job_duration_seconds_count", (("status", "succeeded"),))] == 1
    assert samples[("gluejobs_job_duration_seconds_bucket", (("le", "+Inf"), ("status", "succeeded")))] == 1
    assert samples[("gluejobs_epoch_duration_seconds_count", ())] == 1
    assert samples[("gluejobs_epoch_duration_seconds_sum", ())] > 0
    assert samples[("gluejobs_workers", (("state", "stopped"),))] == 1


def _steady_samples(http: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """/metrics without the figures that move with the clock (ages)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(http.get("/metrics").text)
        for s in family.samples
        if "age_seconds" not in s.name
    }


def _cli_checks(
    capsys: pytest.CaptureFixture[str], url: str, good_id: int, bad_id: int, tmp_path: Path
) -> None:
    base = ("--url", url)
    code, out, _ = run_cli(capsys, "ls", *base)
    assert code == 0 and str(good_id) in out and "succeeded" in out and "accuracy" in out
    code, out, _ = run_cli(capsys, "ls", "--status", "failed", "--json", *base)
    assert code == 0 and [job["status"] for job in json.loads(out)] == ["failed"]  # one JSON document

    code, out, _ = run_cli(capsys, "show", str(good_id), *base)
    assert code == 0 and f"job {good_id}: succeeded" in out and "(best)" in out and "trainable of" in out
    assert any(line.split() == ["task_name", "sst2"] for line in out.splitlines())  # the spec, aligned

    code, out, _ = run_cli(capsys, "logs", str(bad_id), *base)
    assert code == 0 and "Traceback (most recent call last)" in out
    code, out, _ = run_cli(capsys, "logs", str(bad_id), "-f", "--attempt", "1", *base)
    assert code == 0 and "Traceback (most recent call last)" in out

    code, out, _ = run_cli(capsys, "metrics", str(good_id), "--csv", *base)
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and rows[0].keys() == {"id", "epoch", "step", "split", "name", "value", "created_at"}
    assert {(r["split"], r["name"]) for r in rows} >= {("train", "loss"), ("eval", "accuracy")}
    code, out, _ = run_cli(
        capsys, "metrics", str(good_id), "--follow", "--split", "eval", "--name", "accuracy", *base
    )
    assert code == 0 and len(out.splitlines()) == 2

    code, out, _ = run_cli(capsys, "download", str(good_id), str(tmp_path / "cli-model"), *base)
    assert code == 0 and (tmp_path / "cli-model" / "model.safetensors").is_file()
    code, out, _ = run_cli(
        capsys, "download", str(good_id), "--checkpoint", "4", str(tmp_path / "cli-ckpt"), *base
    )
    assert code == 0 and (tmp_path / "cli-ckpt" / "checkpoint-4").is_dir()

    code, out, _ = run_cli(
        capsys, "resubmit", str(good_id), "--set", "num_train_epochs=1", "--set", "seed=5", *base
    )
    assert code == 0 and out.startswith("job ")
    new_id = int(out.split()[1])
    with Client(url) as client:
        resubmitted = client.jobs.get(new_id)
    assert (resubmitted.spec["num_train_epochs"], resubmitted.spec["seed"]) == (1, 5)
    assert resubmitted.metadata["resubmitted_from"] == str(good_id)
    code, out, _ = run_cli(capsys, "cancel", str(new_id), *base)
    assert code == 0 and out.strip() == f"job {new_id}: cancelled"
    code, _, err = run_cli(capsys, "cancel", str(new_id), *base)
    assert code == 2 and err.startswith("gluejobs cancel: ") and "finished" in err

    code, _, err = run_cli(capsys, "resubmit", str(good_id), "--set", "learning_rate=-1", *base)
    assert code == 2 and "spec.learning_rate" in err

    # watch, as a separate process the way a person runs it: an evaluation line per epoch, the end.
    watch = subprocess.run(
        [sys.executable, "-m", "gluejobs.cli", "watch", str(good_id), *base],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert watch.returncode == 0, watch.stderr
    assert watch.stdout.count("eval ") == 2 and "accuracy" in watch.stdout
    assert f"job {good_id} succeeded" in watch.stdout
    code, out, _ = run_cli(capsys, "watch", str(bad_id), *base)
    assert code == 1 and f"job {bad_id} failed" in out


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_client_lists_workers(
    settings_factory: Any, tmp_path: Path, glue_data: Path, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = observe_settings(settings_factory, tmp_path, glue_data, db_url)
    with live_api(settings) as http:
        url = str(http.base_url).rstrip("/")
        worker = start_worker(settings, "--exit-when-idle", log=tmp_path / "worker.log")
        assert worker.wait(60) == 0
        with Client(url) as client:
            workers = client.workers.list()
        assert [w.pid for w in workers] == [worker.pid]
        assert workers[0].state == "stopped" and workers[0].jobs == []

        async def listed() -> list[Any]:
            async with AsyncClient(url) as client:
                return await client.workers.list()

        assert [w.id for w in asyncio.run(listed())] == [workers[0].id]
        code, out, _ = run_cli(capsys, "workers", "--url", url)
        assert code == 0 and workers[0].id in out and "stopped" in out
