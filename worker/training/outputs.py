"""What a run leaves behind once it trained: the final model (the best checkpoint's, on request),
predictions (GLUE's submission files, test_file's predict_results.tsv) and the summary that becomes
the job's `result`."""

from __future__ import annotations

import resource
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerBase

from shared.core.artifact_links import artifact_path, download_command
from shared.core.config import Settings
from shared.core.errors import JobFailed
from shared.jobspec.spec import JobSpec
from worker.training.batches import collator
from worker.training.checkpointing import RunCheckpoints
from worker.training.data import RawData, TokenizedData, in_row_order, longest_first
from worker.training.glue_predictions import write_glue_submission
from worker.training.job_storage import JobStorage
from worker.training.lora_sources import is_adapter
from worker.training.meter import Meter
from worker.training.model_manifest import write_model_manifest
from worker.training.modeling import save_model_files
from worker.training.progress import Progress
from worker.training.reporter import MainProcessReporter


@dataclass(frozen=True, kw_only=True)
class ModelOutputs:
    """What every output of a run reads: the model as prepared, its tokenizer, the job's spec, where
    its files go and where it says what it wrote (one value rather than the same six arguments to
    each function here)."""

    accelerator: Accelerator
    model: Any
    tokenizer: PreTrainedTokenizerBase
    spec: JobSpec
    report: MainProcessReporter
    storage: JobStorage


def final_model(out: ModelOutputs, *, progress: Progress, saved: RunCheckpoints) -> dict[str, float]:
    """Save the final model (the best checkpoint's, on request); the evaluation of its weights."""
    final_metrics = progress.eval_metrics.get(progress.completed_steps, {})
    if out.spec.load_best_model_at_end and progress.best_step is not None:
        saved.load_best()
        final_metrics = progress.eval_metrics.get(progress.best_step, final_metrics)
        out.report.log(
            f"loaded the best checkpoint (step {progress.best_step}, {progress.ranking} "
            f"{progress.best_value:.4f}) for the final model"
        )
    _save_final_model(out)
    return final_metrics


def _save_final_model(out: ModelOutputs) -> None:
    accelerator, tokenizer, spec, report = out.accelerator, out.tokenizer, out.spec, out.report
    output_dir, job_id = out.storage.local, out.storage.job_id
    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(out.model)
    if accelerator.is_main_process:
        # LoRA: this saves the adapter (and the trained classifier), not the frozen backbone.
        save_model_files(unwrapped, tokenizer, output_dir)
        what = "LoRA adapter" if spec.apply_lora else "model"
        report.log(
            f"saved the {what} and tokenizer: {download_command(job_id)} (files at {artifact_path(job_id)})"
        )
        if spec.apply_lora and spec.save_merged_model:
            merged_dir = output_dir / "merged"
            unwrapped.merge_and_unload().save_pretrained(str(merged_dir))
            tokenizer.save_pretrained(str(merged_dir))
            write_model_manifest(merged_dir)  # what job:ID of a LoRA job starts from, by hash
            report.log(f"saved the model with the adapter merged in: {artifact_path(job_id, 'merged')}/…")
    accelerator.wait_for_everyone()


def save_merged_source(out: ModelOutputs) -> None:
    """A job with do_train false and save_merged_model: the LoRA job's adapter it loaded (merged into
    its base: worker/training/lora_sources.py), saved as a full model in merged/ with this job's label names,
    beside its manifest, as a LoRA job's merged model is: a merge on request of any LoRA job's final
    adapter or checkpoint."""
    accelerator, spec = out.accelerator, out.spec
    if not is_adapter(spec.registered_model):
        raise JobFailed(
            f"save_merged_model: {spec.model_name_or_path} is not a LoRA job's adapter but a full model "
            "already (download it as it is)",
            field="save_merged_model",
        )
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        merged_dir = out.storage.local / "merged"
        save_model_files(accelerator.unwrap_model(out.model), out.tokenizer, merged_dir)
        out.report.log(
            f"saved the adapter merged into its base: {artifact_path(out.storage.job_id, 'merged')}/…"
        )
    accelerator.wait_for_everyone()


