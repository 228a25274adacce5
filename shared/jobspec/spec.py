"""JobSpec: the arguments of run_glue_no_trainer.py (plus LoRA and Trainer options), validated.

Field names are the script's flags without the dashes, so a command line translates one-for-one;
defaults are the script's. Everything that can be checked without a worker is checked here, so
a bad spec is refused with a message that names the field and is never stored. Path checks need
the settings (where data and models live) and live in `check_paths`.
"""

from __future__ import annotations

import os
import re
import secrets
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PlainSerializer,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from shared.core.errors import GluejobsError, InvalidSpec, field_error, field_errors, quote
from shared.jobspec import validation_messages
from shared.jobspec.column_mapping import MAX_COLUMN_NAME_CHARS, ColumnMapping
from shared.jobspec.data_scope import DataScope
from shared.jobspec.job_sources import is_job_source
from shared.jobspec.metric_rules import possible_metrics
from shared.jobspec.model_names import MAX_MODEL_NAME_CHARS, NAME_MAX_BYTES, check_model_name, is_hub_id
from shared.jobspec.registered_models import RegisteredModel, is_registered, parse_reference
from shared.jobspec.settings_view import ModelsFolderSetting, TrackersSetting
from shared.jobspec.suggest import did_you_mean
from shared.jobspec.tasks import TASKS
from shared.jobspec.uploaded_files import UploadedFile, is_file_id

DATA_FILE_SUFFIXES = (".csv", ".tsv", ".json", ".jsonl", ".parquet")
MAX_SEED = 2**32 - 1
# Upper bounds no real job comes near; they keep absurd numbers out of the database and the workers.
MAX_BATCH_SIZE = 65_536
MAX_STEPS = 1_000_000_000
MAX_SAMPLES = 1_000_000_000
MAX_SAVED_CHECKPOINTS = 10_000
MAX_MACHINES = 64  # num_machines: worker machines one job may span
MAX_PATH_CHARS = 1024
MAX_NAME_CHARS = 256  # module names, tracker names, metric names
MAX_TARGET_MODULES = 256
_STEPS_TEXT = re.compile(r"[0-9]{1,10}")


class SchedulerType(StrEnum):
    linear = "linear"
    cosine = "cosine"
    cosine_with_restarts = "cosine_with_restarts"
    polynomial = "polynomial"
    constant = "constant"
    constant_with_warmup = "constant_with_warmup"


class IntervalStrategy(StrEnum):
    no = "no"
    epoch = "epoch"
    steps = "steps"


PositiveInt = Annotated[int, Field(ge=1)]
Fraction = Annotated[float, Field(ge=0.0, lt=1.0)]
# Bounded counts for the spec's integer fields (and for the fields added to it later).
BatchSize = Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE)]
StepCount = Annotated[int, Field(ge=1, le=MAX_STEPS)]
SampleCount = Annotated[int, Field(ge=1, le=MAX_SAMPLES)]
DataPath = Annotated[str, Field(min_length=1, max_length=MAX_PATH_CHARS)]
ColumnName = Annotated[str, Field(min_length=1, max_length=MAX_COLUMN_NAME_CHARS)]


def _whole_as_int(value: float) -> float:
    return int(value) if float(value).is_integer() else value


# Trainer's num_train_epochs is a float (2.5 epochs: the schedule stops half-way through the third);
# a whole number is stored as an int, so a stored spec reads as it was given (3, not 3.0).
Epochs = Annotated[float, Field(gt=0, le=10_000), PlainSerializer(_whole_as_int, return_type=int | float)]
# Documented as the enum it is; _known_task also takes "SST-2" and the like.
TaskName = Annotated[str, WithJsonSchema({"type": "string", "enum": list(TASKS)})]

