"""One's own column names: text_column / text_pair_column / label_column (AutoTrain's convention) in
the spec, in uploads (POST /v1/files form fields), dry runs and jobs a real worker trains; the 422
that names a file's columns and the flags that map them; the CLI's flags reaching the spec."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest
from pydantic import ValidationError

from gluejobs import Client
from gluejobs.cli import main as cli
from gluejobs.cli.script_args import command_to_spec
from shared.core.config import Settings
from shared.data.reading import DataError, read_job_data
from shared.jobspec.spec import JobSpec
from tests.support.e2e import get, live_api, run_worker_until_idle, submit
from tests.support.kit import GLUE_DATA, TINY_MODEL

ROWS = 48


def sst2_rows(count: int = ROWS) -> list[tuple[str, str]]:
    """Real SST-2 rows as a product team's file has them: (review, 'positive'/'negative')."""
    with (GLUE_DATA / "SST-2" / "train.tsv").open(encoding="utf-8") as handle:
        reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        next(reader)
        rows = [next(reader) for _ in range(count)]
    return [(text.strip(), "positive" if label == "1" else "negative") for text, label in rows]


def write_reviews(path: Path, count: int = ROWS) -> Path:
    frame = pd.DataFrame(sst2_rows(count), columns=["review", "sentiment"])
    if path.suffix == ".csv":
        frame.to_csv(path, index=False)
    elif path.suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True)
    else:
        frame.to_parquet(path)
    return path


UNMAPPED = (
    "has no 'label' column (its columns: review, sentiment); map yours with --text_column review "
    '--label_column sentiment (spec: "text_column": "review", "label_column": "sentiment")'
)
MAPPING = {"text_column": "review", "label_column": "sentiment"}


def upload(api: httpx.Client, path: Path, **fields: str) -> httpx.Response:
    return api.post("/v1/files", files={"file": (path.name, path.read_bytes())}, data=fields)


# --- end to end: upload, dry run and a real worker's training ---------------------------------------


@pytest.mark.e2e  # a live API and a real worker
# One database: the mapping's upload checks, dry run and training are above the database, whose reads
# and writes have their tests on both; a second end-to-end run repeated the same API and worker
# (issue 36, item 7).
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_review_sentiment_csv_is_uploaded_dry_run_and_trained_through_the_mapping(
    settings: Settings, tmp_path: Path
) -> None:
    reviews = write_reviews(tmp_path / "reviews.csv")
    spec = {
        "model_name_or_path": TINY_MODEL,
        "per_device_train_batch_size": 16,
        "num_train_epochs": 1,
        "save_strategy": "no",
        "seed": 3,
    }
    with live_api(settings) as api:
        refused = upload(api, reviews)
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["message"] == f"file 'reviews.csv' {UNMAPPED}"

        uploaded = upload(api, reviews, **MAPPING)
        assert uploaded.status_code == 201, uploaded.text
        checks = uploaded.json()["checks"]
        counts = pd.Series([label for _, label in sst2_rows()]).value_counts().to_dict()
        assert checks["label_counts"] == counts and checks["columns"] == MAPPING
        assert checks["text_columns"] == ["review"]
        file_id = uploaded.json()["id"]

        # A job on the file without the mapping is told the upload's, naming the spec's field.
        job_spec = {**spec, "train_file": file_id, "validation_file": file_id}
        unmapped = api.post("/v1/jobs", json={"spec": job_spec})
        assert unmapped.status_code == 422, unmapped.text
        error = unmapped.json()["error"]
        assert error == {
            **error,
            "field": "spec.train_file",
            "message": f"train_file {file_id} ('reviews.csv') was uploaded with its labels in column "
            "'sentiment': map yours with --text_column review --label_column sentiment (spec: "
            '"text_column": "review", "label_column": "sentiment")',
        }
        # A mapping naming a column the file lacks is refused by name, with its near match.
        typo = api.post("/v1/jobs", json={"spec": {**job_spec, **MAPPING, "label_column": "sentimnt"}})
        assert typo.status_code == 422, typo.text
        assert (
            "has no column 'sentimnt' (label_column; its columns: review, sentiment); did you mean "
            "'sentiment'?" in typo.json()["error"]["message"]
        )
        # Mapping two roles onto one column is refused by name.
        clash = api.post(
            "/v1/jobs", json={"spec": {**job_spec, "text_column": "review", "label_column": "review"}}
        )
        assert clash.status_code == 422 and clash.json()["error"]["field"] == "spec.label_column", clash.text

        mapped = {**job_spec, **MAPPING}
        plan = api.post("/v1/jobs", params={"dry_run": "true"}, json={"spec": mapped})
        assert plan.status_code == 200, plan.text
        data = plan.json()["data"]
        assert data["text_columns"] == ["review"] and data["label_names"] == ["negative", "positive"]
        assert data["splits"]["train"]["label_counts"] == counts
        assert plan.json()["tokens"]["train"]["rows_measured"] > 0

        job = submit(api, mapped)
        assert job["spec"]["text_column"] == "review" and job["spec"]["label_column"] == "sentiment"
        run_worker_until_idle(settings, tmp_path / "worker.log")
        done = get(api, f"/v1/jobs/{job['id']}")
        assert done["status"] == "succeeded", done.get("error")
        assert done["best_metrics"]["metric"] == "accuracy"  # evaluated on the mapped validation file

        # A rerun carries the mapping (it is the spec's).
        rerun = api.post(f"/v1/jobs/{job['id']}/rerun")
        assert rerun.status_code == 201, rerun.text
        assert rerun.json()["spec"]["label_column"] == "sentiment"


