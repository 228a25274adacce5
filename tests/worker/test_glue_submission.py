"""do_predict writes GLUE's submission files; GET /v1/submissions bundles them into GLUE's zip.

Each task's files come from a real (tiny) training run in this process on a GLUE folder in the
release layout: the kit's tasks with test splits made from dev rows without labels, in GLUE's test
layout (an id column, no label), plus small QQP, RTE, WNLI and MNLI (with a diagnostic set) folders
made of the kit's sentences, since the kit has none of those.
"""

from __future__ import annotations

import csv
import io
import re
import shutil
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from fastapi.testclient import TestClient
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from service.main import create_app
from shared import jobs_repo
from shared.core.config import Settings
from shared.core.db import Database
from shared.core.tables import JobStatus
from shared.data.reading import GLUE_LAYOUTS
from shared.jobspec.spec import JobSpec
from shared.jobspec.tasks import GLUE_SUBMISSIONS, TASKS
from tests.support.dbutil import claimed
from tests.support.e2e import LOOPBACK_URL
from tests.support.runs import RecordingReporter, reset_accelerate_state
from worker.training.loop import run_training

TEST_ROWS = 20
# Ids that are not 0..n-1, so a file whose ids were counted instead of read would show it.
IDS = [str(1000 + 7 * i) for i in range(TEST_ROWS)]
LABEL_FORMATS = {
    "cola": r"[01]",
    "sst2": r"[01]",
    "mrpc": r"[01]",
    "qqp": r"[01]",
    "wnli": r"[01]",
    "stsb": r"[0-5]\.\d{3}",
    "qnli": r"entailment|not_entailment",
    "rte": r"entailment|not_entailment",
    "mnli": r"entailment|neutral|contradiction",
}
FILES = {
    "cola": ["CoLA.tsv"],
    "sst2": ["SST-2.tsv"],
    "mrpc": ["MRPC.tsv"],
    "stsb": ["STS-B.tsv"],
    "qnli": ["QNLI.tsv"],
    "qqp": ["QQP.tsv"],
    "rte": ["RTE.tsv"],
    "wnli": ["WNLI.tsv"],
    "mnli": ["MNLI-m.tsv", "MNLI-mm.tsv", "AX.tsv"],
}
KIT_TASKS = ("cola", "sst2", "mrpc", "stsb", "qnli")


def read_tsv(path: Path, **options: Any) -> pd.DataFrame:
    return pd.read_csv(
        path,
        sep="\t",
        quoting=csv.QUOTE_NONE,
        dtype=str,
        keep_default_na=False,
        encoding="utf-8-sig",
        **options,
    )


