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
from typing import Annotated, Any

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from shared.config import Settings
from shared.errors import InvalidSpec, field_error
from shared.tasks import FILE_METRICS, LOSS_METRIC, TASKS

DATA_FILE_SUFFIXES = (".csv", ".tsv", ".json", ".jsonl", ".parquet")
MAX_SEED = 2**32 - 1
# Hub ids: "name" or "org/name" (huggingface_hub's own rule, minus the length limit).
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


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


class JobSpec(BaseModel):
    """A fine-tuning job: run_glue_no_trainer.py's flags, plus LoRA and Trainer options."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, use_enum_values=True)

    # --- model and data -------------------------------------------------------------------------
    model_name_or_path: str = Field(
        min_length=1,
        max_length=512,
        description="A Hub id, or a folder under GLUEJOBS_MODELS_DIR",
    )
    task_name: str | None = Field(
        default=None, description="cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli"
    )
    train_file: str | None = Field(
        default=None, description="csv/tsv/json/jsonl/parquet under GLUEJOBS_DATA_DIR"
    )
    validation_file: str | None = None
    test_file: str | None = Field(default=None, description="Predictions are written for it after training")
    do_predict: bool = Field(
        default=False,
        description="Predict the task's test split and write GLUE's submission file (<Task>.tsv) into the "
        "job's folder",
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
    max_train_samples: PositiveInt | None = None
    max_eval_samples: PositiveInt | None = None

    # --- optimisation ---------------------------------------------------------------------------
    per_device_train_batch_size: PositiveInt = 8
    per_device_eval_batch_size: PositiveInt = 8
    learning_rate: float = Field(default=5e-5, gt=0.0, le=1.0)
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0)
    num_train_epochs: PositiveInt = Field(default=3, le=10_000)
    max_train_steps: PositiveInt | None = Field(default=None, description="Overrides num_train_epochs")
    gradient_accumulation_steps: PositiveInt = 1
    lr_scheduler_type: SchedulerType = SchedulerType.linear
    num_warmup_steps: int = Field(default=0, ge=0)
    warmup_ratio: Fraction = 0.0
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED, description="Drawn at random when absent")
    fp16: bool = False
    bf16: bool = False
    cls_dropout: Fraction | None = Field(default=None, description="Classifier dropout override")
    group_by_length: bool = Field(default=False, description="Length-bucketed batches (less padding)")

    # --- LoRA (microsoft/LoRA's run_glue.py options, through PEFT) -------------------------------
    apply_lora: bool = False
    lora_r: PositiveInt = Field(default=8, le=4096)
    lora_alpha: float = Field(default=16, gt=0)
    lora_dropout: Fraction = 0.0
    lora_target_modules: list[Annotated[str, Field(min_length=1)]] | None = Field(
        default=None, description="Module names to adapt; the model type's PEFT default when absent"
    )
    save_merged_model: bool = Field(
        default=False,
        description="LoRA: also save the adapter merged into the base model (output_dir/merged)",
    )

    # --- evaluation, checkpoints, logging (Trainer options) --------------------------------------
    eval_strategy: IntervalStrategy = Field(
        default=IntervalStrategy.epoch, validation_alias=AliasChoices("eval_strategy", "evaluation_strategy")
    )
    eval_steps: PositiveInt | None = None
    save_strategy: IntervalStrategy = IntervalStrategy.epoch
    save_steps: PositiveInt | None = None
    save_total_limit: PositiveInt | None = None
    logging_steps: PositiveInt = 10
    load_best_model_at_end: bool = False
    metric_for_best_model: str | None = Field(default=None, description="Default: the task's main metric")
    num_processes: PositiveInt = Field(default=1, le=64, description="Processes (GPUs) for this job")

    # --- accepted so that a script command line translates as is ---------------------------------
    with_tracking: bool = Field(default=False, description="Accepted; metrics are always recorded")
    report_to: str | None = Field(default=None, description="Accepted; metrics are always recorded")

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
        elif str(value).isdigit() and int(value) > 0:
            data["save_strategy"], data["save_steps"] = "steps", int(value)
        else:
            raise field_error(
                "checkpointing_steps",
                f"checkpointing_steps must be 'epoch' or a positive number of steps, not {value!r}",
            )
        return data

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
            raise ValueError(f"unknown task {value!r}; expected one of {', '.join(TASKS)}")
        return name

    @field_validator("train_file", "validation_file", "test_file")
    @classmethod
    def _data_file_format(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.strip():
            raise ValueError("must not be empty")
        if not value.lower().endswith(DATA_FILE_SUFFIXES):
            raise ValueError(f"{value!r} is not a data file; expected one of {', '.join(DATA_FILE_SUFFIXES)}")
        return value

    @field_validator("lora_target_modules", mode="before")
    @classmethod
    def _comma_separated_modules(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @model_validator(mode="after")
    def _coherent(self) -> JobSpec:
        if self.task_name is None and self.train_file is None:
            raise field_error("task_name", "give a task_name or a train_file (and a validation_file)")
        if self.task_name is None and self.validation_file is None and self.eval_strategy != "no":
            raise field_error(
                "validation_file",
                "a job on its own train_file needs a validation_file to evaluate on (or eval_strategy 'no')",
            )
        if self.num_warmup_steps and self.warmup_ratio:
            raise field_error("warmup_ratio", "give num_warmup_steps or warmup_ratio, not both")
        if self.fp16 and self.bf16:
            raise field_error("bf16", "choose one mixed precision: fp16 or bf16")
        for strategy, steps in (("eval", self.eval_steps), ("save", self.save_steps)):
            if getattr(self, f"{strategy}_strategy") == "steps" and steps is None:
                raise field_error(f"{strategy}_steps", f"{strategy}_strategy 'steps' needs {strategy}_steps")
        if self.load_best_model_at_end:
            self._check_best_model_options()
        if self.metric_for_best_model is not None:
            allowed = self.allowed_metrics()
            if self.metric_for_best_model not in allowed:
                raise field_error(
                    "metric_for_best_model",
                    f"metric_for_best_model {self.metric_for_best_model!r} is not reported by this "
                    f"job; expected one of {', '.join(allowed)}",
                )
        if self.do_predict and self.task_name is None and self.test_file is None:
            raise field_error(
                "do_predict", "do_predict needs a task_name (GLUE's test split) or a test_file to predict"
            )
        if not self.apply_lora and self.save_merged_model:
            raise field_error("save_merged_model", "save_merged_model needs apply_lora")
        return self

    def _check_best_model_options(self) -> None:
        # As in transformers.Trainer: the best model is a checkpoint, so saves must line up with evaluations.
        if self.eval_strategy == "no":
            raise field_error(
                "eval_strategy", "load_best_model_at_end needs evaluations (eval_strategy 'epoch' or 'steps')"
            )
        if self.save_strategy != self.eval_strategy:
            raise field_error(
                "save_strategy", "load_best_model_at_end needs save_strategy equal to eval_strategy"
            )
        if self.save_strategy == "steps" and (self.save_steps or 0) % (self.eval_steps or 1):
            raise field_error(
                "save_steps", "load_best_model_at_end needs save_steps to be a multiple of eval_steps"
            )

    def allowed_metrics(self) -> tuple[str, ...]:
        names = TASKS[self.task_name].metric_names if self.task_name else FILE_METRICS
        return (*names, LOSS_METRIC)

    def best_metric(self, *, is_regression: bool) -> str:
        """The metric that picks the best checkpoint: metric_for_best_model, else the task's main
        metric, else (a job on its own files) accuracy for labels and pearson for scores."""
        if self.metric_for_best_model:
            return self.metric_for_best_model
        if self.task_name:
            return TASKS[self.task_name].main_metric
        return "pearson" if is_regression else "accuracy"

    @property
    def mixed_precision(self) -> str:
        return "fp16" if self.fp16 else "bf16" if self.bf16 else "no"

    def with_seed(self) -> JobSpec:
        """The spec with a recorded seed, drawn at random when absent, so any run can be repeated."""
        if self.seed is not None:
            return self
        return self.model_copy(update={"seed": secrets.randbelow(2**31)})


# ------------------------------------------------------------------------------------------------
# Paths: data files must stay under GLUEJOBS_DATA_DIR and local models under GLUEJOBS_MODELS_DIR.
# ------------------------------------------------------------------------------------------------


def resolve_under(root: Path, value: str, *, field: str) -> Path:
    """Resolve `value` (relative to `root`, or absolute inside it) and refuse anything that leaves root.

    Symbolic links are followed before the check, so a link that points outside is refused too.
    The file itself need not exist yet: only a worker can tell whether it does.
    """
    if "\x00" in value:
        raise InvalidSpec("path contains a NUL byte", field=field)
    root_resolved = root.resolve()
    candidate = Path(value)
    full = candidate if candidate.is_absolute() else root_resolved / candidate
    resolved = Path(os.path.realpath(full))
    if not resolved.is_relative_to(root_resolved):
        where = "is absolute and outside" if candidate.is_absolute() else "leaves"
        raise InvalidSpec(f"{value!r} {where} the {_root_name(field)} ({root})", field=field)
    return resolved


def _root_name(field: str) -> str:
    return (
        "models folder GLUEJOBS_MODELS_DIR"
        if field == "model_name_or_path"
        else "data folder GLUEJOBS_DATA_DIR"
    )


def is_local_model_reference(value: str) -> bool:
    """A model reference that can only be a path (not a Hub id)."""
    return not _HUB_ID.match(value) or value.startswith(".") or "/../" in f"/{value}/"


def check_paths(spec: JobSpec, settings: Settings) -> JobSpec:
    """Refuse data files and model folders that leave their roots; store them relative to the root."""
    updates: dict[str, str] = {}
    data_root = settings.data_dir.resolve()
    for field in ("train_file", "validation_file", "test_file"):
        value = getattr(spec, field)
        if value is not None:
            updates[field] = str(resolve_under(settings.data_dir, value, field=field).relative_to(data_root))
    model = spec.model_name_or_path
    models_root = settings.models_dir.resolve()
    local = Path(model).is_absolute() or is_local_model_reference(model) or (models_root / model).exists()
    if local:
        resolved = resolve_under(settings.models_dir, model, field="model_name_or_path")
        updates["model_name_or_path"] = str(resolved.relative_to(models_root))
    return spec.model_copy(update=updates) if updates else spec