# --- the reading rule: jsonl and parquet, tasks, uploads checked by another column --------------------


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_jsonl_and_parquet_files_are_read_through_the_mapping(tmp_path: Path, suffix: str) -> None:
    write_reviews(tmp_path / f"reviews{suffix}")
    settings = Settings(data_dir=tmp_path, cache_dir=tmp_path / "cache")
    own = JobSpec(
        model_name_or_path=TINY_MODEL,
        train_file=f"reviews{suffix}",
        validation_file=f"reviews{suffix}",
        **MAPPING,
    )
    data = read_job_data(own, settings)
    assert data.text_keys == ("review", None) and data.label_names == ["negative", "positive"]
    assert data.train is not None and data.train.texts["review"].iloc[0] == sst2_rows(1)[0][0]
    expected = [1 if label == "positive" else 0 for _, label in sst2_rows()]
    assert data.train.labels is not None and data.train.labels.tolist() == expected

    with pytest.raises(DataError) as unmapped:
        read_job_data(own.model_copy(update={"text_column": None, "label_column": None}), settings)
    assert UNMAPPED in unmapped.value.message


def test_a_task_reads_its_text_from_the_mapped_column(tmp_path: Path) -> None:
    frame = pd.DataFrame(
        {"review": [t for t, _ in sst2_rows()], "stars": [int(s == "positive") for _, s in sst2_rows()]}
    )
    frame.to_json(tmp_path / "sst.jsonl", orient="records", lines=True)
    settings = Settings(data_dir=tmp_path, cache_dir=tmp_path / "cache", glue_dir=GLUE_DATA)
    spec = JobSpec(
        model_name_or_path=TINY_MODEL, task_name="sst2", train_file="sst.jsonl", eval_strategy="no"
    )
    with pytest.raises(DataError) as unmapped:
        read_job_data(spec, settings)
    assert unmapped.value.message == (
        "train_file 'sst.jsonl' has no 'label' column (its columns: review, stars); map yours with "
        '--text_column review --label_column stars (spec: "text_column": "review", "label_column": "stars")'
    )
    data = read_job_data(spec.model_copy(update={"text_column": "review", "label_column": "stars"}), settings)
    assert data.text_keys == ("sentence", None) and data.train is not None
    assert data.train.texts["sentence"].iloc[0] == sst2_rows(1)[0][0]


def test_a_mapping_that_cannot_work_is_refused_by_field() -> None:
    base = {"model_name_or_path": TINY_MODEL, "train_file": "a.csv", "validation_file": "b.csv"}
    cases = [
        ({"text_column": "t", "label_column": "t"}, "label_column", "both name column 't'"),
        ({"text_column": "t", "text_pair_column": "t"}, "text_pair_column", "both name column 't'"),
        ({"text_pair_column": "t"}, "text_pair_column", "give text_column too"),
        ({"task_name": "sst2", "text_column": "a", "text_pair_column": "b"}, "text_pair_column", "one text"),
    ]
    for changes, field, words in cases:
        with pytest.raises(ValidationError) as refused:
            JobSpec.model_validate({**base, **changes})
        (error,) = refused.value.errors()
        assert error["loc"] == (field,) and words in error["msg"], error
    # AutoTrain's name for the label column is taken too.
    assert JobSpec.model_validate({**base, "target_column": "y"}).label_column == "y"


