"""Every check answers every problem it finds at once, and what passes with a word of warning says so
on upload, in a dry run's first lines and on the job (issue 25 item 3).

Real GLUE rows (SST-2) in real files, SQLite and Postgres, the API in-process.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gluejobs.cli import main as cli
from service.main import create_app
from shared.core.config import Settings
from shared.core.db import Database
from shared.core.errors import MAX_PROBLEMS
from shared.core.tables import Job
from tests.support.dbutil import count_rows
from tests.support.e2e import LOOPBACK_URL, live_api
from tests.support.kit import TINY_MODEL

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
def client(settings: Settings, db: Database) -> Iterator[TestClient]:
    with TestClient(create_app(settings, db), base_url=LOOPBACK_URL) as test_client:
        yield test_client


def warned_rows(glue_data: Path) -> list[tuple[str, str]]:
    """SST-2's real rows shaped to deserve each warning: 300 positive and 20 negative rows (15 to 1),
    one `postive`, and 5 rows of 140+ words (consecutive SST-2 sentences joined) that max_length
    128 truncates."""
    rows = sst2_rows(glue_data, 3000)
    positive = [(text, "positive") for text, label in rows if label == "1"][:300]
    negative = [(text, "negative") for text, label in rows if label == "0"][:20]
    long_rows, words = [], list[str]()
    for text, _label in rows[1000:]:
        words += text.split()
        if len(words) > 140:
            long_rows.append((" ".join(words), "positive"))
            words = []
        if len(long_rows) == 5:
            break
    return [*positive[:150], ("a postive surprise", "postive"), *negative, *long_rows, *positive[150:]]


WARNING_CODES = {"label_near_duplicate", "rare_class", "label_imbalance", "long_rows"}


def test_three_problems_in_one_answer(
    client: TestClient, settings: Settings, db: Database, glue_data: Path
) -> None:
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
    assert fields == ["spec.train_file", "spec.validation_file"], fields

    # A queue option refused (before any route runs) does not hide the data's problems either.
    response = client.post("/v1/jobs", json={"spec": spec, "priority": "high"})
    assert response.status_code == 422, response.text
    fields = [p["field"] for p in response.json()["error"]["errors"]]
    assert fields == ["priority", "spec.train_file", "spec.validation_file"], fields
    assert count_rows(db, Job) == 0


def test_every_incoherence_of_a_spec_at_once(client: TestClient, db: Database) -> None:
    """Options that contradict each other are refused together, each naming its field."""
    spec = {
        "model_name_or_path": TINY_MODEL,
        "task_name": "sst2",
        "fp16": True,
        "bf16": True,
        "num_warmup_steps": 10,
        "warmup_ratio": 0.1,
        "lora_r": 4,
    }
    response = client.post("/v1/jobs", json={"spec": spec})
    assert response.status_code == 422, response.text
    problems = response.json()["error"]["errors"]
    assert [(p["field"], p["code"]) for p in problems] == [
        ("spec.lora_r", "invalid_spec"),
        ("spec.warmup_ratio", "invalid_spec"),
        ("spec.bf16", "invalid_spec"),
    ], problems
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


def test_upload_warnings_are_answered_and_kept(
    client: TestClient, glue_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """POST /v1/files answers the warnings of a real GLUE-derived file (near-duplicate label, rare
    class, imbalance, rows that max_length 128 truncates); GET shows the same; a clean file has none;
    `gluejobs files upload` prints each on a line of its own."""
    path = write_csv(tmp_path / "warned.csv", warned_rows(glue_data))
    answer = client.post("/v1/files", files={"file": ("warned.csv", path.read_bytes())})
    assert answer.status_code == 201, answer.text
    file = answer.json()
    warnings = {w["code"]: w for w in file["warnings"]}
    assert set(warnings) == WARNING_CODES, file["warnings"]
    assert all(w["field"] == "file" for w in file["warnings"])
    assert (
        "label 'postive' (1 rows) looks like a misspelling of 'positive' (305 rows)"
        in (warnings["label_near_duplicate"]["message"])
    )
    assert "label 'postive' has 1 of 326 rows (0.3%)" in warnings["rare_class"]["message"]
    assert "'positive' has 305 rows, 'negative' 20 (15.2 to 1" in warnings["label_imbalance"]["message"]
    assert "at least 5 of 326 rows have more words than max_length 128" in warnings["long_rows"]["message"]
    assert file["checks"]["long_rows"] == {"max_length": 128, "rows": 5}
    assert client.get(f"/v1/files/{file['id']}").json()["warnings"] == file["warnings"]

    clean = write_csv(tmp_path / "clean.csv", sst2_rows(glue_data, 200))
    answer = client.post(
        "/v1/files", files={"file": ("clean.csv", clean.read_bytes())}, data={"task_name": "sst2"}
    )
    assert answer.status_code == 201, answer.text
    assert answer.json()["warnings"] == []


def test_dry_run_warnings_come_first_and_the_job_keeps_them(
    client: TestClient, glue_data: Path, tmp_path: Path
) -> None:
    """A dry run on the warned file answers its warnings first (before the spec's many lines); the job
    submitted with it carries them, and GET /v1/jobs/{id} shows them. Its `postive` is a stray value,
    refused unless keep_labels names it (tests/service/test_one_pass_problems.py): named, it warns."""
    path = write_csv(tmp_path / "warned.csv", warned_rows(glue_data))
    file_id = client.post("/v1/files", files={"file": ("warned.csv", path.read_bytes())}).json()["id"]
    spec = {"model_name_or_path": TINY_MODEL, "train_file": file_id, "eval_strategy": "no", "seed": 1}
    stray = client.post("/v1/jobs", params={"dry_run": "true"}, json={"spec": spec})
    assert stray.status_code == 422 and stray.json()["error"]["errors"][0]["code"] == "stray_label", (
        stray.text
    )
    spec["keep_labels"] = ["postive"]
    plan = client.post("/v1/jobs", params={"dry_run": "true"}, json={"spec": spec})
    assert plan.status_code == 200, plan.text
    assert list(plan.json())[:2] == ["dry_run", "warnings"]
    lines = plan.json()["warnings"]
    assert any(
        line.startswith("train_file: label 'postive' (1 row) looks like a typo of 'positive'")
        for line in lines
    ), lines
    assert any(line.startswith("train_file: labels are imbalanced") for line in lines), lines
    assert any(line.startswith("train_file: label 'postive' has 1 of 326 rows") for line in lines), lines

    job = client.post("/v1/jobs", json={"spec": spec})
    assert job.status_code == 201, job.text
    kept = job.json()["warnings"]
    assert any("looks like a typo of 'positive'" in line for line in kept), kept
    assert any("labels are imbalanced" in line for line in kept), kept
    assert client.get(f"/v1/jobs/{job.json()['id']}").json()["warnings"] == kept


def test_the_command_line_prints_every_problem_and_every_warning(
    settings_factory: Any,
    sqlite_url: str,
    glue_data: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`gluejobs submit` prints each of the API's problems on a line of its own (a bad value, a bad
    label, a missing file); `gluejobs files upload` prints each warning on a line of its own."""
    settings: Settings = settings_factory(sqlite_url)
    rows = sst2_rows(glue_data)
    rows[17] = (rows[17][0], "postive")
    write_csv(settings.data_dir / "sst2_train.csv", rows)
    warned = write_csv(tmp_path / "local" / "warned.csv", warned_rows(glue_data))
    elsewhere = tmp_path / "elsewhere"  # the data paths name the API's files, not this folder's
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with live_api(settings) as http:
        url = str(http.base_url).rstrip("/")
        flags = ["--model_name_or_path", TINY_MODEL, "--task_name", "sst2", "--learning_rate", "fast"]
        files = ["--train_file", "sst2_train.csv", "--validation_file", "sst2_dev.csv"]
        code = cli(["submit", *flags, *files, "--url", url])
        _out, err = capsys.readouterr()
        assert code == 2
        lines = err.splitlines()
        assert lines[0] == "gluejobs submit: 3 problems", err
        assert lines[1] == "  spec.learning_rate: must be a number, not 'fast'", err
        assert lines[2].startswith(
            "  spec.train_file: train_file 'sst2_train.csv': label 'postive' on row 18"
        ), err
        assert lines[3].startswith("  spec.validation_file: validation_file 'sst2_dev.csv' not found"), err

        code = cli(["files", "upload", str(warned), "--url", url])
        out, err = capsys.readouterr()
        assert code == 0 and out.startswith("file-"), (out, err)
        warnings = [line for line in err.splitlines() if line.startswith("warning: file: ")]
        assert len(warnings) == 4, err
        assert "label 'postive' (1 rows) looks like a misspelling of 'positive'" in warnings[0]
