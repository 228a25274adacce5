"""Every problem of a submission found in one pass and named with its fix (issue 35 item 3): each
mistyped mapped column, a stray label with its rows and the label it is near (on upload, submit and
dry run, before any training), registered models matched with and without the `model:` prefix, and a
Hub id an offline API cannot find refused where one that could not reach the Hub warns.

Real SST-2 rows in real CSV files and uploads, a real registered model (the tiny BERT through
POST /v1/models into the local store), a real API server, SQLite and Postgres.
"""

from __future__ import annotations

import csv
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gluejobs import Client
from shared.core.config import Settings
from shared.core.db import Database
from shared.core.tables import Job
from tests.support.dbutil import count_rows
from tests.support.e2e import live_api
from tests.support.kit import GLUE_DATA, TINY_MODEL

ROWS = 400
STRAY_ROW = 213  # the file's row number (the header is not a row) of the one `positive `


def sst2_rows(count: int) -> list[tuple[str, str]]:
    with (GLUE_DATA / "SST-2" / "train.tsv").open(encoding="utf-8") as handle:
        reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        next(reader)
        return [(text.strip(), label) for text, label in (next(reader) for _ in range(count))]


def write_csv(path: Path, header: tuple[str, str], rows: list[tuple[str, str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def reviews(path: Path) -> Path:
    """A product team's file: review, sentiment (positive/negative)."""
    named = [(text, "positive" if label == "1" else "negative") for text, label in sst2_rows(48)]
    return write_csv(path, ("review", "sentiment"), named)


def stray_file(path: Path) -> Path:
    """400 real rows labelled pos/neg, one of them `positive ` (row STRAY_ROW)."""
    rows = [(text, "pos" if label == "1" else "neg") for text, label in sst2_rows(ROWS)]
    rows[STRAY_ROW - 1] = (rows[STRAY_ROW - 1][0], "positive ")
    return write_csv(path, ("sentence", "label"), rows)


def upload(api: httpx.Client, path: Path, **fields: str) -> httpx.Response:
    return api.post("/v1/files", files={"file": (path.name, path.read_bytes())}, data=fields)


def refused(response: httpx.Response) -> list[dict[str, str]]:
    assert response.status_code in (404, 422), response.text
    error = response.json()["error"]
    return list(error.get("errors") or [error])


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hub cache of the API's own, and a Hub endpoint that refuses connections (a port
    nobody listens on: no network here, and none needed to be told so)."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    return tmp_path / "hub"


@pytest.fixture
def api(settings: Settings, hub_cache: Path) -> Iterator[httpx.Client]:
    with live_api(settings) as client:
        yield client


@pytest.fixture
def minilm(api: httpx.Client, models_dir: Path) -> str:
    """A registered model named `minilm` (the tiny BERT's files)."""
    with Client(str(api.base_url)) as client:
        return client.models.upload(models_dir / TINY_MODEL, name="minilm").model_name_or_path


SPEC = {"eval_strategy": "no", "save_strategy": "no", "max_train_steps": 2}


def test_every_mistyped_mapped_column_and_the_model_in_one_answer(
    api: httpx.Client, minilm: str, db: Database, tmp_path: Path
) -> None:
    """The report's case: `reveiw` and `sentimnt` both named in one answer on upload and on submit,
    each with its near match; with `model:minilm-l6` besides, three problems, the model's suggesting
    `model:minilm`; nothing stored."""
    path = reviews(tmp_path / "reviews.csv")
    typos = {"text_column": "reveiw", "label_column": "sentimnt"}

    on_upload = refused(upload(api, path, **typos))
    assert [p["field"] for p in on_upload] == ["file", "file"], on_upload
    assert (
        "has no column 'reveiw' (text_column; its columns: review, sentiment); did you mean 'review'?"
        in (on_upload[0]["message"])
    )
    assert (
        "has no column 'sentimnt' (label_column; its columns: review, sentiment); did you mean "
        in (on_upload[1]["message"])
    )

    uploaded = upload(api, path, text_column="review", label_column="sentiment")
    assert uploaded.status_code == 201, uploaded.text
    spec = {**SPEC, "model_name_or_path": TINY_MODEL, "train_file": uploaded.json()["id"], **typos}
    two = refused(api.post("/v1/jobs", json={"spec": spec}))
    assert [(p["field"], p["code"]) for p in two] == [("spec.train_file", "invalid_data")] * 2, two
    assert "'reveiw' (text_column;" in two[0]["message"] and "did you mean 'review'?" in two[0]["message"]
    assert "'sentimnt' (label_column;" in two[1]["message"]
    assert "did you mean 'sentiment'?" in two[1]["message"]

    three = api.post("/v1/jobs", json={"spec": {**spec, "model_name_or_path": "model:minilm-l6"}})
    problems = refused(three)
    assert [p["field"] for p in problems] == [
        "spec.model_name_or_path",
        "spec.train_file",
        "spec.train_file",
    ], problems
    assert "no registered model 'model:minilm-l6'; did you mean 'model:minilm'?" in problems[0]["message"]
    assert "(and 2 more: spec.train_file)" in three.json()["error"]["message"]
    # The dry run names the same three.
    plan = api.post(
        "/v1/jobs",
        params={"dry_run": "true"},
        json={"spec": {**spec, "model_name_or_path": "model:minilm-l6"}},
    )
    assert [p["field"] for p in refused(plan)] == [p["field"] for p in problems]
    assert count_rows(db, Job) == 0

    fixed = {**spec, "text_column": "review", "label_column": "sentiment", "model_name_or_path": minilm}
    created = api.post("/v1/jobs", json={"spec": fixed})
    assert created.status_code == 201, created.text


def test_a_bare_registered_name_is_refused_with_its_prefix(api: httpx.Client, minilm: str) -> None:
    """`minilm` is no folder and not in the Hub cache, the Hub cannot be reached, and the caller has
    `model:minilm`: refused naming the fix, not accepted to fail on a worker."""
    spec = {**SPEC, "task_name": "sst2", "model_name_or_path": "minilm"}
    problems = refused(api.post("/v1/jobs", json={"spec": spec}))
    assert [p["field"] for p in problems] == ["spec.model_name_or_path"]
    assert (
        "'minilm' is neither a folder in GLUEJOBS_MODELS_DIR nor in the Hub cache" in problems[0]["message"]
    )
    assert "did you mean 'model:minilm'?" in problems[0]["message"]
    # A name that is the caller's registered model in no form is the Hub's to judge: here, a warning.
    other = api.post("/v1/jobs", json={"spec": {**spec, "model_name_or_path": "minilm-base"}})
    assert other.status_code == 201, other.text
    assert any("could not be reached from the API" in w for w in other.json()["warnings"])


def test_an_offline_api_refuses_a_hub_id_it_cannot_find(
    api: httpx.Client, hub_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HF_HUB_OFFLINE=1: a Hub id not in the cache is refused naming it (no worker is sent a model
    nobody found); online but unreachable, the same id is accepted with a warning that says so."""
    spec = {**SPEC, "task_name": "sst2", "model_name_or_path": "org/not-cached"}
    reachable_not = api.post("/v1/jobs", json={"spec": spec})
    assert reachable_not.status_code == 201, reachable_not.text
    [warning] = [w for w in reachable_not.json()["warnings"] if w.startswith("model_name_or_path")]
    assert "could not check 'org/not-cached'" in warning and "could not be reached from the API" in warning

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    problems = refused(api.post("/v1/jobs", json={"spec": spec}))
    assert [p["field"] for p in problems] == ["spec.model_name_or_path"]
    assert (
        "'org/not-cached' is neither a folder in GLUEJOBS_MODELS_DIR nor in the Hub cache, and the API "
        in (problems[0]["message"])
    )
    assert "offline (HF_HUB_OFFLINE)" in problems[0]["message"]


def test_a_stray_label_is_named_with_its_row_and_near_match_before_training(
    api: httpx.Client, settings: Settings, db: Database, tmp_path: Path
) -> None:
    """`positive ` once among 400 rows of pos/neg: refused on submit and on the dry run naming row
    213 and `pos`, from a data-folder file and from an upload (whose answer warns with the row);
    keep_labels says it is a class, and the plan then trains three."""
    stray_file(settings.data_dir / "stray.csv")
    spec: dict[str, Any] = {**SPEC, "model_name_or_path": TINY_MODEL, "train_file": "stray.csv"}
    for params in ({}, {"dry_run": "true"}):
        problems = refused(api.post("/v1/jobs", params=params, json={"spec": spec}))
        assert [(p["field"], p["code"]) for p in problems] == [("spec.train_file", "stray_label")], problems
        message = problems[0]["message"]
        assert f"label 'positive ' on row {STRAY_ROW} (1 of {ROWS})" in message, message
        assert "abbreviation" in message and "'pos'" in message and "keep_labels" in message
    assert count_rows(db, Job) == 0

    uploaded = upload(api, settings.data_dir / "stray.csv")
    assert uploaded.status_code == 201, uploaded.text
    warned = [w["message"] for w in uploaded.json()["warnings"] if w["code"] == "label_near_duplicate"]
    assert any(
        w.startswith("label 'positive ' (1 rows)") and f"'positive ' on row {STRAY_ROW};" in w for w in warned
    ), warned
    on_upload = {**spec, "train_file": uploaded.json()["id"]}
    problems = refused(api.post("/v1/jobs", json={"spec": on_upload}))
    assert [p["code"] for p in problems] == ["stray_label"]
    assert f"on row {STRAY_ROW}" in problems[0]["message"] and "'pos'" in problems[0]["message"]

    kept = {**spec, "keep_labels": ["positive "]}
    plan = api.post("/v1/jobs", params={"dry_run": "true"}, json={"spec": kept})
    assert plan.status_code == 200, plan.text
    assert plan.json()["data"]["label_names"] == ["neg", "pos", "positive "]
    assert api.post("/v1/jobs", json={"spec": kept}).status_code == 201