def write_rows(path: Path, header: list[str], rows: list[list[str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join("\t".join(row) for row in [header, *rows]) + "\n", encoding="utf-8")


def link(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(source)


def build_glue_folder(root: Path, kit: Path) -> dict[str, pd.DataFrame]:
    """A GLUE copy with test files for every task; the test rows (id + texts) of each test file."""
    tests: dict[str, pd.DataFrame] = {}

    def test_file(folder: str, name: str, frame: pd.DataFrame) -> None:
        write_rows(root / folder / name, list(frame.columns), frame.to_numpy().tolist())
        tests[f"{folder}/{name}"] = frame

    for task, folder in (
        ("cola", "CoLA"),
        ("sst2", "SST-2"),
        ("mrpc", "MRPC"),
        ("stsb", "STS-B"),
        ("qnli", "QNLI"),
    ):
        link(
            kit / folder / "train.tsv" if task != "qnli" else kit / folder / "dev.tsv",
            root / folder / "train.tsv",
        )
        link(kit / folder / "dev.tsv", root / folder / "dev.tsv")
        if task == "cola":  # CoLA's train/dev have no header; its test file has one
            dev = read_tsv(
                kit / folder / "dev.tsv", header=None, names=["source", "label", "original", "sentence"]
            )
        else:
            dev = read_tsv(kit / folder / "dev.tsv")
        dev = dev.head(TEST_ROWS)
        # GLUE's test layout: the dev columns without the label, an id column first.
        texts = {
            "cola": ["sentence"],
            "sst2": ["sentence"],
            "mrpc": ["#1 ID", "#2 ID", "#1 String", "#2 String"],
            "stsb": [
                "genre",
                "filename",
                "year",
                "old_index",
                "source1",
                "source2",
                "sentence1",
                "sentence2",
            ],
            "qnli": ["question", "sentence"],
        }[task]
        test_file(folder, "test.tsv", pd.DataFrame({"index": IDS, **{c: dev[c].tolist() for c in texts}}))

    # The kit has no QQP, RTE, WNLI or MNLI: small folders in their layouts, of MRPC's sentence pairs.
    mrpc = read_tsv(kit / "MRPC" / "dev.tsv")
    first, second = mrpc["#1 String"].tolist(), mrpc["#2 String"].tolist()

    def pairs(start: int, count: int) -> list[tuple[str, str]]:
        return list(zip(first[start : start + count], second[start : start + count], strict=True))

    labelled = pairs(0, 48)
    unlabelled = pairs(100, TEST_ROWS)
    for folder, labels in (("RTE", ("entailment", "not_entailment")), ("WNLI", ("0", "1"))):
        rows = [[str(i), a, b, labels[i % 2]] for i, (a, b) in enumerate(labelled)]
        for name in ("train.tsv", "dev.tsv"):
            write_rows(root / folder / name, ["index", "sentence1", "sentence2", "label"], rows)
        test_file(
            folder,
            "test.tsv",
            pd.DataFrame(
                {
                    "index": IDS,
                    "sentence1": [a for a, _ in unlabelled],
                    "sentence2": [b for _, b in unlabelled],
                }
            ),
        )
    qqp = [[str(i), str(2 * i), str(2 * i + 1), a, b, str(i % 2)] for i, (a, b) in enumerate(labelled)]
    for name in ("train.tsv", "dev.tsv"):
        write_rows(root / "QQP" / name, ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"], qqp)
    test_file(
        "QQP",
        "test.tsv",
        pd.DataFrame(
            {"id": IDS, "question1": [a for a, _ in unlabelled], "question2": [b for _, b in unlabelled]}
        ),
    )
    mnli_columns = [
        "index",
        "promptID",
        "pairID",
        "genre",
        "sentence1_binary_parse",
        "sentence2_binary_parse",
        "sentence1_parse",
        "sentence2_parse",
        "sentence1",
        "sentence2",
    ]
    mnli_labels = ("entailment", "neutral", "contradiction")

    def mnli_rows(items: list[tuple[str, str]], ids: list[str]) -> list[list[str]]:
        return [
            [i, i, f"{i}e", "fiction", "( x )", "( y )", "(ROOT x)", "(ROOT y)", a, b]
            for i, (a, b) in zip(ids, items, strict=True)
        ]

    numbered = [str(i) for i in range(len(labelled))]
    write_rows(
        root / "MNLI" / "train.tsv",
        [*mnli_columns, "label1", "gold_label"],
        [
            [*row, mnli_labels[i % 3], mnli_labels[i % 3]]
            for i, row in enumerate(mnli_rows(labelled, numbered))
        ],
    )
    for name in ("dev_matched.tsv", "dev_mismatched.tsv"):
        write_rows(
            root / "MNLI" / name,
            [*mnli_columns, "label1", "gold_label"],
            [
                [*row, mnli_labels[i % 3], mnli_labels[i % 3]]
                for i, row in enumerate(mnli_rows(labelled, numbered))
            ],
        )
    for name, start in (("test_matched.tsv", 100), ("test_mismatched.tsv", 150)):
        rows = mnli_rows(pairs(start, TEST_ROWS), IDS)
        test_file("MNLI", name, pd.DataFrame(rows, columns=mnli_columns))
    test_file(
        "diagnostic",
        "diagnostic.tsv",
        pd.DataFrame(
            {
                "index": IDS,
                "sentence1": [a for a, _ in pairs(200, TEST_ROWS)],
                "sentence2": [b for _, b in pairs(200, TEST_ROWS)],
            }
        ),
    )
    return tests


@dataclass
class Predicted:
    glue_dir: Path
    tests: dict[str, pd.DataFrame]
    outputs: dict[str, Path]  # task -> the job folder its run wrote into
    logs: dict[str, list[str]]


@pytest.fixture(scope="module")
def predicted(
    tmp_path_factory: pytest.TempPathFactory, glue_data: Path, models_dir: Path
) -> Iterator[Predicted]:
    """Every task trained for two steps on the tiny model, with do_predict."""
    root = tmp_path_factory.mktemp("submission")
    glue = root / "glue"
    tests = build_glue_folder(glue, glue_data)
    settings = Settings(glue_dir=glue, data_dir=root, models_dir=models_dir, cache_dir=root / "cache")
    outputs, logs = {}, {}
    for task in FILES:
        spec = JobSpec(
            model_name_or_path="tiny-bert",
            task_name=task,
            max_train_samples=16,
            per_device_train_batch_size=8,
            per_device_eval_batch_size=8,
            max_train_steps=2,
            learning_rate=1e-3,
            eval_strategy="no",
            save_strategy="no",
            do_predict=True,
            seed=3,
        )
        outputs[task] = root / "jobs" / task
        reporter = RecordingReporter()
        run_training(spec, settings, output_dir=outputs[task], reporter=reporter)
        logs[task] = reporter.logs
        reset_accelerate_state()  # one Accelerator per process, as in a child
    yield Predicted(glue, tests, outputs, logs)


TEST_SOURCES = {
    "CoLA.tsv": "CoLA/test.tsv",
    "SST-2.tsv": "SST-2/test.tsv",
    "MRPC.tsv": "MRPC/test.tsv",
    "STS-B.tsv": "STS-B/test.tsv",
    "QNLI.tsv": "QNLI/test.tsv",
    "QQP.tsv": "QQP/test.tsv",
    "RTE.tsv": "RTE/test.tsv",
    "WNLI.tsv": "WNLI/test.tsv",
    "MNLI-m.tsv": "MNLI/test_matched.tsv",
    "MNLI-mm.tsv": "MNLI/test_mismatched.tsv",
    "AX.tsv": "diagnostic/diagnostic.tsv",
}


def test_the_submission_table_and_the_glue_layouts_name_the_same_test_splits() -> None:
    assert set(GLUE_SUBMISSIONS) == set(GLUE_LAYOUTS) == set(TASKS) == set(FILES)
    for task, submission in GLUE_SUBMISSIONS.items():
        assert [split for split, _ in submission.files] == list(GLUE_LAYOUTS[task].test_splits)
        assert [name for _, name in submission.files] == [n for n in FILES[task] if n != "AX.tsv"]


@pytest.mark.parametrize("task", list(FILES))
def test_each_task_writes_glues_file_name_header_ids_and_label_format(
    predicted: Predicted, task: str
) -> None:
    folder = predicted.outputs[task]

    written = sorted(p.name for p in folder.glob("*.tsv"))

    assert written == sorted(FILES[task])
    for name in FILES[task]:
        lines = (folder / name).read_text().splitlines()
        assert lines[0] == "index\tprediction"
        rows = [line.split("\t") for line in lines[1:]]
        test_rows = predicted.tests[TEST_SOURCES[name]]
        id_column = "id" if task == "qqp" else "index"
        assert [row[0] for row in rows] == test_rows[id_column].tolist() == IDS  # the file's ids, its order
        assert all(re.fullmatch(LABEL_FORMATS[task], row[1]) for row in rows), rows
        assert any(name in message for message in predicted.logs[task])
    assert not (folder / "predict_results.tsv").exists()  # that file is test_file's, not do_predict's


@pytest.mark.parametrize(
    ("task", "name", "columns"),
    [
        ("stsb", "STS-B.tsv", ["sentence1", "sentence2"]),
        ("mrpc", "MRPC.tsv", ["#1 String", "#2 String"]),
        ("rte", "RTE.tsv", ["sentence1", "sentence2"]),
    ],
)
def test_the_predictions_are_the_saved_models_row_by_row(
    predicted: Predicted, task: str, name: str, columns: list[str]
) -> None:
    """The model saved in the job folder, run on the test rows in the file's order, gives the file."""
    folder = predicted.outputs[task]
    test_rows = predicted.tests[TEST_SOURCES[name]]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()

    with torch.no_grad():
        encoded = tokenizer(
            *(test_rows[c].tolist() for c in columns),
            padding=True,
            truncation=True,
            max_length=128,
            return_tensors="pt",
        )
        logits = model(**encoded).logits
    written = [line.split("\t")[1] for line in (folder / name).read_text().splitlines()[1:]]

    if task == "stsb":
        expected = logits[:, 0].clamp(0.0, 5.0).tolist()
        assert [float(w) for w in written] == pytest.approx(expected, abs=1.5e-3)
    else:
        names = TASKS[task].label_names
        assert names is not None
        ids = logits.argmax(dim=-1).tolist()
        expected_labels = [names[i] for i in ids] if task == "rte" else [str(i) for i in ids]
        assert written == expected_labels


# ---------------------------------------------------------------------------------------------------
# GET /v1/submissions: the zip GLUE accepts, on both databases
# ---------------------------------------------------------------------------------------------------


@pytest.fixture
def client(settings: Settings, db: Database) -> TestClient:
    return TestClient(create_app(settings, db), base_url=LOOPBACK_URL)


def finished_job(
    db: Database, settings: Settings, task: str, output_dir: Path, *, do_predict: bool = True
) -> int:
    """A job as a worker leaves it: claimed, its folder in the store (the local one), succeeded."""
    with db.session() as session:
        job = jobs_repo.create_job(
            session,
            spec={"model_name_or_path": "tiny-bert", "task_name": task, "do_predict": do_predict, "seed": 3},
        )
        claim = claimed(session, job.id)
        shutil.copytree(output_dir, settings.job_dir(job.id))
        jobs_repo.set_output_dir(session, claim=claim, output_dir=str(settings.job_dir(job.id)))
        jobs_repo.finish_job(session, claim=claim, status=JobStatus.succeeded)
    return job.id


def test_a_complete_bundle_is_glues_zip(
    client: TestClient, db: Database, settings: Settings, predicted: Predicted
) -> None:
    ids = [finished_job(db, settings, task, predicted.outputs[task]) for task in FILES]

    response = client.get("/v1/submissions", params={"jobs": ",".join(map(str, ids))})

    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/zip"
    archive = zipfile.ZipFile(io.BytesIO(response.content))
    assert sorted(archive.namelist()) == sorted(TEST_SOURCES)  # the eleven files, at the top level
    for task, names in FILES.items():
        for name in names:
            assert archive.read(name) == (predicted.outputs[task] / name).read_bytes()


def test_a_bundle_with_a_task_twice_is_refused(
    client: TestClient, db: Database, settings: Settings, predicted: Predicted
) -> None:
    first = finished_job(db, settings, "cola", predicted.outputs["cola"])
    again = finished_job(db, settings, "cola", predicted.outputs["cola"])
    others = [finished_job(db, settings, task, predicted.outputs[task]) for task in FILES if task != "cola"]

    response = client.get("/v1/submissions", params={"jobs": ",".join(map(str, [first, *others, again]))})

    assert response.status_code == 422
    error = response.json()["error"]
    assert error["field"] == "jobs"
    assert f"CoLA by jobs {first}, {again}" in error["message"]


def test_a_bundle_with_tasks_missing_names_them_unless_partial(
    client: TestClient, db: Database, settings: Settings, predicted: Predicted
) -> None:
    ids = [finished_job(db, settings, task, predicted.outputs[task]) for task in KIT_TASKS]

    refused = client.get("/v1/submissions", params={"jobs": ",".join(map(str, ids))})
    partial = client.get(
        "/v1/submissions", params=[*(("jobs", str(i)) for i in ids), ("allow_partial", "true")]
    )

    assert refused.status_code == 422
    message = refused.json()["error"]["message"]
    for missing in (
        "QQP.tsv (qqp)",
        "MNLI-m.tsv (mnli)",
        "MNLI-mm.tsv (mnli)",
        "RTE.tsv (rte)",
        "WNLI.tsv (wnli)",
        "AX.tsv",
    ):
        assert missing in message
    assert "CoLA.tsv" not in message
    assert partial.status_code == 200
    assert sorted(zipfile.ZipFile(io.BytesIO(partial.content)).namelist()) == sorted(
        name for task in KIT_TASKS for name in FILES[task]
    )


def test_jobs_without_prediction_files_are_refused(
    client: TestClient, db: Database, settings: Settings, predicted: Predicted, tmp_path: Path
) -> None:
    empty = tmp_path / "no-predictions"
    empty.mkdir()
    without = finished_job(db, settings, "rte", empty, do_predict=False)
    with db.session() as session:
        queued = jobs_repo.create_job(
            session, spec={"model_name_or_path": "tiny-bert", "task_name": "sst2"}
        ).id

    no_files = client.get("/v1/submissions", params={"jobs": str(without), "allow_partial": "true"})
    not_done = client.get("/v1/submissions", params={"jobs": str(queued), "allow_partial": "true"})
    bad_id = client.get("/v1/submissions", params={"jobs": "1,x"})
    missing = client.get("/v1/submissions", params={"jobs": "99999"})

    assert (
        no_files.status_code == 422
        and f"job {without} (rte) has no RTE.tsv" in no_files.json()["error"]["message"]
    )
    assert (
        not_done.status_code == 422
        and "has not succeeded (it is queued)" in not_done.json()["error"]["message"]
    )
    assert bad_id.status_code == 422 and bad_id.json()["error"]["field"] == "jobs"
    assert missing.status_code == 404
