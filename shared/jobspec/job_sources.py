"""Another job's model as a spec names it: `job:17` (its final model), `job:17/checkpoint-300` (one
declared checkpoint), `job:17/best` (its best checkpoint by its ranking metric).

The API resolves the name in the caller's scope (another owner's job is not found; an admin may name
anyone's: job ids are global) and turns the source's files into a content-addressed model, as a
registered model is stored (shared/jobs_repo/model_objects.store_job_model: the store copies them
itself, no byte passes through a client or the API). The stored spec records it under
`registered_model`, with `job` and `checkpoint` saying where it came from and `sha256` its manifest's
hash: a worker loads it through the registered-model path, and a rerun loads the same bytes even when
the source job is deleted later (the store keeps them: a pin, models/pins/<sha256>.json).

Which files are the model: the worker writes MANIFEST_NAME (a canonical manifest, path, bytes and
sha256 of each file: shared/jobspec/registered_models.manifest_bytes) beside the final model and in
every checkpoint when it saves them, so the API reads a few hundred bytes instead of hashing the
weights. The model's files are those `is_model_file` names: config, weights, adapter, tokenizer;
never a checkpoint's optimizer, scheduler or RNG states, nor a job folder's results. This module is
light (no I/O): the client's command line and the worker use it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A checkpoint's name is its folder's (the job folder's layout: shared/wire/job_folder.py).
from shared.wire.job_folder import CHECKPOINT_PREFIX, checkpoint_name

PREFIX = "job:"
BEST = "best"
_SOURCE = re.compile(
    rf"^job:(?P<job>[1-9][0-9]{{0,17}})(?:/(?P<which>best|{CHECKPOINT_PREFIX}(?P<step>0|[1-9][0-9]{{0,9}})))?$"
)

# What save_pretrained writes for a model (or a PEFT adapter) and its tokenizer.
_MODEL_FILES = re.compile(
    r"^(?:config\.json|generation_config\.json"
    r"|model(?:-\d+-of-\d+)?\.safetensors|model\.safetensors\.index\.json"
    r"|pytorch_model(?:-\d+-of-\d+)?\.bin|pytorch_model\.bin\.index\.json"
    r"|adapter_config\.json|adapter_model\.(?:safetensors|bin)"
    r"|tokenizer\.json|tokenizer_config\.json|special_tokens_map\.json|added_tokens\.json"
    r"|vocab\.(?:txt|json)|merges\.txt|spiece\.model|sentencepiece\.bpe\.model|tokenizer\.model"
    r"|chat_template\.(?:json|jinja)|preprocessor_config\.json)$"
)


@dataclass(frozen=True)
class JobSource:
    """`job:ID` (step and best unset), `job:ID/checkpoint-STEP`, or `job:ID/best`."""

    job_id: int
    step: int | None = None
    best: bool = False

    @property
    def is_final(self) -> bool:
        return self.step is None and not self.best


def is_job_source(value: str) -> bool:
    """Whether a spec's model_name_or_path names another job's model (`job:…`)."""
    return value.startswith(PREFIX)


def parse_job_source(value: str) -> JobSource:
    """The source `value` names; ValueError saying what is wrong with it."""
    found = _SOURCE.fullmatch(value)
    if found is None:
        raise ValueError(
            f"{value!r} names no job's model: job:ID (its final model), job:ID/checkpoint-STEP (one of "
            "its declared checkpoints) or job:ID/best (its best checkpoint)"
        )
    step = found["step"]
    return JobSource(
        job_id=int(found["job"]), step=int(step) if step is not None else None, best=found["which"] == BEST
    )


def job_reference(job_id: int, step: int | None = None) -> str:
    """How a spec names job `job_id`'s final model, or its checkpoint at `step`."""
    return f"{PREFIX}{job_id}" if step is None else f"{PREFIX}{job_id}/{checkpoint_name(step)}"


def record_name(job_id: int, step: int | None = None) -> str:
    """The `registered_model.name` of a job's model (a registered model's name pattern)."""
    return f"job-{job_id}" if step is None else f"job-{job_id}.{checkpoint_name(step)}"


def is_model_file(name: str) -> bool:
    """Whether a file of a model folder (top level) belongs to the model: config, weights, adapter,
    tokenizer."""
    return _MODEL_FILES.fullmatch(name) is not None