def write_predictions(out: ModelOutputs, *, settings: Settings, raw: RawData, data: TokenizedData) -> None:
    """GLUE's submission file(s) for the task's test split, and test_file's predictions."""
    accelerator, model, tokenizer, spec = out.accelerator, out.model, out.tokenizer, out.spec
    output_dir, job_id = out.storage.local, out.storage.job_id
    if spec.predicts_glue_test:
        write_glue_submission(accelerator, model, tokenizer, spec, settings, output_dir, out.report.log)
    if data.test is None:
        return
    # Like run_glue.py's predict_results file.
    test = data.test.remove_columns([c for c in data.test.column_names if c == "labels"])
    order = None
    if spec.group_eval_by_length:
        test, order = longest_first(test)
    collate = collator(tokenizer, pad_to_max_length=spec.pad_to_max_length, pad_to_multiple_of=None)
    dataloader = accelerator.prepare(
        DataLoader(test, collate_fn=collate, batch_size=spec.per_device_eval_batch_size)
    )
    model.eval()
    outputs = []
    with torch.no_grad():
        for batch in dataloader:
            outputs.append(accelerator.gather_for_metrics(model(**batch).logits.float()).cpu())
    restored = torch.cat(outputs)
    logits = (in_row_order(restored, order) if order is not None else restored).numpy()
    if accelerator.is_main_process:
        path = output_dir / "predict_results.tsv"
        label_names = raw.label_names
        with path.open("w") as tsv:
            tsv.write("index\tprediction\n")
            for index, row in enumerate(logits):
                if label_names is None:
                    tsv.write(f"{index}\t{float(row[0]):.3f}\n")
                else:
                    tsv.write(f"{index}\t{label_names[int(np.argmax(row))]}\n")
        out.report.log(f"wrote {len(logits)} test predictions: {artifact_path(job_id, path.name)}")


def evaluation_summary(
    accelerator: Accelerator,
    *,
    final_metrics: dict[str, float],
    parameter_counts: dict[str, Any],
    eval_runtime_s: float,
    predict_runtime_s: float,
    eval_rows: dict[str, int],
    tokenized_from_cache: bool,
) -> dict[str, Any]:
    """The summary of a job that did not train (do_train false): the job's `result`. No model_dir: the
    job saved no model (its model is the one it loaded)."""
    return {
        **parameter_counts,
        "completed_steps": 0,
        "epochs": 0,
        "final_metrics": final_metrics,
        "eval_rows": eval_rows,
        "eval_runtime_s": round(eval_runtime_s, 3),
        "predict_runtime_s": round(predict_runtime_s, 3),
        "tokenized_from_cache": tokenized_from_cache,
        "num_processes": accelerator.num_processes,
        "device": str(accelerator.device),
        "mixed_precision": accelerator.mixed_precision,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def summary(
    out: ModelOutputs,
    *,
    progress: Progress,
    meter: Meter,
    final_metrics: dict[str, float],
    parameter_counts: dict[str, Any],
    peak_flops: float | None,
    tokenized_from_cache: bool,
) -> dict[str, Any]:
    """The run's summary: the job's `result`."""
    accelerator = out.accelerator
    return {
        **parameter_counts,
        "completed_steps": progress.completed_steps,
        "epochs": progress.epoch,
        "stopped_early": progress.stopped_early,
        **meter.summary(accelerator.unwrap_model(out.model), peak_flops),
        "final_metrics": final_metrics,
        "best_step": progress.best_step,
        "model_dir": str(out.storage.local),
        "tokenized_from_cache": tokenized_from_cache,
        "num_processes": accelerator.num_processes,
        "device": str(accelerator.device),
        "mixed_precision": accelerator.mixed_precision,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
