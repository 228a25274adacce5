"""The research workflow end to end: real HTTP, the real CLI, real worker processes, real MRPC rows.

A 3-seed × 2-learning-rate sweep of the tiny model with do_predict (submitted with `gluejobs
sweep`) and a rerun of one of its jobs run through two workers. Then: the sweep's medians and
spreads equal those computed by hand from the jobs' metric rows; the dry-run plan matches what the
runs did; the rerun reproduced its original exactly; the reproducibility record holds real
versions and hashes; the leaderboard shows the sweep next to the majority-class baseline computed
by hand; a job's prediction file comes back in GLUE's zip (`gluejobs glue-zip`). Ranking sweeps
against single jobs with chosen values is test_research_api's.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import signal
import statistics
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from shared.core.config import Settings
from tests.support.e2e import REPO, all_metrics, get, live_api, start_worker

pytestmark = pytest.mark.e2e

BASE = {
    "model_name_or_path": "tiny-bert",
    "task_name": "mrpc",
    "max_train_samples": 32,
    "max_eval_samples": 32,
    "per_device_train_batch_size": 16,
    "per_device_eval_batch_size": 32,
    "num_train_epochs": 2,
    "logging_steps": 2,
    "save_strategy": "no",
    "do_predict": True,
}
SEEDS = [0, 1, 2]
LEARNING_RATES = [1e-3, 3e-3]
TEST_ROWS = 20


def read_tsv(path: Path) -> pd.DataFrame:
    return pd.read_csv(
        path, sep="\t", quoting=csv.QUOTE_NONE, dtype=str, keep_default_na=False, encoding="utf-8-sig"
    )


@pytest.fixture
def research_settings(settings_factory, tmp_path: Path, glue_data: Path, db_url: str) -> Settings:  # type: ignore[no-untyped-def]
    """MRPC in a GLUE folder, with a test file made of dev rows without labels (GLUE's test layout)."""
    folder = tmp_path / "glue" / "MRPC"
    folder.mkdir(parents=True)
    for name in ("train.tsv", "dev.tsv"):
        (folder / name).symlink_to(glue_data / "MRPC" / name)
    dev = read_tsv(glue_data / "MRPC" / "dev.tsv").head(TEST_ROWS)
    columns = ["#1 ID", "#2 ID", "#1 String", "#2 String"]
    lines = ["\t".join(["index", *columns])] + [
        "\t".join([str(i), *row]) for i, row in enumerate(dev[columns].to_numpy().tolist())
    ]
    (folder / "test.tsv").write_text("\n".join(lines) + "\n")
    result: Settings = settings_factory(db_url, glue_dir=tmp_path / "glue")
    return result


def cli(client: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gluejobs.cli", *args, "--url", str(client.base_url)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def script_flags(spec: dict[str, Any]) -> list[str]:
    return [item for name, value in spec.items() for item in (f"--{name}", str(value))]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_sweep_rerun_leaderboard_and_submission_through_a_worker(
    research_settings: Settings, glue_data: Path, models_dir: Path, tmp_path: Path
) -> None:
    with live_api(research_settings) as client:
        swept = cli(
            client,
            "sweep",
            *script_flags(BASE),
            "--seeds",
            ",".join(map(str, SEEDS)),
            "--grid",
            f"learning_rate={','.join(map(str, LEARNING_RATES))}",
        )
        assert swept.returncode == 0, swept.stderr
        sweep_id = int(swept.stdout.split()[1])
        sweep = get(client, f"/v1/sweeps/{sweep_id}")
        assert sweep["status"] == "queued" and len(sweep["job_ids"]) == 6
        jobs = [get(client, f"/v1/jobs/{i}") for i in sweep["job_ids"]]
        assert [(j["spec"]["learning_rate"], j["spec"]["seed"]) for j in jobs] == [
            (lr, seed) for lr in LEARNING_RATES for seed in SEEDS
        ]
        assert all(j["sweep_id"] == sweep_id and j["metadata"]["sweep_id"] == str(sweep_id) for j in jobs)

        # --do_predict makes these run_glue.py's flags (recipe trainer), where only --do_train trains.
        flags = script_flags({**BASE, "learning_rate": 1e-3, "seed": 0, "do_train": True})
        planned = cli(client, "submit", *flags, "--dry-run")
        assert planned.returncode == 0, planned.stderr
        assert "2 steps/epoch × 2 epochs = 4 optimizer steps" in planned.stdout
        plan = client.post("/v1/jobs", params={"dry_run": "true"}, json={"spec": {**BASE, "seed": 0}}).json()

        rerun = client.post(f"/v1/jobs/{jobs[0]['id']}/rerun")
        assert rerun.status_code == 201, rerun.text
        assert rerun.json()["rerun_of"] == jobs[0]["id"] and rerun.json()["spec"] == jobs[0]["spec"]
        assert len(get(client, "/v1/jobs", limit=100)["data"]) == 7  # the dry runs stored nothing

        run_two_workers_until_idle(research_settings, tmp_path)

        jobs = [get(client, f"/v1/jobs/{i}") for i in sweep["job_ids"]]
        assert [j["status"] for j in jobs] == ["succeeded"] * 6, [j["error"] for j in jobs]
        check_sweep_statistics(client, sweep_id, jobs)
        check_plan_against_the_runs(client, plan, jobs)
        check_rerun(client, rerun.json()["id"], jobs[0])
        check_environment(jobs[0], research_settings, glue_data, models_dir)
        check_leaderboard(client, sweep_id, glue_data)
        check_submission(client, jobs[-1], tmp_path)

        assert client.post(f"/v1/sweeps/{sweep_id}/cancel").status_code == 409  # nothing left to cancel


def run_two_workers_until_idle(settings: Settings, tmp_path: Path) -> None:
    """Two workers drain the queue side by side (the sweep's jobs are independent)."""
    workers = [start_worker(settings, "--exit-when-idle", log=tmp_path / f"worker-{i}.log") for i in range(2)]
    try:
        for i, worker in enumerate(workers):
            assert worker.wait(600) == 0, (tmp_path / f"worker-{i}.log").read_text()[-3000:]
    finally:
        for worker in workers:
            if worker.poll() is None:  # only when the test has already failed (a timeout)
                os.killpg(worker.pid, signal.SIGKILL)


def by_hand(client: Any, job: dict[str, Any]) -> dict[str, dict[str, float]]:
    """A job's best (first highest F1, the task's main metric) and final evaluation, from its rows."""
    rows = [r for r in all_metrics(client, job["id"]) if r["split"] == "eval"]
    steps = sorted({r["step"] for r in rows})
    at = {step: {r["name"]: r["value"] for r in rows if r["step"] == step} for step in steps}
    best = max(steps, key=lambda step: (at[step]["f1"], -step))
    return {"best": at[best], "final": at[steps[-1]]}


def check_sweep_statistics(client: Any, sweep_id: int, jobs: list[dict[str, Any]]) -> None:
    sweep = get(client, f"/v1/sweeps/{sweep_id}")
    assert sweep["status"] == "succeeded" and sweep["main_metric"] == "f1"
    assert [c["configuration"] for c in sweep["configurations"]] == [
        {"learning_rate": lr} for lr in LEARNING_RATES
    ]
    medians = []
    for configuration in sweep["configurations"]:
        members = [
            j for j in jobs if j["spec"]["learning_rate"] == configuration["configuration"]["learning_rate"]
        ]
        assert configuration["job_ids"] == [j["id"] for j in members]
        assert configuration["seeds"] == SEEDS and configuration["seeds_evaluated"] == 3
        evaluations = [by_hand(client, j) for j in members]
        for point in ("best", "final"):
            names = set(evaluations[0][point])
            assert names == {"accuracy", "f1", "combined_score", "loss"}
            assert set(configuration[point]["eval"]) == names
            for name in names:
                values = [e[point][name] for e in evaluations]
                assert configuration[point]["eval"][name] == {
                    "median": pytest.approx(statistics.median(values)),
                    "mean": pytest.approx(statistics.fmean(values)),
                    "std": pytest.approx(statistics.stdev(values)),
                    "min": pytest.approx(min(values)),
                    "max": pytest.approx(max(values)),
                    "n": 3,
                }
        medians.append(statistics.median(e["best"]["f1"] for e in evaluations))
    winner = max(range(len(medians)), key=lambda i: (medians[i], -i))
    assert sweep["winner"]["configuration"] == {"learning_rate": LEARNING_RATES[winner]}
    assert sweep["winner"]["median"] == pytest.approx(medians[winner])


def check_plan_against_the_runs(client: Any, plan: dict[str, Any], jobs: list[dict[str, Any]]) -> None:
    schedule = plan["schedule"]
    assert plan["data"]["splits"]["train"]["rows_used"] == 32
    for job in jobs:
        assert job["result"]["completed_steps"] == schedule["total_optimizer_steps"] == 4
        eval_steps = sorted({r["step"] for r in all_metrics(client, job["id"]) if r["split"] == "eval"})
        assert eval_steps == schedule["evaluation_steps"] == [2, 4]
        events = get(client, f"/v1/jobs/{job['id']}/events")["data"]
        training = next(e["data"] for e in events if e["message"].startswith("training:"))
        assert training["warmup_steps"] == schedule["warmup_steps"]
        assert training["max_train_steps"] == schedule["total_optimizer_steps"]


def check_rerun(client: Any, rerun_id: int, original: dict[str, Any]) -> None:
    rerun = get(client, f"/v1/jobs/{rerun_id}")
    assert rerun["status"] == "succeeded", rerun["error"]
    reproduction = rerun["reproduction"]
    assert reproduction["of_job"] == original["id"]
    assert (reproduction["status"], reproduction["match"]) == ("matched", "exact"), reproduction
    assert reproduction["compared"] >= 8 and reproduction["max_abs_difference"] == 0.0
    assert reproduction["environment_differences"] == []
    assert get(client, f"/v1/jobs/{original['id']}")["reproduction"] is None  # only a rerun has one


def check_environment(job: dict[str, Any], settings: Settings, glue_data: Path, models_dir: Path) -> None:
    record = job["environment"]
    for package in ("torch", "transformers", "accelerate", "peft", "datasets"):
        assert record["packages"][package] == metadata.version(package)
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout
    assert record["gluejobs_commit"] == head.strip()
    assert record["python"] == ".".join(map(str, sys.version_info[:3]))
    assert record["device"]["cpu"] and record["device"]["gpus"] == []
    files = {f["role"]: f for f in record["data_files"]}
    assert set(files) == {"train", "eval", "test"}  # do_predict reads GLUE's test file too
    for role, path in (
        ("train", glue_data / "MRPC" / "train.tsv"),
        ("eval", glue_data / "MRPC" / "dev.tsv"),
        ("test", settings.glue_dir / "MRPC" / "test.tsv"),
    ):
        assert files[role]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    weights = {f["role"]: f["sha256"] for f in record["model_files"]}
    assert weights == {
        "model.safetensors": hashlib.sha256(
            (models_dir / "tiny-bert" / "model.safetensors").read_bytes()
        ).hexdigest()
    }
    assert record["spec"] == job["spec"] and record["attempt"] == 1


def check_leaderboard(client: Any, sweep_id: int, glue_data: Path) -> None:
    board = get(client, "/v1/leaderboard", task="mrpc")["data"]
    assert [b["task"] for b in board] == ["mrpc"]
    [entry] = board[0]["entries"]  # the sweep; its jobs and the rerun are not entries of their own
    sweep = get(client, f"/v1/sweeps/{sweep_id}")
    assert (entry["kind"], entry["id"], entry["rank"], entry["seeds"]) == ("sweep", sweep_id, 1, 3)
    assert entry["value"] == pytest.approx(sweep["winner"]["median"])
    assert entry["configuration"] == sweep["winner"]["configuration"]
    assert "seed" not in entry["hyperparameters"] and entry["model"] == "tiny-bert"
    assert entry["trainable_params"] > 0
    # The majority-class baseline, by hand: F1 of answering "equivalent" (1) everywhere, on the 32
    # rows the jobs evaluated on, and on the whole dev set for the task.
    labels = read_tsv(glue_data / "MRPC" / "dev.tsv")["Quality"].astype(int)
    for rows, baseline in ((labels.head(32), entry["baseline"]), (labels, board[0]["baseline"])):
        share = float((rows == 1).mean())
        assert rows.mode()[0] == 1 and baseline["majority_label"] == "equivalent"
        assert (baseline["rows"], baseline["share"]) == (len(rows), pytest.approx(share))
        assert baseline["value"] == pytest.approx(2 * share / (1 + share))
    assert entry["near_chance"] == (entry["value"] - entry["baseline"]["value"] < 0.01)


def check_submission(client: Any, job: dict[str, Any], tmp_path: Path) -> None:
    output = Path(job["output_dir"]) / "MRPC.tsv"
    lines = output.read_text().splitlines()
    assert lines[0] == "index\tprediction" and [line.split("\t")[0] for line in lines[1:]] == [
        str(i) for i in range(TEST_ROWS)
    ]
    target = tmp_path / "submission.zip"
    zipped = cli(client, "glue-zip", str(job["id"]), "--allow-partial", "-o", str(target))
    assert zipped.returncode == 0, zipped.stderr
    archive = zipfile.ZipFile(io.BytesIO(target.read_bytes()))
    assert archive.namelist() == ["MRPC.tsv"] and archive.read("MRPC.tsv") == output.read_bytes()
    refused = cli(client, "glue-zip", str(job["id"]), "-o", str(tmp_path / "no.zip"))
    assert refused.returncode == 2 and "QQP.tsv (qqp)" in refused.stderr
