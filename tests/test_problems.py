"""Every check answers every problem it finds at once, and what passes with a word of warning says so
on upload, in a dry run's first lines and on the job (issue 25 item 3).

Real GLUE rows (SST-2) in real files, SQLite and Postgres, the API in-process.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.main import create_app
from shared.config import Settings
from shared.db import Database
from shared.errors import MAX_PROBLEMS
from shared.models import Job
from tests.dbutil import count_rows
from tests.e2e import LOOPBACK_URL
from tests.kit import TINY_MODEL

SST2_ROWS = 400


def sst2_rows(glue_data: Path, count: int = SST2_ROWS) -> list[tuple[str, str]]:
    """The first `count` rows of GLUE's SST-2 train split: (sentence, label as 0/1)."""
    with (glue_data / "SST-2" / "train.tsv").open(encoding="utf-8") as handle:
        reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        next(reader)
        return [(sentence, label) for sentence, label in (next(reader) for _ in range(count))]


def write_csv(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["sentence", "label"])
        writer.writerows(rows)
    return path


@pytest.fixture
def client(settings: Settings, db: Database) -> TestClient:
    return TestClient(create_app(settings, db), base_url=LOOPBACK_URL)


def test_three_problems_in_one_answer(client: TestClient, settings: Settings, db: Database, glue_data: Path) -> None:
    """A flag typo, a data file that is not there and a label that does not fit the task: one 422
    names all three, the spec's problem first, and nothing is stored."""
    rows = sst2_rows(glue_data)
    rows[17] = (rows[17][0], "postive")  # SST-2's labels are 0/1 or negative/positive
    write_csv(settings.data_dir / "sst2_train.csv", rows)
    spec = {
        "model_name_or_path": TINY_MODEL,
        "task_name": "sst2",
        "learning_rat": 2e-5,
        "train_file": "sst2_train.csv",
        "validation_file": "sst2_dev.csv",  # never written
    }
    response = client.post("/v1/jobs", json={"spec": spec})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    problems = error["errors"]
    assert [(p["field"], p["code"]) for p in problems] == [
        ("spec.learning_rat", "unknown_field"),
        ("spec.train_file", "invalid_data"),
        ("spec.validation_file", "invalid_data"),
    ], problems
    assert "did you mean 'learning_rate'" in problems[0]["message"]
    assert "label 'postive' on row 18 does not fit the task" in problems[1]["message"]
    assert "'sst2_dev.csv' not found" in problems[2]["message"]
    # The contract's first problem, also as error.field / error.message.
    assert error["field"] == "spec.learning_rat"
    assert error["message"].startswith("spec.learning_rat: unknown field")
    assert "(and 2 more: spec.train_file, spec.validation_file)" in error["message"]
    assert count_rows(db, Job) == 0

    # The typo fixed: the data's two problems still come in one answer (the checks of a valid spec).
    spec["learning_rate"] = spec.pop("learning_rat")
    response = client.post("/v1/jobs", json={"spec": spec})
    assert response.status_code == 422, response.text
    fields = [p["field"] for p in response.json()["error"]["errors"]]
    assert sorted(fields) == ["spec.train_file", "spec.validation_file"], fields
    assert count_rows(db, Job) == 0


def test_problems_are_bounded(client: TestClient) -> None:
    """A spec with hundreds of unknown keys is refused in a bounded answer that counts the rest."""
    spec = {"model_name_or_path": TINY_MODEL, "task_name": "sst2", **{f"flag_{i}": 1 for i in range(120)}}
    response = client.post("/v1/jobs", json={"spec": spec})
    assert response.status_code == 422
    error = response.json()["error"]
    assert len(error["errors"]) == MAX_PROBLEMS
    assert error["errors_omitted"] == 120 - MAX_PROBLEMS
    assert {p["code"] for p in error["errors"]} == {"unknown_field"}


def _ids(answer: dict[str, Any]) -> list[str]:
    return [p["field"] for p in answer["error"]["errors"]]
