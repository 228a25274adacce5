"""The recipes' semantics in the training loop, DB-free: gradient clipping, early stopping,
deterministic runs, experiment trackers, and checkpoints that are models."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from shared.core.config import Settings
from tests.support.kit import TINY_MODEL
from tests.support.runs import RecordingReporter, make_spec, resume, saving_spec, train
from worker.training.checkpoints import checkpoint_path
from worker.training.progress import Progress


@pytest.fixture
def bert_with_head(train_settings: Settings) -> str:
    """tiny-bert with an SST-2 head already in its checkpoint, so every starting weight is on disk."""
    name = "tiny-bert-sst2-head"
    folder = train_settings.models_dir / name
    if not folder.is_dir():
        model = AutoModelForSequenceClassification.from_pretrained(
            train_settings.models_dir / TINY_MODEL,
            num_labels=2,
            id2label={0: "negative", 1: "positive"},
            label2id={"negative": 0, "positive": 1},
        )
        model.save_pretrained(folder)
        AutoTokenizer.from_pretrained(train_settings.models_dir / TINY_MODEL).save_pretrained(folder)
    return name


# ---------------------------------------------------------------------------------------------------
# Clipping
# ---------------------------------------------------------------------------------------------------


def test_max_grad_norm_clips_the_update_and_logs_the_norm_before_clipping(
    train_settings: Settings, tmp_path: Path, bert_with_head: str
) -> None:
    max_norm, lr, eps = 0.01, 1.0, 1.0
    spec = make_spec(
        model_name_or_path=bert_with_head,
        max_train_steps=1,
        learning_rate=lr,
        adam_epsilon=eps,
        lr_scheduler_type="constant",
        optim="adamw_torch",
        max_grad_norm=max_norm,
        eval_strategy="no",
    )

    reporter, _, output_dir = train(spec, train_settings, tmp_path)

    [(step, logged_norm)] = reporter.values("train", "grad_norm")
    assert step == 1 and logged_norm > 5 * max_norm  # the norm before clipping: clipping happened
    # AdamW's first step moves each weight by -lr · g/(|g| + eps), g the (clipped) gradient, without
    # weight decay here; so each weight's move gives back its gradient: g = eps · u/(1 − |u|), u = -Δ/lr.
    before = load_file(train_settings.models_dir / bert_with_head / "model.safetensors")
    after = load_file(output_dir / "model.safetensors")
    squares = 0.0
    for name, start in before.items():
        u = (start.double() - after[name].double()) / lr
        squares += float(((eps * u / (1 - u.abs())) ** 2).sum())
    clipped_norm = math.sqrt(squares)
    # torch's clip_grad_norm_ scales by max_norm / (norm + 1e-6).
    assert clipped_norm == pytest.approx(max_norm * logged_norm / (logged_norm + 1e-6), rel=1e-3)


def test_without_max_grad_norm_nothing_is_clipped_or_logged(train_settings: Settings, tmp_path: Path) -> None:
    reporter, _, _ = train(make_spec(max_train_steps=2, eval_strategy="no"), train_settings, tmp_path)

    assert reporter.values("train", "grad_norm") == []
    assert len(reporter.values("train", "loss")) == 2


# ---------------------------------------------------------------------------------------------------
# Early stopping
# ---------------------------------------------------------------------------------------------------


def test_early_stopping_stops_after_patience_evaluations_without_improvement(
    train_settings: Settings, tmp_path: Path
) -> None:
    # A learning rate too small to change a prediction: accuracy never improves after the first evaluation.
    spec = make_spec(
        learning_rate=1e-9,
        max_train_steps=20,
        eval_strategy="steps",
        eval_steps=1,
        save_strategy="steps",
        save_steps=1,
        early_stopping_patience=2,
        metric_for_best_model="accuracy",
    )

    reporter, result, _ = train(spec, train_settings, tmp_path)

    accuracy = reporter.values("eval", "accuracy")
    assert [step for step, _ in accuracy] == [1, 2, 3]  # best at 1, then 2 evaluations without improvement
    assert len({value for _, value in accuracy}) == 1
    assert result["completed_steps"] == 3 and result["stopped_early"] is True
    assert result["best_step"] == 1
    assert [c["step"] for c in reporter.checkpoints] == [
        1,
        2,
        3,
    ]  # the stopping step is saved, as Trainer does
    assert any(line.startswith("early stopping at step 3") for line in reporter.logs)


@pytest.mark.parametrize(
    ("values", "metric", "threshold", "counts"),
    [
        ([0.5, 0.6, 0.6, 0.55, 0.7], "accuracy", 0.0, [0, 0, 1, 2, 0]),
        # Improving by no more than the threshold counts as no improvement (EarlyStoppingCallback).
        ([0.5, 0.505, 0.52, 0.528], "accuracy", 0.01, [0, 1, 0, 1]),
        ([1.0, 0.9, 0.95, 0.85], "loss", 0.0, [0, 0, 1, 0]),  # a loss improves downwards
    ],
)
def test_evaluations_without_improvement_are_counted_as_trainer_counts_them(
    values: list[float], metric: str, threshold: float, counts: list[int]
) -> None:
    progress = Progress(steps_per_epoch=1, ranking=metric)
    seen = []
    for step, value in enumerate(values, start=1):
        progress.completed_steps = step
        progress.record_evaluation({metric: value}, threshold=threshold)
        seen.append(progress.evaluations_without_improvement)

    assert seen == counts
    best = max(values) if metric == "accuracy" else min(values)
    assert progress.best_value == best  # the best checkpoint is chosen without the threshold


# ---------------------------------------------------------------------------------------------------
# Determinism
# ---------------------------------------------------------------------------------------------------


class DeterminismRecordingReporter(RecordingReporter):
    modes: list[bool]

    def __init__(self) -> None:
        super().__init__()
        self.modes = []

    def metrics(self, **kwargs: Any) -> None:
        self.modes.append(torch.are_deterministic_algorithms_enabled())
        super().metrics(**kwargs)


def test_deterministic_runs_with_the_same_seed_give_identical_rows(
    train_settings: Settings, tmp_path: Path
) -> None:
    spec = make_spec(
        use_deterministic_algorithms=True, max_train_steps=4, eval_strategy="steps", eval_steps=2
    )
    from worker.training.loop import run_training

    runs = []
    for name in ("first", "second"):
        reporter = DeterminismRecordingReporter()
        run_training(spec, train_settings, output_dir=tmp_path / name, reporter=reporter)
        runs.append(reporter)

    assert runs[0].rows == runs[1].rows  # every train and eval row, exactly
    assert {split for _, _, split, _, _ in runs[0].rows} == {"train", "eval"}
    assert all(runs[0].modes) and runs[0].modes  # deterministic kernels throughout the run
    assert not torch.are_deterministic_algorithms_enabled()  # and the process's setting back afterwards


def test_the_runner_starts_deterministic_jobs_with_the_recipes_environment() -> None:
    from worker.training.determinism import job_environment

    assert job_environment({"use_deterministic_algorithms": True}) == {
        "CUBLAS_WORKSPACE_CONFIG": ":16:8",
        "PYTHONHASHSEED": "0",
    }
    assert job_environment({"use_deterministic_algorithms": False}) == {}


# ---------------------------------------------------------------------------------------------------
# Trackers
# ---------------------------------------------------------------------------------------------------


def test_tensorboard_and_mlflow_receive_the_runs_config_and_metrics(
    train_settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    store = f"file:{tmp_path / 'mlruns'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps its file store for tests like this
    spec = make_spec(
        task_name="mrpc",
        max_train_steps=4,
        eval_strategy="steps",
        eval_steps=2,
        report_to=["tensorboard", "mlflow"],
    )

    reporter, _, output_dir = train(spec, train_settings, tmp_path)

    events = list((output_dir / "tensorboard").rglob("events.out.tfevents.*"))
    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in events:
        accumulator = EventAccumulator(str(path))
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend((e.step, e.value) for e in accumulator.Scalars(tag))
    for tag, split, name in [
        *(("eval/" + name, "eval", name) for name in ("accuracy", "f1", "combined_score", "loss")),
        ("train/loss", "train", "loss"),
    ]:
        logged = sorted(scalars[tag])
        expected = reporter.values(split, name)
        assert [step for step, _ in logged] == [step for step, _ in expected]
        assert [value for _, value in logged] == pytest.approx([value for _, value in expected])

    client = MlflowClient(tracking_uri=store)
    [experiment] = [e for e in client.search_experiments() if e.name == "gluejobs"]
    [run] = client.search_runs([experiment.experiment_id])
    assert run.data.params["learning_rate"] == "0.001" and run.data.params["task_name"] == "mrpc"
    assert run.data.tags["mlflow.runName"] == f"job {output_dir.name}"
    history = client.get_metric_history(run.info.run_id, "eval/f1")
    assert [(m.step, m.value) for m in history] == reporter.values("eval", "f1")
    assert run.info.status == "FINISHED"


def test_a_tracker_the_worker_lacks_fails_the_job_by_name(train_settings: Settings, tmp_path: Path) -> None:
    from shared.core.errors import JobFailed

    with pytest.raises(JobFailed, match="tracker 'wandb' is not installed on this worker"):
        train(make_spec(report_to=["wandb"]), train_settings, tmp_path)


# ---------------------------------------------------------------------------------------------------
# Checkpoints are models
# ---------------------------------------------------------------------------------------------------


def _predict(model: Any, tokenizer: Any) -> torch.Tensor:
    batch = tokenizer(["a lovely, moving film", "a dull mess"], padding=True, return_tensors="pt")
    model.eval()
    with torch.no_grad():
        return model(**batch).logits


def test_a_checkpoint_loads_with_from_pretrained_and_predicts(
    train_settings: Settings, tmp_path: Path
) -> None:
    spec = make_spec(max_train_steps=4, save_strategy="steps", save_steps=2, eval_strategy="no")

    _, _, output_dir = train(spec, train_settings, tmp_path)

    folder = checkpoint_path(output_dir / "checkpoints", 4)
    model = AutoModelForSequenceClassification.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    logits = _predict(model, tokenizer)
    assert logits.shape == (2, 2)
    # The last checkpoint holds the final weights: it predicts exactly what the job's model does.
    final = AutoModelForSequenceClassification.from_pretrained(output_dir)
    assert torch.equal(logits, _predict(final, tokenizer))
    assert model.config.id2label == {0: "negative", 1: "positive"}
    # Beside the model, what resuming needs; the weights are stored once.
    names = {p.name for p in folder.iterdir()}
    assert {"optimizer.bin", "scheduler.bin", "gluejobs_state.json", "tokenizer.json"} <= names
    assert [n for n in names if n.endswith((".safetensors", ".bin")) and "model" in n] == [
        "model.safetensors"
    ]
    assert (
        naming(train_settings.models_dir, folder, output_dir) == []
    )  # no server path in config or tokenizer


def test_a_lora_checkpoint_is_an_adapter_that_peft_loads_and_resuming_from_it_is_exact(
    train_settings: Settings, tmp_path: Path
) -> None:
    from peft import PeftModel

    spec = saving_spec(
        2, apply_lora=True, lora_r=4, lora_target_modules=["query", "value"], max_train_steps=4
    )
    whole, _, output_dir = train(spec, train_settings, tmp_path, name="whole")
    folder = checkpoint_path(output_dir / "checkpoints", 4)

    base = AutoModelForSequenceClassification.from_pretrained(
        train_settings.models_dir / TINY_MODEL, num_labels=2
    )
    model = PeftModel.from_pretrained(base, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert (folder / "adapter_model.safetensors").is_file() and not (folder / "model.safetensors").exists()
    final = PeftModel.from_pretrained(
        AutoModelForSequenceClassification.from_pretrained(
            train_settings.models_dir / TINY_MODEL, num_labels=2
        ),
        output_dir,
    )
    assert torch.equal(_predict(model, tokenizer), _predict(final, tokenizer))
    # The adapter names its base as the job did, not by this worker's path to it.
    for saved in (folder, output_dir):
        assert (
            json.loads((saved / "adapter_config.json").read_text())["base_model_name_or_path"] == TINY_MODEL
        )
    assert naming(train_settings.models_dir, folder, output_dir) == []

    resumed, result, _ = resume(spec, train_settings, tmp_path, output_dir / "checkpoints", 2)
    assert [s for s, _ in resumed.values("train", "loss")] == [3, 4]
    assert resumed.series("train", "loss") == pytest.approx(whole.series("train", "loss")[2:], rel=1e-5)
    assert result["lora_params"] > 0


def naming(root: Path, *folders: Path) -> list[str]:
    """The files in `folders` that name `root` (the worker's models folder): a saved model must name
    its base as the job did."""
    needle = str(root).encode()
    return [
        p.name for folder in folders for p in folder.iterdir() if p.is_file() and needle in p.read_bytes()
    ]