# --- recipes ----------------------------------------------------------------------------------------
Recipe = Literal["no_trainer", "trainer"]
Optimizer = Literal["adamw_torch", "adamw_torch_fused"]
# transformers.TrainingArguments' defaults (transformers 5) where they differ from the script's; the
# `trainer` recipe fills them in for every field its spec leaves out.
TRAINER_DEFAULTS: dict[str, Any] = {
    "max_grad_norm": 1.0,
    "seed": 42,
    "logging_steps": 500,
    "eval_strategy": "no",
    "save_strategy": "steps",
    "save_steps": 500,
}
# What `fast: true` sets, for every one of these fields that the spec leaves out (values given beside
# it win). Measured on SST-2 (bench/speed_bench.py, docs/benchmarks.md "Speed"): the same task and seed at the
# reference's accuracy, in a fraction of the time.
#   group_by_length         batches of similar lengths (Trainer's LengthGroupedSampler): a third of the
#                           padded tokens of random batches
#   shuffle_length_groups   those batches in a random order, not Trainer's long-to-short runs (which
#                           cost 0.7 points of SST-2 accuracy, median of three seeds)
#   bf16                    bf16 autocast (CUDA with bf16, and CPUs: AVX512-BF16/AMX); the classifier
#                           head, the loss, the weights and the optimizer's state stay fp32. A CPU
#                           without bf16 instructions emulates it many times slower than fp32: there
#                           the worker trains a fast job in fp32 (worker/training/precision.py)
#   group_eval_by_length    evaluation batches sorted by length, predictions put back in row order
#   per_device_eval_batch_size 64: sorted batches waste little on padding, so larger ones are cheap
#   optim                   the fused AdamW kernel (already the default)
#   freeze_word_embeddings  the word-embedding table stays as loaded: on MiniLM half the parameters,
#                           whose dense gradient, clipping and AdamW update cost a CPU step 13%
#   fast_dropout            dropout masks from NumPy's PCG64 on the CPU (worker/training/fast_dropout.py): the
#                           same law, less than half of torch's per-element draws' time
# A job that asks for fp16 keeps it (fast then leaves bf16 alone): the way to the fast path on GPUs
# without bf16 (T4, V100).
FAST_SETTINGS: dict[str, Any] = {
    "group_by_length": True,
    "shuffle_length_groups": True,
    "bf16": True,
    "group_eval_by_length": True,
    "per_device_eval_batch_size": 64,
    "optim": "adamw_torch_fused",
    "freeze_word_embeddings": True,
    "fast_dropout": True,
}
# --- jobs that do not train (do_train false) ---------------------------------------------------------
JobKind = Literal["train", "eval", "predict"]
JobKindMarker = Literal["eval", "predict"]
# What a job that does not train does with each option that only training uses: every one of them is
# refused by name when set to anything but its default (it would be silently ignored). What such a job
# honours: the model and its loading options, task_name, validation_file and test_file, their columns,
# max_length, pad_to_max_length, max_eval_samples, per_device_eval_batch_size, group_eval_by_length,
# fp16/bf16, fast (its evaluation settings only), num_processes, seed (recorded), metric_for_best_model
# and greater_is_better (which metric the job's headline shows), use_deterministic_algorithms, the
# trackers, max_runtime_s. eval_strategy and save_strategy are 'no' (filled in; anything else is refused).
TRAINING_ONLY_OPTIONS = (
    "train_file",
    "max_train_samples",
    "keep_labels",
    "per_device_train_batch_size",
    "learning_rate",
    "weight_decay",
    "num_train_epochs",
    "max_train_steps",
    "gradient_accumulation_steps",
    "lr_scheduler_type",
    "num_warmup_steps",
    "warmup_ratio",
    "cls_dropout",
    "group_by_length",
    "shuffle_length_groups",
    "freeze_word_embeddings",
    "fast_dropout",
    "apply_lora",
    "eval_steps",
    "save_steps",
    "save_total_limit",
    "logging_steps",
    "load_best_model_at_end",
    "early_stopping_patience",
    "early_stopping_threshold",
    "max_grad_norm",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "optim",
)
# The recipe's and fast's values that a job without training takes (the rest are training's).
_NO_TRAINING_FILLS = {"seed", "eval_strategy", "bf16", "group_eval_by_length", "per_device_eval_batch_size"}
# Spec keys that stand for a field under another name (aliases and the scripts' own flags).
_FIELD_OF_ALIAS = {
    "evaluation_strategy": "eval_strategy",
    "max_seq_length": "max_length",
    "warmup_steps": "num_warmup_steps",
    "checkpointing_steps": "save_strategy",
    "target_column": "label_column",
}
LORA_OPTIONS = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")
# Accelerate's trackers (accelerate.utils.LoggerType), named here because the API does not import
# accelerate (it imports torch). Which of them a cluster serves is GLUEJOBS_TRACKERS.
KNOWN_TRACKERS = (
    "tensorboard",
    "wandb",
    "trackio",
    "comet_ml",
    "aim",
    "mlflow",
    "clearml",
    "dvclive",
    "swanlab",
)


