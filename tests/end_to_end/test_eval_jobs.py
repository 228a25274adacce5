"""Evaluation and prediction jobs (do_train false, issue 33 item 2): the spec's rules, the scripts' flags
as pasted, and the loop's run without an optimizer step on a model a training job saved."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gluejobs.cli.script_args import command_to_spec
from shared.core.config import Settings
from shared.jobspec.capability import is_off
from shared.jobspec.spec import TRAINING_ONLY_OPTIONS, JobSpec, job_kind
from tests.support.kit import TINY_MODEL
from tests.support.runs import make_spec, train

BASE = {"model_name_or_path": "m", "task_name": "sst2", "seed": 1}


def _spec(**changes: Any) -> JobSpec:
    return JobSpec.model_validate({**BASE, **changes})


def _refusals(**changes: Any) -> dict[str, str]:
    with pytest.raises(ValidationError) as caught:
        _spec(**changes)
    return {str(error["loc"][0]) if error["loc"] else "": error["msg"] for error in caught.value.errors()}


def test_a_job_that_does_not_train_is_an_evaluation_or_a_prediction() -> None:
    evaluation = _spec(do_train=False, do_eval=True)
    prediction = _spec(do_train=False, do_predict=True, test_file="new.csv")
    both = _spec(do_train="false", do_eval="true", do_predict=True)

    assert [job_kind(s) for s in (evaluation, prediction, both, _spec())] == [
        "eval",
        "predict",
        "eval",
        "train",
    ]
    # No evaluation during training, no checkpoint: filled in, and the stored spec reads back the same.
    assert (evaluation.eval_strategy, evaluation.save_strategy, evaluation.do_eval) == ("no", "no", True)
    assert (prediction.do_eval, prediction.predicts_glue_test) == (False, False)  # its test_file, not GLUE's
    assert both.predicts_glue_test
    for spec in (evaluation, prediction, both):
        stored = spec.model_dump(mode="json")
        assert JobSpec.model_validate(stored) == spec
        # The stored marker is not an "off" value: a worker built before these jobs hands them back
        # (shared/jobspec/capability.py) rather than dropping do_train false and training.
        assert not is_off(stored["job_kind"]) and job_kind(stored) == job_kind(spec)
    assert _spec().job_kind is None and job_kind(_spec().model_dump(mode="json")) == "train"
    # The trainer recipe's and fast's evaluation settings apply; their training ones do not.
    fast = _spec(do_train=False, do_eval=True, recipe="trainer", fast=True)
    assert (fast.seed, fast.bf16, fast.per_device_eval_batch_size, fast.group_eval_by_length) == (
        1,
        True,
        64,
        True,
    )
    assert (fast.save_strategy, fast.max_grad_norm, fast.group_by_length, fast.logging_steps) == (
        "no",
        None,
        False,
        10,
    )


def test_what_a_job_without_training_cannot_honour_is_refused_by_name() -> None:
    assert "give do_eval" in _refusals(do_train=False)["do_train"]
    assert "give do_eval" in _refusals(do_train=False, do_eval=False)["do_train"]
    found = _refusals(
        do_train=False,
        do_eval=True,
        learning_rate=1e-3,
        num_train_epochs=1,
        apply_lora=True,
        train_file="train.csv",
        eval_strategy="epoch",
        save_strategy="steps",
        save_steps=10,
    )
    for name in ("learning_rate", "num_train_epochs", "apply_lora", "train_file", "save_steps"):
        assert found[name] == f"{name} is a training option: a job with do_train false does not train"
    assert "eval_strategy 'epoch' needs training" in found["eval_strategy"]
    assert "save_strategy 'steps' needs training" in found["save_strategy"]
    # Without a task the job reads its own files (labels by the model's config): it needs them.
    own = _refusals(task_name=None, do_train=False, do_eval=True, do_predict=True)
    assert "evaluates its validation_file" in own["validation_file"]
    assert "predicts its test_file" in own["test_file"]
    assert "task_name" not in own
    assert _spec(task_name=None, do_train=False, do_eval=True, validation_file="v.csv").job_kind == "eval"
    # The marker is the API's to fill in.
    assert "here 'eval'" in _refusals(do_train=False, do_eval=True, job_kind="predict")["job_kind"]
    assert "a job that trains has none" in _refusals(job_kind="eval")["job_kind"]
    # Every option in the table is a field with a default (so "set" means "not its default").
    assert set(TRAINING_ONLY_OPTIONS) <= set(JobSpec.model_fields)


@pytest.mark.parametrize(
    ("command", "do_train", "kind"),
    [
        ("python run_glue.py --model_name_or_path m --task_name rte --do_eval", "false", "eval"),
        (
            "python run_glue.py --model_name_or_path m --task_name rte --do_predict --test_file t.csv",
            "false",
            "predict",
        ),
        ("--model_name_or_path m --task_name rte --do_eval --do_predict", "false", "eval"),
        (
            "python run_glue.py --model_name_or_path m --task_name rte --do_train false --do_eval",
            "false",
            "eval",
        ),
        ("python run_glue.py --model_name_or_path m --task_name rte --do_train --do_eval", None, "train"),
        ("run_glue_no_trainer.py --model_name_or_path m --task_name rte", None, "train"),
    ],
)
def test_the_scripts_flags_as_pasted(command: str, do_train: str | None, kind: str) -> None:
    translation = command_to_spec(shlex.split(command))

    assert translation.spec.get("do_train") == do_train
    assert job_kind(JobSpec.model_validate({**translation.spec, "seed": 1})) == kind
    if do_train == "false" and "--do_train" not in command:  # what the command line is taken to mean
        assert any("without --do_train: an evaluation or prediction job" in n for n in translation.notes)


def test_an_evaluation_job_reproduces_the_training_jobs_final_evaluation(
    settings_factory: Any, models_dir: Path, tmp_path: Path
) -> None:
    """Train the tiny model, then evaluate its saved final model and predict a file with it: the same
    metrics on the same validation rows, exactly; one prediction per row, by label name."""
    models = tmp_path / "models"
    shutil.copytree(models_dir / TINY_MODEL, models / TINY_MODEL)
    settings: Settings = settings_factory(f"sqlite:///{tmp_path / 'unused.db'}", models_dir=models)
    trained, trained_result, trained_dir = train(make_spec(), settings, models, name="trained")
    final = trained_result["final_metrics"]
    assert final and set(final) == {"accuracy", "loss"}

    (settings.data_dir / "new").mkdir(parents=True)
    (settings.data_dir / "new" / "rows.csv").write_text("sentence\na lovely film\na dreadful film\nfine\n")
    spec = make_spec(
        model_name_or_path="trained",
        do_train=False,
        do_eval=True,
        do_predict=True,
        test_file="new/rows.csv",
        max_train_samples=None,  # make_spec's training options, back to their defaults
        learning_rate=5e-5,
        num_train_epochs=3,
        logging_steps=10,
    )
    reporter, result, output_dir = train(spec, settings, tmp_path, name="evaluated")

    evaluated = {name: value for _, _, split, name, value in reporter.rows if split == "eval"}
    assert evaluated == final  # exactly: the same weights on the same 32 rows
    assert reporter.steps("eval") == [0] and {row[1] for row in reporter.rows} == {0}
    assert reporter.steps("train") == [] and reporter.checkpoints == []
    assert result["completed_steps"] == 0 and result["final_metrics"] == final and "model_dir" not in result
    lines = (output_dir / "predict_results.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 4
    assert all(line.split("\t")[1] in {"negative", "positive"} for line in lines[1:])
    # Nothing but the predictions: no checkpoint folder, no model files.
    assert sorted(p.name for p in output_dir.iterdir()) == ["predict_results.tsv"]
    assert any("no training (do_train false)" in line for line in reporter.logs)
    assert trained.steps("eval")[-1] == trained_result["completed_steps"]
    assert (trained_dir / "config.json").is_file()

    # Without a task_name: the same 32 validation rows as a file of one's own, its labels read by the
    # model's config (id2label negative/positive; names and ids both), under a column of its own.
    dev = (settings.glue_dir / "SST-2" / "dev.tsv").read_text().splitlines()[1:33]
    names = {"0": "negative", "1": "positive"}
    rows = "".join(
        f"{text}\t{names[label] if i % 2 else label}\n"
        for i, (text, label) in enumerate(line.rsplit("\t", 1) for line in dev)
    )
    (settings.data_dir / "new" / "dev.tsv").write_text("review\tverdict\n" + rows)
    (settings.data_dir / "new" / "unlabelled.csv").write_text("review\na lovely film\nawful\n")
    own = make_spec(
        model_name_or_path="trained",
        task_name=None,
        validation_file="new/dev.tsv",
        test_file="new/unlabelled.csv",
        text_column="review",
        label_column="verdict",
        do_train=False,
        do_eval=True,
        do_predict=True,
        max_train_samples=None,
        learning_rate=5e-5,
        num_train_epochs=3,
        logging_steps=10,
    )
    reporter, result, own_dir = train(own, settings, tmp_path, name="own-file")
    evaluated = {name: value for _, _, split, name, value in reporter.rows if split == "eval"}
    assert evaluated["accuracy"] == final["accuracy"] and evaluated["loss"] == final["loss"]
    lines = (own_dir / "predict_results.tsv").read_text().splitlines()  # by the model's label names
    assert len(lines) == 3 and all(line.split("\t")[1] in {"negative", "positive"} for line in lines[1:])

    # A label the model does not have: refused naming the file's field and the model's labels.
    (settings.data_dir / "new" / "bad.tsv").write_text("review\tverdict\na film\tneutral\n")
    from worker.training.data import DataError, load_raw_data

    with pytest.raises(DataError) as refused:
        load_raw_data(
            own.model_copy(update={"validation_file": "new/bad.tsv"}),
            settings,
            model_folder=str(models / "trained"),
        )
    assert refused.value.field == "validation_file"
    assert "'neutral' on row 1 is not one of the model's labels" in refused.value.message
    assert "0 negative, 1 positive" in refused.value.message


@pytest.mark.e2e
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # nothing here is the database's
def test_evaluation_and_prediction_jobs_through_the_api_and_a_worker(
    settings: Settings, tmp_path: Path
) -> None:
    """One API and one worker run: the dry run plans no optimizer step; bad specs get a 422 naming each
    field; an evaluation job and a prediction job on an uploaded test file run as jobs do, write their
    metric rows at step 0 and their predictions, and save no checkpoint."""
    from tests.support.e2e import all_metrics, get, live_api, run_worker_until_idle, submit

    spec = {"model_name_or_path": TINY_MODEL, "task_name": "mrpc", "do_train": False, "seed": 1}
    evaluation = {**spec, "do_eval": True, "max_eval_samples": 40, "per_device_eval_batch_size": 16}
    with live_api(settings) as client:
        response = client.post("/v1/jobs", params={"dry_run": "true"}, json={"spec": evaluation})
        assert response.status_code == 200, response.text
        plan = response.json()
        schedule = plan["schedule"]
        assert (schedule["kind"], schedule["total_optimizer_steps"], schedule["evaluation_steps"]) == (
            "eval",
            0,
            [0],
        )
        assert schedule["checkpoints"] == 0 and schedule["eval_batches"] == {"eval": 3}
        assert "train" not in plan["data"]["splits"] and "train" not in plan["data"]["unread"]
        assert plan["tokens"]["status"] == "measured" and "eval" in plan["tokens"]
        assert plan["memory"]["bytes"]["gradients"] == plan["memory"]["bytes"]["optimizer"] == 0
        assert not plan["warnings"]

        refused = client.post("/v1/jobs", json={"spec": {**spec, "learning_rate": 0.1}})
        assert refused.status_code == 422
        fields = {problem["field"] for problem in refused.json()["error"]["errors"]}
        assert fields == {"spec.do_train", "spec.learning_rate"}

        rows = "sentence1,sentence2\nHe left.,He went away.\nIt rains.,The sun is out.\nA cat.,A cat sat.\n"
        upload = client.post(
            "/v1/files", files={"file": ("pairs.csv", rows.encode())}, data={"purpose": "test"}
        )
        assert upload.status_code == 201, upload.text
        evaluated = submit(client, evaluation)
        predicted = submit(client, {**spec, "do_predict": True, "test_file": upload.json()["id"]})

        # Without a task_name: an uploaded validation file read by the model's labels (its config's
        # id2label: LABEL_0, LABEL_1, or their ids); a label it lacks is refused naming both.
        own = {"model_name_or_path": TINY_MODEL, "do_train": False, "do_eval": True, "seed": 1}
        labelled = rows.replace("sentence2\n", "sentence2,label\n").replace(".\n", ".,{}\n")
        good = labelled.format("LABEL_1", "0", "1").encode()
        bad = labelled.format("LABEL_1", "maybe", "1").encode()
        ids = [
            client.post("/v1/files", files={"file": (name, body)}, data={"purpose": "validation"})
            for name, body in (("own.csv", good), ("bad.csv", bad))
        ]
        assert [r.status_code for r in ids] == [201, 201], [r.text for r in ids]
        refused = client.post("/v1/jobs", json={"spec": {**own, "validation_file": ids[1].json()["id"]}})
        assert refused.status_code == 422, refused.text
        (problem,) = refused.json()["error"]["errors"]
        assert problem["field"] == "spec.validation_file"
        assert "label 'maybe' on row" in problem["message"]  # an upload is read by its tally: row ?
        assert "is not one of the model's labels" in problem["message"]
        assert "0 LABEL_0, 1 LABEL_1" in problem["message"]
        own = {**own, "validation_file": ids[0].json()["id"]}
        planned = client.post("/v1/jobs", params={"dry_run": "true"}, json={"spec": own})
        assert planned.status_code == 200, planned.text
        assert planned.json()["data"]["label_names"] == ["LABEL_0", "LABEL_1"]
        own_file = submit(client, own)
        assert own_file["spec"]["job_kind"] == "eval" and own_file["spec"]["task_name"] is None
        assert (evaluated["spec"]["job_kind"], predicted["spec"]["job_kind"]) == ("eval", "predict")
        assert evaluated["spec"]["save_strategy"] == evaluated["spec"]["eval_strategy"] == "no"

        run_worker_until_idle(settings, tmp_path / "worker.log")

        evaluated, predicted = (get(client, f"/v1/jobs/{job['id']}") for job in (evaluated, predicted))
        assert (evaluated["status"], predicted["status"]) == ("succeeded", "succeeded"), (
            evaluated["error"],
            predicted["error"],
        )
        metric_rows = all_metrics(client, evaluated["id"])
        assert {(r["split"], r["step"], r["epoch"]) for r in metric_rows} == {("eval", 0, 0)}
        assert {r["name"] for r in metric_rows} == {"accuracy", "f1", "combined_score", "loss"}
        assert evaluated["result"]["completed_steps"] == 0 and evaluated["result"]["eval_rows"] == {
            "eval": 40
        }
        assert all_metrics(client, predicted["id"]) == []
        for job in (evaluated, predicted):
            assert get(client, f"/v1/jobs/{job['id']}/checkpoints")["data"] == []
        artifacts = {a["path"] for a in get(client, f"/v1/jobs/{predicted['id']}/artifacts")["data"]}
        assert "predict_results.tsv" in artifacts
        text = client.get(f"/v1/jobs/{predicted['id']}/artifacts/predict_results.tsv").text
        lines = text.splitlines()
        assert lines[0] == "index\tprediction" and len(lines) == 4
        assert all(line.split("\t")[1] in {"equivalent", "not_equivalent"} for line in lines[1:])
        own_file = get(client, f"/v1/jobs/{own_file['id']}")
        assert own_file["status"] == "succeeded", own_file["error"]
        assert own_file["result"]["eval_rows"] == {"eval": 3}
        assert {r["step"] for r in all_metrics(client, own_file["id"])} == {0}


def test_the_cli_shows_what_a_job_does() -> None:
    """`gluejobs ls` and `show` name the kind (one rule: job_kind) and count no steps for an evaluation."""
    from gluejobs.cli import job_view
    from gluejobs.client import Job

    stored = _spec(do_train=False, do_eval=True).model_dump(mode="json")
    job = Job.from_json(
        {
            "id": 4,
            "status": "succeeded",
            "spec": stored,
            "latest_metrics": {"eval": {"accuracy": 0.5, "step": 0}},
        }
    )
    training = Job.from_json({"id": 5, "status": "queued", "spec": _spec().model_dump(mode="json")})

    row = dict(zip(job_view.LS_COLUMNS, job_view.ls_row(job), strict=True))
    assert (row["kind"], row["progress"]) == ("eval", "evaluated")
    assert dict(zip(job_view.LS_COLUMNS, job_view.ls_row(training), strict=True))["kind"] == "train"
    shown = "\n".join(job_view.summary(job, []))
    assert "eval: evaluates the model as loaded, no training (do_train false)" in shown
    plan = {
        "status": "known",
        "kind": "eval",
        "evaluations": 1,
        "eval_batches": {"eval": 3},
        "predicted_rows": None,
    }
    assert job_view._schedule_line(plan, stored) == (
        "schedule: no training (eval): 0 optimizer steps, 1 evaluation at step 0 (eval 3 batches), "
        "0 checkpoints"
    )


def test_the_leaderboard_ranks_training_runs_not_evaluations() -> None:
    """An evaluation job (do_train false) on a task has the metrics of the model it loaded: it is not a
    training run, so it is no leaderboard entry of its own (the job that trained the model is)."""
    from service.research.leaderboard import build_leaderboard, is_ranked_job
    from shared.core.tables import Job, JobStatus

    def job(job_id: int, accuracy: float, **spec: Any) -> Job:
        return Job(
            id=job_id,
            spec={"model_name_or_path": "m", "task_name": "sst2", **spec},
            status=JobStatus.succeeded,
            best_metrics={"metrics": {"accuracy": accuracy}},
            latest_metrics={"eval": {"accuracy": accuracy}},
            sweep_id=None,
            rerun_of=None,
        )

    trained = job(1, 0.8, learning_rate=1e-3)
    evaluation = job(2, 0.9, do_train=False, do_eval=True, job_kind="eval")
    assert is_ranked_job(trained) and not is_ranked_job(evaluation)
    boards = build_leaderboard(
        [trained, evaluation], [], baseline_of=lambda _spec: None, task_baseline=lambda _task: None
    )
    assert [entry["id"] for entry in boards[0]["entries"]] == [1]


def test_an_evaluation_job_stops_between_batches_when_asked(
    settings_factory: Any, models_dir: Path, tmp_path: Path
) -> None:
    """A stop request (the worker shutting down) reaches an evaluation job between two batches: it
    stops with nothing to save and writes no metric row (the next attempt evaluates again); a cancel
    is SIGINT, which stops any job's process at once."""
    from tests.support.runs import RecordingReporter
    from worker.training.loop import Preempted, run_training

    settings: Settings = settings_factory(f"sqlite:///{tmp_path / 'unused.db'}")
    spec = make_spec(
        do_train=False,
        do_eval=True,
        per_device_eval_batch_size=4,  # 8 batches of the 32 rows
        max_train_samples=None,
        learning_rate=5e-5,
        num_train_epochs=3,
        logging_steps=10,
    )
    asked = iter([False, False, True])
    reporter = RecordingReporter()
    with pytest.raises(Preempted) as stopped:
        run_training(
            spec,
            settings,
            output_dir=tmp_path / "stopped",
            reporter=reporter,
            stop_requested=lambda: next(asked, True),
        )
    assert stopped.value.checkpoint is None and "between evaluation batches" in str(stopped.value)
    assert reporter.rows == []
