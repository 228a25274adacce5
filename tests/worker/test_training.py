"""The training loop itself, DB-free: a tiny BERT on real GLUE rows, with a reporter that records.

These pin the script behaviours the service promises: the schedule's arithmetic, warmup, gradient
accumulation, max_train_steps, weight-decay groups, checkpoints and resuming, best-model loading,
mixed precision, LoRA, and the outputs.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch

from shared.core.config import Settings
from shared.core.errors import JobFailed
from tests.support.runs import TINY, RecordingReporter, make_spec, resume, saving_spec, train
from worker.training.checkpoints import saved_steps
from worker.training.loop import Preempted, run_training
from worker.training.modeling import ModelError, optimizer_parameter_groups


def test_schedule_accumulation_warmup_and_max_train_steps(train_settings: Settings, tmp_path: Path) -> None:
    # 64 rows / batch 8 = 8 batches; 2 batches per update → 4 updates per epoch; 5 steps → 2 epochs.
    spec = make_spec(gradient_accumulation_steps=2, max_train_steps=5, num_warmup_steps=2, num_train_epochs=9)

    reporter, result, _ = train(spec, train_settings, tmp_path)

    lrs = reporter.values("train", "learning_rate")
    assert [step for step, _ in lrs] == [1, 2, 3, 4, 5]
    # Linear warmup over 2 steps, then linear decay to 0 at step 5 (get_scheduler's "linear").
    assert [v for _, v in lrs] == pytest.approx([5e-4, 1e-3, 2e-3 / 3, 1e-3 / 3, 0.0])
    assert result["completed_steps"] == 5
    assert result["epochs"] == pytest.approx(1.25)
    assert result["train_samples"] == 5 * 2 * 8
    # One evaluation per epoch (two epochs were started) plus none extra: the last one was at step 5.
    assert [step for step, _ in reporter.values("eval", "accuracy")] == [4, 5]


def test_warmup_ratio_and_cosine(train_settings: Settings, tmp_path: Path) -> None:
    spec = make_spec(
        lr_scheduler_type="cosine",
        warmup_ratio=0.25,
        max_train_steps=8,
        num_train_epochs=2,
        eval_strategy="no",
    )

    reporter, _, _ = train(spec, train_settings, tmp_path)

    lrs = [v for _, v in reporter.values("train", "learning_rate")]
    assert lrs[:2] == pytest.approx([5e-4, 1e-3])  # ceil(0.25 × 8) = 2 warmup steps
    assert lrs[-1] == pytest.approx(0.0, abs=1e-12)
    assert all(a >= b for a, b in itertools.pairwise(lrs[1:]))  # decays after the warmup
    assert reporter.values("eval", "accuracy") == []


def test_training_loss_falls(train_settings: Settings, tmp_path: Path) -> None:
    # 32 rows, 10 epochs: even a tiny random BERT learns them by heart.
    spec = make_spec(
        num_train_epochs=10,
        max_train_samples=32,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        eval_strategy="no",
    )

    reporter, _, _ = train(spec, train_settings, tmp_path)

    losses = [v for _, v in reporter.values("train", "loss")]
    assert len(losses) == 40
    assert sum(losses[-4:]) / 4 < 0.5 * sum(losses[:4]) / 4


def test_metrics_are_the_tasks_and_the_model_is_saved(train_settings: Settings, tmp_path: Path) -> None:
    spec = make_spec(task_name="mrpc", max_train_samples=48)

    reporter, result, output_dir = train(spec, train_settings, tmp_path)

    eval_names = {name for _, _, split, name, _ in reporter.rows if split == "eval"}
    assert eval_names == {"accuracy", "f1", "combined_score", "loss"}
    assert (output_dir / "config.json").is_file() and (output_dir / "model.safetensors").is_file()
    assert (output_dir / "tokenizer.json").is_file()
    config = json.loads((output_dir / "config.json").read_text())
    assert config["id2label"] == {"0": "not_equivalent", "1": "equivalent"}
    assert result["trainable_params"] == result["total_params"] > 0


def test_weight_decay_spares_biases_and_layernorm(train_settings: Settings) -> None:
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(train_settings.models_dir / TINY)
    decay, no_decay = optimizer_parameter_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    no_decay_names = {names[id(p)] for p in no_decay["params"]}
    decay_names = {names[id(p)] for p in decay["params"]}

    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.01, 0.0)
    assert all(n.endswith("bias") or "LayerNorm" in n for n in no_decay_names)
    assert "bert.embeddings.LayerNorm.weight" in no_decay_names
    assert "bert.encoder.layer.0.attention.self.query.weight" in decay_names
    assert not any(n.endswith("bias") or "LayerNorm" in n for n in decay_names)
    assert len(decay_names) + len(no_decay_names) == len(names)


def test_checkpoints_rotation_and_best_model_at_end(train_settings: Settings, tmp_path: Path) -> None:
    spec = make_spec(
        num_train_epochs=3,
        save_strategy="epoch",
        save_total_limit=1,
        load_best_model_at_end=True,
        metric_for_best_model="loss",
    )

    reporter, result, output_dir = train(spec, train_settings, tmp_path)

    losses = dict(reporter.values("eval", "loss"))
    best_step = min(losses, key=losses.__getitem__)
    assert [c["step"] for c in reporter.checkpoints] == [8, 16, 24]
    assert [c["is_best"] for c in reporter.checkpoints] == [
        step == min((s for s in losses if s <= step), key=losses.__getitem__) for step in (8, 16, 24)
    ]
    # The newest and the best survive save_total_limit=1.
    kept = saved_steps(output_dir / "checkpoints")
    assert kept == sorted({24, best_step})
    assert sorted(reporter.deleted) == sorted({8, 16} - {best_step})
    assert result["best_step"] == best_step
    assert result["final_metrics"]["loss"] == losses[best_step]


def test_resume_continues_where_the_checkpoint_stopped(train_settings: Settings, tmp_path: Path) -> None:
    spec = saving_spec(3, max_train_steps=6, num_train_epochs=3)
    whole, whole_result, whole_dir = train(spec, train_settings, tmp_path, name="whole")

    resumed, result, _ = resume(spec, train_settings, tmp_path, whole_dir / "checkpoints", 3)

    # 32 rows / 8 = 4 updates per epoch: step 3 is inside epoch 1, so batches are skipped there.
    assert [s for s, _ in resumed.values("train", "loss")] == [4, 5, 6]
    for name in ("loss", "learning_rate"):
        assert resumed.series("train", name) == pytest.approx(whole.series("train", name)[3:], rel=1e-5)
    assert result["completed_steps"] == whole_result["completed_steps"] == 6
    assert any("resumed from checkpoint-3" in line for line in resumed.logs)


def test_a_stop_request_saves_a_checkpoint_at_that_step_and_resuming_finishes(
    train_settings: Settings, tmp_path: Path
) -> None:
    spec = make_spec(max_train_samples=48, save_strategy="epoch", eval_strategy="no")
    whole, _, _ = train(spec, train_settings, tmp_path, name="whole")
    asked = itertools.count(1)
    reporter = RecordingReporter()
    output_dir = tmp_path / "stopped"

    with pytest.raises(Preempted) as stopped:
        # Asked once per optimizer step: yes after the fourth.
        run_training(
            spec,
            train_settings,
            output_dir=output_dir,
            reporter=reporter,
            stop_requested=lambda: next(asked) >= 4,
        )

    assert stopped.value.step == 4
    assert saved_steps(output_dir / "checkpoints") == [4]
    assert [c["step"] for c in reporter.checkpoints] == [4]
    resumed, result, _ = resume(spec, train_settings, tmp_path, output_dir / "checkpoints", 4, name="stopped")
    assert [s for s, _ in resumed.values("train", "loss")] == [5, 6]
    assert resumed.series("train", "loss") == pytest.approx(whole.series("train", "loss")[4:], rel=1e-5)
    assert result["completed_steps"] == 6


def test_regression_on_stsb(train_settings: Settings, tmp_path: Path) -> None:
    spec = make_spec(task_name="stsb", num_train_epochs=1)

    reporter, _, output_dir = train(spec, train_settings, tmp_path)

    names = {name for _, _, split, name, _ in reporter.rows if split == "eval"}
    assert names == {"pearson", "spearmanr", "combined_score", "loss"}
    assert len(json.loads((output_dir / "config.json").read_text())["id2label"]) == 1


def test_lora_trains_adapters_and_classifier_only(train_settings: Settings, tmp_path: Path) -> None:
    spec = make_spec(
        apply_lora=True,
        lora_r=4,
        lora_alpha=8,
        lora_target_modules=["query", "value"],
        save_merged_model=True,
    )

    reporter, result, output_dir = train(spec, train_settings, tmp_path)

    assert 0 < result["trainable_params"] < result["total_params"] / 4
    assert any("trainable of" in line for line in reporter.logs)
    assert (output_dir / "adapter_config.json").is_file()
    assert (output_dir / "adapter_model.safetensors").is_file()
    assert (output_dir / "merged" / "model.safetensors").is_file()
    assert not (output_dir / "model.safetensors").exists()


def test_lora_with_unknown_target_modules_fails_clearly(train_settings: Settings, tmp_path: Path) -> None:
    spec = make_spec(apply_lora=True, lora_target_modules=["no_such_projection"])

    with pytest.raises(ModelError, match="LoRA could not be applied"):
        train(spec, train_settings, tmp_path)


def test_group_by_length_pads_less(train_settings: Settings, tmp_path: Path) -> None:
    plain = make_spec(max_train_samples=256, eval_strategy="no")
    grouped = make_spec(max_train_samples=256, eval_strategy="no", group_by_length=True)

    _, plain_result, _ = train(plain, train_settings, tmp_path, name="plain")
    _, grouped_result, _ = train(grouped, train_settings, tmp_path, name="grouped")

    assert plain_result["real_tokens"] == grouped_result["real_tokens"]
    assert grouped_result["padded_tokens"] < plain_result["padded_tokens"]


def test_pad_to_max_length_and_bf16_on_cpu(train_settings: Settings, tmp_path: Path) -> None:
    spec = make_spec(
        pad_to_max_length=True, max_length=32, bf16=True, max_train_samples=16, eval_strategy="no"
    )

    _, result, _ = train(spec, train_settings, tmp_path)

    assert result["padded_tokens"] == 16 * 32
    assert result["mixed_precision"] == "bf16"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error a worker without a GPU gives")
def test_fp16_without_a_gpu_fails_clearly(train_settings: Settings, tmp_path: Path) -> None:
    with pytest.raises(JobFailed, match="fp16 needs a CUDA GPU"):
        train(make_spec(fp16=True), train_settings, tmp_path)


def test_test_file_gets_predictions(train_settings: Settings, tmp_path: Path) -> None:
    (train_settings.data_dir / "sst2").mkdir(parents=True)
    (train_settings.data_dir / "sst2" / "test.csv").write_text("sentence\na lovely film\na dreadful film\n")
    spec = make_spec(test_file="sst2/test.csv")

    _, _, output_dir = train(spec, train_settings, tmp_path)

    lines = (output_dir / "predict_results.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction"
    assert len(lines) == 3
    assert all(line.split("\t")[1] in {"negative", "positive"} for line in lines[1:])


def test_a_model_that_does_not_load_fails_clearly(train_settings: Settings, tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="not found under GLUEJOBS_MODELS_DIR"):
        train(make_spec(model_name_or_path="no/such/model"), train_settings, tmp_path)


def _write_scores(settings: Settings) -> None:
    folder = settings.data_dir / "scores"
    folder.mkdir(parents=True)
    rows = "\n".join(
        f"sentence number {i} is {'great' if i % 3 else 'poor'},{(i % 3) * 2.5:.1f}" for i in range(48)
    )
    (folder / "train.csv").write_text("text,label\n" + rows + "\n")
    (folder / "dev.csv").write_text("text,label\n" + rows + "\n")


def test_own_score_files_rank_checkpoints_by_pearson(train_settings: Settings, tmp_path: Path) -> None:
    _write_scores(train_settings)
    spec = make_spec(
        task_name=None,
        train_file="scores/train.csv",
        validation_file="scores/dev.csv",
        max_train_samples=None,
        max_eval_samples=None,
        num_train_epochs=2,
        save_strategy="epoch",
        load_best_model_at_end=True,
    )

    reporter, result, _ = train(spec, train_settings, tmp_path)

    pearson = dict(reporter.values("eval", "pearson"))
    assert result["best_step"] == max(pearson, key=pearson.__getitem__)
    assert {name for _, _, split, name, _ in reporter.rows if split == "eval"} == {
        "pearson",
        "spearmanr",
        "combined_score",
        "mse",
        "loss",
    }


def test_best_metric_that_scores_do_not_report_fails_clearly(
    train_settings: Settings, tmp_path: Path
) -> None:
    _write_scores(train_settings)
    spec = make_spec(
        task_name=None,
        train_file="scores/train.csv",
        validation_file="scores/dev.csv",
        metric_for_best_model="accuracy",
    )

    with pytest.raises(
        JobFailed,
        match="'accuracy' is not reported by this job; it reports pearson, spearmanr, combined_score, mse",
    ):
        train(spec, train_settings, tmp_path)