def test_a_job_mapping_other_labels_than_its_upload_was_tallied_by_is_told_how(
    settings_factory: Any, sqlite_url: str, tmp_path: Path
) -> None:
    settings: Settings = settings_factory(sqlite_url)
    frame = pd.DataFrame({"review": [t for t, _ in sst2_rows()], "sentiment": [s for _, s in sst2_rows()]})
    frame["stars"] = (frame["sentiment"] == "positive").astype(int) + 3
    frame.to_parquet(tmp_path / "reviews.parquet")
    with live_api(settings) as api:
        file_id = upload(api, tmp_path / "reviews.parquet", **MAPPING).json()["id"]
        spec = {
            "model_name_or_path": TINY_MODEL,
            "train_file": file_id,
            "eval_strategy": "no",
            "text_column": "review",
            "label_column": "stars",
        }
        answer = api.post("/v1/jobs", params={"dry_run": "true"}, json={"spec": spec})
        assert answer.status_code == 422, answer.text
        assert (
            "was checked with its labels in column 'sentiment', not 'stars': map yours with "
            "--label_column sentiment" in answer.json()["error"]["message"]
        )
        # Sent again with the other mapping, the same file is tallied by it.
        again = upload(api, tmp_path / "reviews.parquet", text_column="review", label_column="stars")
        assert again.status_code == 200 and again.json()["id"] == file_id, again.text
        stars = {str(k): int(v) for k, v in sorted(frame["stars"].value_counts().items())}
        assert again.json()["checks"]["label_counts"] == stars
        plan = api.post("/v1/jobs", params={"dry_run": "true"}, json={"spec": spec})
        assert plan.status_code == 200, plan.text
        assert plan.json()["data"]["label_names"] == ["3", "4"]

        # Sweeps and searches carry the mapping into every job (it is the spec's), and do not search it.
        sweep = api.post("/v1/sweeps", json={"spec": spec, "seeds": [1, 2]})
        assert sweep.status_code == 201, sweep.text
        searched = {**spec, "eval_strategy": "epoch", "validation_file": file_id}
        lr = {"type": "float", "low": 1e-5, "high": 1e-3, "log": True}
        search = api.post(
            "/v1/searches", json={"spec": searched, "space": {"learning_rate": lr}, "n_trials": 2}
        )
        assert search.status_code == 201, search.text
        for job_id in [*sweep.json()["job_ids"], *search.json()["job_ids"]]:
            job_spec = api.get(f"/v1/jobs/{job_id}").json()["spec"]
            assert (job_spec["text_column"], job_spec["label_column"]) == ("review", "stars")
        over_columns = api.post(
            "/v1/searches",
            json={"spec": searched, "space": {"label_column": {"type": "categorical", "choices": ["stars"]}}},
        )
        assert over_columns.status_code == 422 and "cannot be searched" in over_columns.text


# --- the command line ---------------------------------------------------------------------------------


def test_the_cli_flags_reach_the_spec_and_the_upload(
    settings_factory: Any, sqlite_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    words = "python run_glue_no_trainer.py --model_name_or_path m --train_file t.csv --text-column review "
    spec = command_to_spec(
        [*words.split(), "--text_pair_column", "title", "--target-column", "sentiment"]
    ).spec
    assert (spec["text_column"], spec["text_pair_column"], spec["label_column"]) == (
        "review",
        "title",
        "sentiment",
    )

    settings: Settings = settings_factory(sqlite_url)
    reviews = write_reviews(tmp_path / "reviews.csv")
    with live_api(settings) as http:
        url = str(http.base_url)
        assert cli(["files", "upload", "--url", url, str(reviews)]) != 0
        assert UNMAPPED in capsys.readouterr().err
        assert (
            cli(
                [
                    "files",
                    "upload",
                    "--url",
                    url,
                    str(reviews),
                    "--text-column",
                    "review",
                    "--label_column",
                    "sentiment",
                ]
            )
            == 0
        )
        assert "labels: negative" in capsys.readouterr().out
        flags = [
            "--model_name_or_path",
            TINY_MODEL,
            "--train_file",
            str(reviews),
            "--validation_file",
            str(reviews),
            "--text_column",
            "review",
            "--label-column",
            "sentiment",
            "--max_train_steps",
            "1",
        ]
        assert cli(["submit", "--url", url, *flags]) == 0
        with Client(url) as client:
            (job,) = list(client.jobs.list())
            (file,) = list(client.files.list())  # the upload above, reused: checked with this mapping
    assert (job.spec["text_column"], job.spec["label_column"]) == ("review", "sentiment")
    assert job.spec["train_file"] == file.id and file.checks["columns"] == MAPPING