class JobSpec(BaseModel):
    """A fine-tuning job: run_glue_no_trainer.py's flags, plus LoRA and Trainer options."""

    # allow_inf_nan=False: every float field is finite (JSON has no Infinity; 1e309 parses as one).
    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        use_enum_values=True,
        allow_inf_nan=False,
        # The schema says what _coherent requires first: a task, or files of one's own.
        json_schema_extra={
            "anyOf": [
                {"required": ["task_name"], "properties": {"task_name": {"type": "string"}}},
                {"required": ["train_file"], "properties": {"train_file": {"type": "string"}}},
            ]
        },
    )

    # --- model and data -------------------------------------------------------------------------
    model_name_or_path: str = Field(
        min_length=1,
        max_length=MAX_MODEL_NAME_CHARS,
        description="A registered model (model:NAME, POST /v1/models; an admin may name another owner's "
        "as model:OWNER/NAME), another job's model (job:ID, its final model; job:ID/checkpoint-STEP, a "
        "declared checkpoint; job:ID/best), a Hub id, or a folder under GLUEJOBS_MODELS_DIR (relative to "
        "it; no '.', "
        f"'..' or empty components; each component at most {NAME_MAX_BYTES} bytes)",
        # Documents part of check_model_name's rule (which enforces all of it): no control
        # characters, no surrounding spaces, no trailing slash.
        json_schema_extra={"pattern": r"^[^\s\x00-\x1f\x7f]([^\x00-\x1f\x7f]*[^\s/\x00-\x1f\x7f])?$"},
    )
    registered_model: RegisteredModel | None = Field(
        default=None,
        description="Filled in by the API: the registered model (or job's model) model_name_or_path names "
        "(name, owner, size, the sha256 of its manifest; job and checkpoint for job:ID). A sha256 given "
        "here pins the files: a model with other files is refused",
    )
    task_name: TaskName | None = Field(
        default=None,
        description="cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli (case and dashes ignored)",
    )
    train_file: DataPath | None = Field(
        default=None,
        description="csv/tsv/json/jsonl/parquet under GLUEJOBS_DATA_DIR "
        f"(at most {MAX_PATH_CHARS} characters), or an uploaded file's id (file-7, POST /v1/files); "
        "validation_file and test_file alike",
    )
    validation_file: DataPath | None = None
    test_file: DataPath | None = Field(
        default=None, description="Predictions are written for it after training"
    )
    uploaded_files: dict[Literal["train_file", "validation_file", "test_file"], UploadedFile] | None = Field(
        default=None,
        description="Filled in by the API: the uploaded file each of those fields names by id (name, size, "
        "sha256). A sha256 given here pins the bytes: a file with other bytes is refused",
    )
    max_length: int = Field(
        default=128,
        ge=1,
        le=8192,
        validation_alias=AliasChoices("max_length", "max_seq_length"),
        description="Longer inputs are truncated (alias max_seq_length)",
    )
    pad_to_max_length: bool = False
    use_slow_tokenizer: bool = False
    ignore_mismatched_sizes: bool = False
    trust_remote_code: bool = Field(
        default=False, description="Must stay false: remote code is never trusted"
    )
    # Which columns of one's own files hold the texts and the labels (shared/jobspec/column_mapping.py:
    # AutoTrain's --text-column/--target-column convention); absent: GLUE's names, run_glue's rule.
    text_column: ColumnName | None = Field(
        default=None,
        description="The column of the data files that holds the text (AutoTrain's text_column); with a "
        "task it is read as the task's first text column. Absent: the task's column name, else run_glue's "
        "rule (sentence1/sentence2, or the first columns besides label)",
    )
    text_pair_column: ColumnName | None = Field(
        default=None,
        description="The column that holds the second text of a sentence-pair task (needs text_column)",
    )
    label_column: ColumnName | None = Field(
        default=None,
        validation_alias=AliasChoices("label_column", "target_column"),
        description="The column that holds the labels (AutoTrain's target_column, also taken under that "
        "name). Absent: 'label'",
    )
    # A rare label spelled like a frequent one is refused as a stray value (shared/admission/data_checks.py)
    # unless named here: the one way to say "this really is a class of its own".
    keep_labels: list[ColumnName] | None = Field(
        default=None,
        max_length=100,
        description="Labels of one's own train_file that are classes of their own although rare and spelled "
        "like a frequent label ('pos' beside 'positive ', 'Neg' beside 'neg'); without it such a label is "
        "refused, naming its rows and the label it is near",
    )
    max_train_samples: SampleCount | None = Field(default=None, description=f"At most {MAX_SAMPLES:,}")
    max_eval_samples: SampleCount | None = Field(default=None, description=f"At most {MAX_SAMPLES:,}")

    # --- optimisation ---------------------------------------------------------------------------
    per_device_train_batch_size: BatchSize = Field(default=8, description=f"At most {MAX_BATCH_SIZE:,}")
    per_device_eval_batch_size: BatchSize = Field(default=8, description=f"At most {MAX_BATCH_SIZE:,}")
    learning_rate: float = Field(default=5e-5, gt=0.0, le=1.0)
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0)
    num_train_epochs: Epochs = Field(
        default=3,
        description="Epochs to train; a fraction (2.5) stops part-way through the last one, as in Trainer "
        "(optimizer steps: ceil(num_train_epochs × steps per epoch))",
    )
    max_train_steps: StepCount | None = Field(
        default=None, description=f"Overrides num_train_epochs; at most {MAX_STEPS:,}"
    )
    gradient_accumulation_steps: BatchSize = Field(default=1, description=f"At most {MAX_BATCH_SIZE:,}")
    lr_scheduler_type: SchedulerType = SchedulerType.linear
    num_warmup_steps: int = Field(default=0, ge=0, le=MAX_STEPS, description=f"At most {MAX_STEPS:,}")
    warmup_ratio: Fraction = 0.0
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED, description="Drawn at random when absent")
    fp16: bool = False
    bf16: bool = False
    cls_dropout: Fraction | None = Field(default=None, description="Classifier dropout override")
    group_by_length: bool = Field(default=False, description="Length-bucketed batches (less padding)")
    shuffle_length_groups: bool = Field(
        default=False,
        description="With group_by_length: its batches in a shuffled order (the same batches, the same "
        "padding) rather than Trainer's runs from the longest rows to the shortest",
    )
    group_eval_by_length: bool = Field(
        default=False,
        description="Evaluate and predict in batches sorted by length (less padding); predictions are put "
        "back in row order, so metrics and prediction files are those of unsorted batches",
    )
    freeze_word_embeddings: bool = Field(
        default=False,
        description="Train every weight but the word-embedding table (the model's input embeddings), "
        "which keeps its loaded values: no gradient, clipping or optimizer state for it. Position and "
        "token-type embeddings still train",
    )
    fast_dropout: bool = Field(
        default=False,
        description="On the CPU, dropout masks drawn by NumPy's PCG64 generator (seeded by the job's seed, "
        "process and step) instead of torch's per-element draws: the same keep probability and scaling, "
        "another random stream. Not on GPUs, where torch's dropout draws in the kernel",
    )
    fast: bool = Field(
        default=False,
        description="The fast path: fills in "
        + ", ".join(f"{k}={v}" for k, v in FAST_SETTINGS.items())
        + " for those of these fields that the spec leaves out (bf16 not beside fp16: give fp16 on GPUs "
        "without bf16); the stored spec shows each value",
    )

    # --- LoRA (microsoft/LoRA's run_glue.py options, through PEFT) -------------------------------
    apply_lora: bool = False
    lora_r: PositiveInt = Field(default=8, le=4096)
    lora_alpha: float = Field(default=16, gt=0, le=1_000_000)
    lora_dropout: Fraction = 0.0
    lora_target_modules: list[Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]] | None = Field(
        default=None,
        max_length=MAX_TARGET_MODULES,
        description="Module names to adapt; the model type's PEFT default when absent "
        f"(at most {MAX_TARGET_MODULES} names of at most {MAX_NAME_CHARS} characters)",
    )
    save_merged_model: bool = Field(
        default=False,
        description="LoRA: also save the adapter merged into the base model (output_dir/merged); on a job "
        "with do_train false from a LoRA job's adapter (job:ID…), save that adapter merged into its base",
    )

    # --- evaluation, checkpoints, logging (Trainer options) --------------------------------------
    eval_strategy: IntervalStrategy = Field(
        default=IntervalStrategy.epoch, validation_alias=AliasChoices("eval_strategy", "evaluation_strategy")
    )
    eval_steps: StepCount | None = Field(default=None, description=f"At most {MAX_STEPS:,}")
    save_strategy: IntervalStrategy = IntervalStrategy.epoch
    save_steps: StepCount | None = Field(default=None, description=f"At most {MAX_STEPS:,}")
    save_total_limit: int | None = Field(
        default=None, ge=1, le=MAX_SAVED_CHECKPOINTS, description=f"At most {MAX_SAVED_CHECKPOINTS:,}"
    )
    logging_steps: StepCount = Field(default=10, description=f"At most {MAX_STEPS:,}")
    load_best_model_at_end: bool = False
    metric_for_best_model: str | None = Field(
        default=None, max_length=MAX_NAME_CHARS, description="Default: the task's main metric"
    )
    greater_is_better: bool | None = Field(
        default=None,
        description="Trainer's: whether a larger metric_for_best_model is better (the best checkpoint, "
        "early stopping, best_metrics); null: the metric's own direction (a loss and mse smaller, every "
        "GLUE metric larger)",
    )
    num_processes: PositiveInt = Field(default=1, le=64, description="Processes (GPUs) for this job")
    num_machines: int | None = Field(
        default=None,
        ge=1,
        le=MAX_MACHINES,
        description="Worker machines the job spans, each running num_processes processes (accelerate "
        "launch --num_machines, torchrun --nnodes); null or 1: one machine. The job starts once that many "
        "workers are free (a gang), rank 0's worker alone writes its rows, checkpoints and model",
    )

    # --- the recipe, and Trainer's options under Trainer's names ---------------------------------
    recipe: Recipe = Field(
        default="no_trainer",
        description="no_trainer: run_glue_no_trainer.py's defaults; trainer: transformers.Trainer's "
        "defaults where the spec has none (max_grad_norm 1.0, seed 42, logging_steps 500, no "
        "evaluation unless asked, a checkpoint every 500 steps)",
    )
    max_grad_norm: float | None = Field(
        default=None,
        ge=0.0,
        description="Clip the gradients' global norm to this (Trainer: 1.0); null or 0: no clipping",
    )
    adam_beta1: float = Field(default=0.9, ge=0.0, lt=1.0)
    adam_beta2: float = Field(default=0.999, ge=0.0, lt=1.0)
    adam_epsilon: float = Field(default=1e-8, gt=0.0, le=1.0)
    optim: Optimizer = Field(
        default="adamw_torch_fused",
        description="AdamW (the scripts' optimizer); adamw_torch_fused runs the same update as one kernel",
    )
    use_deterministic_algorithms: bool = Field(
        default=False,
        description="Deterministic kernels (torch.use_deterministic_algorithms) and the environment they "
        "need (CUBLAS_WORKSPACE_CONFIG, PYTHONHASHSEED): the same seed gives the same run",
    )
    early_stopping_patience: PositiveInt | None = Field(
        default=None,
        le=10_000,
        description="Stop after this many evaluations without improvement (Trainer's EarlyStoppingCallback)",
    )
    early_stopping_threshold: float = Field(
        default=0.0, ge=0.0, description="How much the ranking metric must improve to count as improving"
    )
    do_train: bool | None = Field(
        default=None,
        description="false: an evaluation or prediction job, which runs no optimizer step: it loads the "
        "model, evaluates it (do_eval) and/or predicts (do_predict) and saves no checkpoint (run_glue.py's "
        "--do_eval or --do_predict without --do_train). Absent or true: the job trains",
    )
    job_kind: JobKindMarker | None = Field(
        default=None,
        description="Filled in by the API from do_train, do_eval and do_predict: 'eval' or 'predict' for a "
        "job that does not train (absent for one that does); a worker built before evaluation jobs "
        "hands such a job back instead of training it",
    )
    do_eval: bool | None = Field(
        default=None,
        description="Evaluate at the end of training (run_glue.py's --do_eval); true whenever "
        "eval_strategy is not 'no'. With do_train false: evaluate the model as loaded",
    )
    do_predict: bool = Field(
        default=False,
        description="Predict the task's test split and write GLUE's submission file (<Task>.tsv) into the "
        "job's folder (test_file's predictions, predict_results.tsv, are written whenever it is given)",
    )

    # --- running it ------------------------------------------------------------------------------
    max_runtime_s: float | None = Field(
        default=None,
        gt=0,
        le=30 * 24 * 3600,
        description="Stop an attempt that has run this long: the job fails with error_code timeout "
        "(not retried)",
    )
    noop: bool = Field(
        default=False,
        description="For benchmarks of the queue: the job's process starts, reports and succeeds at once, "
        "without loading data or a model",
    )

    # --- experiment trackers (Accelerate's) -------------------------------------------------------
    with_tracking: bool = Field(
        default=False, description="Report to experiment trackers (report_to; all that the workers serve)"
    )
    report_to: list[Annotated[str, Field(min_length=1, max_length=32)]] | None = Field(
        default=None,
        max_length=len(KNOWN_TRACKERS) + 2,
        description="Accelerate trackers: tensorboard, mlflow, wandb … ('all', or 'none'); "
        "GLUEJOBS_TRACKERS names those the workers serve",
    )

    @model_validator(mode="before")
    @classmethod
    def _translate_script_only_flags(cls, data: Any) -> Any:
        """`checkpointing_steps` (the script's flag) becomes save_strategy/save_steps."""
        if not isinstance(data, dict) or "checkpointing_steps" not in data:
            return data
        data = dict(data)
        value = data.pop("checkpointing_steps")
        if value is None:
            return data
        if "save_strategy" in data or "save_steps" in data:
            raise field_error(
                "checkpointing_steps", "give checkpointing_steps or save_strategy/save_steps, not both"
            )
        if str(value) == "epoch":
            data["save_strategy"] = "epoch"
        elif _STEPS_TEXT.fullmatch(str(value)) and 0 < int(value) <= MAX_STEPS:
            data["save_strategy"], data["save_steps"] = "steps", int(value)
        else:
            raise field_error(
                "checkpointing_steps",
                f"checkpointing_steps must be 'epoch' or a number of steps from 1 to {MAX_STEPS:,}, "
                f"not {quote(value)}",
            )
        return data

    @model_validator(mode="before")
    @classmethod
    def _recipe_defaults(cls, data: Any) -> Any:
        """`warmup_steps` (Trainer's name) becomes num_warmup_steps; then, under the trainer recipe,
        Trainer's defaults fill every field the spec leaves out. Filled in before validation, so the
        stored spec shows each value the run uses and a stored spec validates to itself."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "warmup_steps" in data:
            value = data.pop("warmup_steps")
            if data.get("num_warmup_steps") not in (None, value):
                raise field_error("warmup_steps", "give warmup_steps or num_warmup_steps, not both")
            try:
                data["num_warmup_steps"] = TypeAdapter(NonNegativeInt).validate_python(value)
            except ValidationError as exc:
                raise field_error(
                    "warmup_steps", validation_messages.message(exc.errors()[0]), value
                ) from None
        trains = not _is_false(data.get("do_train"))
        if not trains:
            # Nothing to evaluate during, nor to checkpoint: both strategies are 'no' unless given
            # (anything else given is refused in _coherent).
            given = {_FIELD_OF_ALIAS.get(key, key) for key in data}
            data.update({key: "no" for key in ("eval_strategy", "save_strategy") if key not in given})
        if data.get("recipe") == "trainer":
            given = {_FIELD_OF_ALIAS.get(key, key) for key in data}
            if "checkpointing_steps" in data:
                given.add("save_steps")  # the script's flag sets both, and refuses either beside it
            fills = {key: value for key, value in TRAINER_DEFAULTS.items() if key not in given}
            data.update({k: v for k, v in fills.items() if trains or k in _NO_TRAINING_FILLS})
            strategy = data.get("eval_strategy", data.get("evaluation_strategy"))
            if strategy == "steps" and data.get("eval_steps") is None:
                data["eval_steps"] = data["logging_steps"]  # Trainer's default for eval_steps
        if _is_true(data.get("fast")):
            given = {_FIELD_OF_ALIAS.get(key, key) for key in data}
            if _is_true(data.get("fp16")):
                given.add("bf16")  # one mixed precision: the one asked for
            if "group_by_length" in given and not _is_true(data["group_by_length"]):
                given.add("shuffle_length_groups")  # there are no length groups to shuffle
            fills = {key: value for key, value in FAST_SETTINGS.items() if key not in given}
            data.update({k: v for k, v in fills.items() if trains or k in _NO_TRAINING_FILLS})
        return data

    @field_validator("report_to", mode="before")
    @classmethod
    def _tracker_names(cls, value: Any) -> Any:
        """ "tensorboard,mlflow" or a list; "none" (Trainer's word for no tracker) gives none."""
        if isinstance(value, str):
            value = [part for part in re.split(r"[,\s]+", value) if part]
        if isinstance(value, list):
            names = [name.strip().lower() if isinstance(name, str) else name for name in value]
            unknown = [n for n in names if isinstance(n, str) and n not in (*KNOWN_TRACKERS, "all", "none")]
            if unknown:
                hint = did_you_mean(unknown[0], (*KNOWN_TRACKERS, "all", "none"))
                known = ", ".join(KNOWN_TRACKERS)
                raise ValueError(f"unknown tracker {unknown[0]!r}{hint} (Accelerate's trackers: {known})")
            return [name for name in names if name != "none"]
        return value

    @field_validator("num_machines")
    @classmethod
    def _one_machine_is_off(cls, value: int | None) -> int | None:
        """1 is stored as null (off), so a build without the field runs a one-machine job."""
        return None if value == 1 else value

    @field_validator("trust_remote_code")
    @classmethod
    def _no_remote_code(cls, value: bool) -> bool:
        if value:
            raise ValueError("remote code is never trusted: a job cannot run code that comes with a model")
        return value

    @field_validator("task_name", mode="before")
    @classmethod
    def _known_task(cls, value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, str):
            return value  # the type check names it
        name = value.strip().lower().replace("-", "")
        if name not in TASKS:
            hint = did_you_mean(name, TASKS)
            raise ValueError(f"unknown task {quote(value)}{hint} (GLUE's tasks: {', '.join(TASKS)})")
        return name

    @field_validator("train_file", "validation_file", "test_file")
    @classmethod
    def _data_file_format(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.strip():
            raise ValueError("must not be empty")
        if is_file_id(value):
            return value
        if any(len(part.encode("utf-8", "replace")) > NAME_MAX_BYTES for part in value.split("/")):
            raise ValueError(
                f"a component of the path is longer than {NAME_MAX_BYTES} bytes (a file name's limit)"
            )
        # Where a path leads matters before what it is called: `../../etc/passwd` is refused for
        # leaving the data folder, not for its name. A path that may leave it (absolute, or up with
        # `..`) is placed with the settings first (check_paths), then its name is checked there.
        if not (os.path.isabs(value) or os.path.normpath(value).split(os.sep)[0] == ".."):
            check_data_suffix(value)
        return value

    @field_validator("model_name_or_path")
    @classmethod
    def _model_name(cls, value: str) -> str:
        if is_registered(value):
            parse_reference(value)  # its ValueError names what is wrong, under the field
        return check_model_name(value)

    @field_validator("lora_target_modules", mode="before")
    @classmethod
    def _comma_separated_modules(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @model_validator(mode="after")
    def _coherent(self) -> JobSpec:
        """Every incoherence at once (each naming its field), not the first of them."""
        found: list[tuple[str, str]] = []
        if not self.trains:
            self._check_no_training(found)
        elif self.task_name is None and self.train_file is None:
            found.append(("task_name", "give a task_name or a train_file (and a validation_file)"))
        elif self.job_kind is not None:
            found.append(("job_kind", "job_kind is filled in from do_train: a job that trains has none"))
        self._check_recipe_options(found)
        pair_task = None if self.task_name is None else TASKS[self.task_name].text_keys[1] is not None
        mapping_problem = ColumnMapping.of(self).problem(pair_task=pair_task)
        if mapping_problem is not None:
            found.append(mapping_problem)
        if self.task_name is None and self.validation_file is None and self.evaluates and self.trains:
            found.append(
                (
                    "validation_file",
                    "a job on its own train_file needs a validation_file to evaluate on "
                    "(or eval_strategy 'no')",
                )
            )
        if self.num_warmup_steps and self.warmup_ratio:
            found.append(("warmup_ratio", "give num_warmup_steps or warmup_ratio, not both"))
        if self.fp16 and self.bf16:
            found.append(("bf16", "choose one mixed precision: fp16 or bf16"))
        for strategy, steps in (("eval", self.eval_steps), ("save", self.save_steps)):
            if getattr(self, f"{strategy}_strategy") == "steps" and steps is None:
                found.append((f"{strategy}_steps", f"{strategy}_strategy 'steps' needs {strategy}_steps"))
        if self.load_best_model_at_end:
            self._check_best_model_options(found)
        if self.greater_is_better is not None and self.metric_for_best_model is None:
            found.append(
                (
                    "greater_is_better",
                    "greater_is_better says which way metric_for_best_model improves: give "
                    "metric_for_best_model too",
                )
            )
        if self.metric_for_best_model is not None:
            allowed = self.allowed_metrics()
            name = self.metric_for_best_model.removeprefix("eval_")
            if name not in allowed:
                found.append(
                    (
                        "metric_for_best_model",
                        f"metric_for_best_model {quote(self.metric_for_best_model)} is not reported by this "
                        f"job{did_you_mean(name, allowed)} (it reports {', '.join(allowed)})",
                    )
                )
        if self.do_predict and self.task_name is None and self.test_file is None:
            found.append(
                ("do_predict", "do_predict needs a task_name (GLUE's test split) or a test_file to predict")
            )
        if self.shuffle_length_groups and not self.group_by_length:
            found.append(("shuffle_length_groups", "shuffle_length_groups needs group_by_length"))
        if self.save_merged_model and not self.apply_lora and self.trains:
            found.append(("save_merged_model", "save_merged_model needs apply_lora"))
        if self.save_merged_model and not self.trains and not is_job_source(self.model_name_or_path):
            found.append(
                (
                    "save_merged_model",
                    "save_merged_model on a job with do_train false saves a LoRA job's adapter merged into "
                    "its base: name the adapter as the model (job:ID, job:ID/checkpoint-STEP, job:ID/best)",
                )
            )
        if found:
            raise field_errors(found)
        return self

    def _check_no_training(self, found: list[tuple[str, str]]) -> None:
        """do_train false: something to do, data to do it on, and no option that only training uses."""
        if not self.do_eval and not self.do_predict:
            found.append(
                (
                    "do_train",
                    "do_train false runs no training: give do_eval (evaluate the model) and/or do_predict "
                    "(predict a test file or the task's test split)",
                )
            )
        self.do_eval = bool(self.do_eval)
        if self.task_name is None:
            # Labels from the model's config (id2label; num_labels 1: regression), its own files to read.
            if self.do_eval and self.validation_file is None:
                found.append(
                    (
                        "validation_file",
                        "an evaluation job without a task_name evaluates its validation_file: give one "
                        "(its labels are read by the model's id2label), or a task_name",
                    )
                )
            if self.do_predict and self.test_file is None:
                found.append(
                    (
                        "test_file",
                        "a prediction job without a task_name predicts its test_file: give one, or a "
                        "task_name (its test split)",
                    )
                )
        defaults = type(self).model_fields
        for name in TRAINING_ONLY_OPTIONS:
            if getattr(self, name) != defaults[name].default:
                found.append((name, f"{name} is a training option: a job with do_train false does not train"))
        for strategy in ("eval_strategy", "save_strategy"):
            value = getattr(self, strategy)
            if value != "no":
                what = "evaluates the model once" if strategy == "eval_strategy" else "saves no checkpoint"
                found.append(
                    (strategy, f"{strategy} {quote(value)} needs training: a job with do_train false {what}")
                )
        kind = job_kind(self)
        if self.job_kind not in (None, kind):
            found.append(
                ("job_kind", f"job_kind is filled in from do_train, do_eval and do_predict: here {kind!r}")
            )
        self.job_kind = None if kind == "train" else kind

    def _check_best_model_options(self, found: list[tuple[str, str]]) -> None:
        # As in transformers.Trainer: the best model is a checkpoint, so saves must line up with evaluations.
        if self.eval_strategy == "no":
            found.append(
                (
                    "eval_strategy",
                    "load_best_model_at_end needs evaluations (eval_strategy 'epoch' or 'steps')",
                )
            )
        if self.save_strategy != self.eval_strategy:
            found.append(
                ("save_strategy", "load_best_model_at_end needs save_strategy equal to eval_strategy")
            )
        if self.save_strategy == "steps" and (self.save_steps or 0) % (self.eval_steps or 1):
            found.append(
                ("save_steps", "load_best_model_at_end needs save_steps to be a multiple of eval_steps")
            )

    def _check_recipe_options(self, found: list[tuple[str, str]]) -> None:
        if not self.apply_lora:
            # A default value cannot be told from an absent one (a stored spec has them all), and
            # it changes nothing; any other value would be silently ignored, so it is refused.
            changed = [
                name for name in LORA_OPTIONS if getattr(self, name) != type(self).model_fields[name].default
            ]
            found += [(name, f"{name} has no effect without apply_lora") for name in changed]
        if self.do_eval is None:
            self.do_eval = self.eval_strategy != "no"
        elif not self.do_eval and self.eval_strategy != "no":
            found.append(
                (
                    "do_eval",
                    f"do_eval false contradicts eval_strategy '{self.eval_strategy}' (which evaluates)",
                )
            )
        if self.early_stopping_patience is not None and self.eval_strategy == "no":
            found.append(
                (
                    "early_stopping_patience",
                    "early stopping counts evaluations: it needs eval_strategy 'epoch' or 'steps'",
                )
            )

    @property
    def trains(self) -> bool:
        """Whether the job trains: every job but one with do_train false."""
        return self.do_train is not False

    @property
    def predicts_glue_test(self) -> bool:
        """Whether the job predicts its task's GLUE test split (GLUE's submission file): do_predict on a
        task, except for a job that does not train and names its own test_file (it predicts that file)."""
        return self.do_predict and self.task_name is not None and (self.trains or self.test_file is None)

    @property
    def evaluates(self) -> bool:
        """Whether the job evaluates at all: during training (eval_strategy) or at its end (do_eval)."""
        return bool(self.do_eval) or self.eval_strategy != "no"

    @property
    def trackers(self) -> list[str]:
        """The trackers the run reports to: report_to, else with_tracking's "all" (the script's default)."""
        if self.report_to is not None:
            return list(self.report_to)
        return ["all"] if self.with_tracking else []

    def allowed_metrics(self) -> tuple[str, ...]:
        return possible_metrics(self.task_name)

    @property
    def mixed_precision(self) -> str:
        return "fp16" if self.fp16 else "bf16" if self.bf16 else "no"

    def with_seed(self) -> JobSpec:
        """The spec with a recorded seed, drawn at random when absent, so any run can be repeated."""
        if self.seed is not None:
            return self
        return self.model_copy(update={"seed": secrets.randbelow(2**31)})


def spec_keys() -> tuple[str, ...]:
    """Every key a spec takes: the fields, their aliases and the scripts' own names for them."""
    aliases = [
        choice
        for info in JobSpec.model_fields.values()
        if info.validation_alias is not None and hasattr(info.validation_alias, "choices")
        for choice in info.validation_alias.choices
        if isinstance(choice, str)
    ]
    return tuple(dict.fromkeys([*JobSpec.model_fields, *aliases, *_FIELD_OF_ALIAS]))


def field_names(key: str) -> tuple[str, ...]:
    """The fields a spec key sets: itself, or the field an alias stands for (`checkpointing_steps`
    sets save_strategy and save_steps)."""
    if key == "checkpointing_steps":
        return ("save_strategy", "save_steps")
    return (_FIELD_OF_ALIAS.get(key, key),)


def check_data_suffix(value: str) -> None:
    """A data file's name must say its format (how a worker reads it)."""
    if not value.lower().endswith(DATA_FILE_SUFFIXES):
        raise ValueError(
            f"{value!r} is not a data file: its name must end with one of {', '.join(DATA_FILE_SUFFIXES)}, "
            "or name an uploaded file by its id (file-7)"
        )


def job_kind(spec: JobSpec | dict[str, Any]) -> JobKind:
    """What a job does, the one rule the API, the CLI and the dashboard show: 'train', or for a job with
    do_train false 'eval' (it evaluates; it may predict too) or 'predict' (it only predicts). Takes a
    spec or a stored spec's mapping (where the API filled in job_kind)."""
    if isinstance(spec, dict):
        marker = spec.get("job_kind")
        return marker if marker in ("eval", "predict") else "train"
    if spec.trains:
        return "train"
    return "eval" if spec.do_eval else "predict"


def _is_false(value: Any) -> bool:
    """Whether a raw spec value reads as false (None and what does not parse are not)."""
    if value is None:
        return False
    try:
        return TypeAdapter(bool).validate_python(value) is False
    except ValidationError:
        return False


def _is_true(value: Any) -> bool:
    """Whether a raw spec value reads as true (as the bool field will parse it); anything that does not
    parse is left for the field's own validation to refuse."""
    try:
        return TypeAdapter(bool).validate_python(value)
    except ValidationError:
        return False


# ------------------------------------------------------------------------------------------------
# Paths: data files must stay under GLUEJOBS_DATA_DIR and local models under GLUEJOBS_MODELS_DIR.
# ------------------------------------------------------------------------------------------------


def check_trackers(spec: JobSpec, settings: TrackersSetting) -> JobSpec:
    """Refuse trackers that this cluster's workers do not serve (GLUEJOBS_TRACKERS), and resolve
    "all" to those they do, so the stored spec names the trackers the run will report to.

    The API cannot ask a worker what it has installed; GLUEJOBS_TRACKERS is the operator's word.
    """
    wanted = spec.trackers
    if not wanted:
        return spec
    served = list(settings.trackers)
    resolved = served if "all" in wanted else wanted
    missing = [name for name in resolved if name not in served]
    if missing:
        offered = ", ".join(served) if served else "none"
        raise InvalidSpec(
            f"tracker {missing[0]!r} is not served by this cluster's workers (GLUEJOBS_TRACKERS: {offered})",
            field="report_to",
        )
    if not resolved:
        raise InvalidSpec(
            "this cluster's workers serve no tracker (GLUEJOBS_TRACKERS is empty)", field="report_to"
        )
    return spec.model_copy(update={"report_to": resolved, "with_tracking": True})


def resolve_under(root: Path, value: str, *, field: str) -> Path:
    """Resolve `value` (relative to `root`, or absolute inside it) and refuse anything that leaves root.

    Symbolic links are followed before the check, so a link that points outside is refused too.
    The file itself need not exist yet: only a worker can tell whether it does. The message names the
    folder by its setting, never by the server's path.
    """
    if "\x00" in value:
        raise InvalidSpec("path contains a NUL byte", field=field)
    root_resolved = root.resolve()
    candidate = Path(value)
    full = candidate if candidate.is_absolute() else root_resolved / candidate
    resolved = Path(os.path.realpath(full))
    if not resolved.is_relative_to(root_resolved):
        where = "is absolute and outside" if candidate.is_absolute() else "leaves"
        raise InvalidSpec(f"{quote(value)} {where} the models folder GLUEJOBS_MODELS_DIR", field=field)
    return resolved


def locate_model(name: str, models_dir: Path) -> Path | str:
    """Where a job's model comes from: a folder under `models_dir` (resolved, absolute) or a Hub id.

    The one rule the API (check_paths) and the workers (worker.training.modeling.resolve_model) both follow.
    A name is a folder when it is absolute, when it cannot be a Hub id, or when `models_dir` has an
    entry of that name; anything else is a Hub id, which a worker reads from the Hub's cache (or
    downloads into it), never from a folder of that name elsewhere.
    """
    field = "model_name_or_path"
    try:
        check_model_name(name)
    except ValueError as exc:
        raise InvalidSpec(str(exc), field=field) from None
    root = models_dir.resolve()
    # os.path.exists answers False (never raises) for names the filesystem cannot take.
    if Path(name).is_absolute() or not is_hub_id(name) or os.path.exists(root / name):
        folder = resolve_under(models_dir, name, field=field)
        if folder == root:
            raise InvalidSpec(
                f"{quote(name)} is GLUEJOBS_MODELS_DIR itself, not a model folder in it", field=field
            )
        return folder
    return name


def check_paths(
    spec: JobSpec,
    settings: ModelsFolderSetting,
    *,
    scope: DataScope,
    problems: list[GluejobsError] | None = None,
) -> JobSpec:
    """Refuse data files outside the caller's data folder (`scope`, shared/jobspec/data_scope.py) and model
    folders that leave GLUEJOBS_MODELS_DIR; store both relative to their roots.

    Each file and the model are checked whatever the others hold: with `problems`, each refusal is
    appended there and its field left as given (the caller checks the rest and refuses them all at
    once); without, the first refusal is raised."""
    updates: dict[str, Any] = {}
    uploaded: dict[str, UploadedFile] = {}
    found: list[GluejobsError] = []
    for field in ("train_file", "validation_file", "test_file"):
        value = getattr(spec, field)
        try:
            if value is not None and is_file_id(value):
                uploaded[field] = scope.uploaded(
                    value, field=field, pinned=(spec.uploaded_files or {}).get(field)
                )
            elif value is not None:
                updates[field] = scope.stored(scope.resolve(value, field=field))
                try:
                    check_data_suffix(value)  # a path the field's validator could not place: see there
                except ValueError as exc:
                    raise InvalidSpec(str(exc), field=field) from None
        except GluejobsError as exc:  # InvalidSpec, and NotFound for a file id that is not the caller's
            updates.pop(field, None)
            found.append(exc)
    updates["uploaded_files"] = uploaded or None
    try:
        updates.update(_model_paths(spec, settings, scope=scope))
    except GluejobsError as exc:
        found.append(exc)
    if found and problems is None:
        raise found[0]
    if problems is not None:
        problems.extend(found)
    return spec.model_copy(update=updates)


def _model_paths(spec: JobSpec, settings: ModelsFolderSetting, *, scope: DataScope) -> dict[str, Any]:
    if is_registered(spec.model_name_or_path):
        registered = scope.registered(
            spec.model_name_or_path, field="model_name_or_path", pinned=spec.registered_model
        )
        return {"registered_model": registered}
    updates: dict[str, Any] = {"registered_model": None}
    source = locate_model(spec.model_name_or_path, settings.models_dir)
    if isinstance(source, Path):
        relative = str(source.relative_to(settings.models_dir.resolve()))
        try:
            # What is stored is what a worker will check: the folder's own name must pass too.
            updates["model_name_or_path"] = check_model_name(relative)
        except ValueError as exc:
            raise InvalidSpec(f"the model folder's real path: {exc}", field="model_name_or_path") from None
    return updates
