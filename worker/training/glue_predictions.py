"""do_predict on a GLUE task: predict its test split(s) and write the files GLUE's site expects.

The test rows come from the local GLUE copy's test files (GLUEJOBS_GLUE_DIR: an id column and no
labels), else from the Hub's test splits (`idx`, labels -1). MNLI predicts both test splits and,
when the data has it, GLUE's diagnostic set (AX.tsv). File names, header and label formats are
shared/research/glue_submission.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase, default_data_collator

from shared.core.config import Settings
from shared.data.reading import (
    DIAGNOSTIC_HUB_CONFIG,
    DIAGNOSTIC_SPLIT,
    GLUE_LAYOUTS,
    HUB_GLUE,
    DataError,
    PredictSplit,
    Table,
    predict_split,
    read_local_test_splits,
)
from shared.jobspec.spec import JobSpec
from shared.jobspec.tasks import DIAGNOSTIC_SUBMISSION_FILE, GLUE_SUBMISSIONS, TASKS, GlueTask
from shared.research.glue_submission import prediction_labels, write_submission_file
from worker.training.data import in_row_order, load_hub_glue, longest_first

HUB_ID_COLUMN = "idx"
MNLI = "mnli"


def write_glue_submission(
    accelerator: Accelerator,
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    spec: JobSpec,
    settings: Settings,
    output_dir: Path,
    log: Callable[[str], None],
) -> list[Path]:
    """Predict the task's test split(s) with the final model; the files written (on the main process)."""
    assert spec.task_name is not None, "do_predict on a GLUE task needs its task_name"
    task = TASKS[spec.task_name]
    file_names = dict(GLUE_SUBMISSIONS[task.name].files) | {DIAGNOSTIC_SPLIT: DIAGNOSTIC_SUBMISSION_FILE}
    written: list[Path] = []
    for split in test_splits(task, settings):
        predictions = _predict(accelerator, model, tokenizer, split, spec, is_regression=task.is_regression)
        if accelerator.is_main_process:
            # The diagnostic set is an MNLI task: its predictions are MNLI's label names.
            path = output_dir / file_names[split.name]
            write_submission_file(path, split.ids, prediction_labels(task.name, predictions))
            written.append(path)
            log(f"wrote GLUE's {path.name}: {len(split.ids)} predictions of {split.where}")
    accelerator.wait_for_everyone()
    return written


def test_splits(task: GlueTask, settings: Settings) -> list[PredictSplit]:
    if settings.glue_dir is not None:
        return list(read_local_test_splits(task, settings.glue_dir).values())
    loaded = load_hub_glue(task.name)
    splits = [
        predict_split(name, _hub_table(loaded[name], task, name), task, HUB_ID_COLUMN)
        for name in GLUE_LAYOUTS[task.name].test_splits
    ]
    if task.name == MNLI:
        try:
            diagnostic = load_hub_glue(DIAGNOSTIC_HUB_CONFIG)["test"]
        except DataError:
            return splits  # no diagnostic set where this worker can reach: no AX.tsv
        splits.append(
            predict_split(DIAGNOSTIC_SPLIT, _hub_table(diagnostic, task, "ax test"), task, HUB_ID_COLUMN)
        )
    return splits


def _hub_table(dataset: Any, task: GlueTask, split: str) -> Table:
    where = f"the Hub's {HUB_GLUE} {task.name} {split!r} split"
    return Table(dataset.to_pandas(), where, f"hub:{dataset._fingerprint}", "do_predict")


def _predict(
    accelerator: Accelerator,
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    split: PredictSplit,
    spec: JobSpec,
    *,
    is_regression: bool,
) -> list[float]:
    """Label ids (argmax) or scores, in the split's row order, gathered from every process."""
    columns = [split.texts[key].tolist() for key in split.texts.columns]
    encoded = tokenizer(
        *columns,
        padding="max_length" if spec.pad_to_max_length else False,
        max_length=spec.max_length,
        truncation=True,
    )
    rows = datasets.Dataset.from_dict(dict(encoded))
    order = None
    if spec.group_eval_by_length:  # sorted batches; the predictions are put back in row order below
        rows, order = longest_first(rows)
    collate: Callable[..., Any]
    if spec.pad_to_max_length:
        collate = default_data_collator
    else:
        multiple = 8 if accelerator.mixed_precision != "no" and accelerator.device.type == "cuda" else None
        collate = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=multiple)
    loader = accelerator.prepare(
        DataLoader(rows, collate_fn=collate, batch_size=spec.per_device_eval_batch_size)
    )
    model.eval()
    outputs = []
    with torch.no_grad():
        for batch in loader:
            outputs.append(accelerator.gather_for_metrics(model(**batch).logits.float()).cpu())
    logits = torch.cat(outputs)
    if order is not None:
        logits = in_row_order(logits, order)
    predictions = logits[:, 0] if is_regression else logits.argmax(dim=-1)
    return [float(value) for value in predictions.tolist()]
