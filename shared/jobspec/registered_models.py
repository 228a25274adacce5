"""Registered models as a job spec names them, and the manifest that gives a model its hash.

A model folder registered once (POST /v1/models, `gluejobs models upload FOLDER --name NAME`) is
named in a spec's `model_name_or_path` as `model:NAME`, or `model:OWNER/NAME` for an admin naming
another owner's model. The prefix cannot be mistaken for the two other kinds of name: a Hub id
never holds a `:`, and a name with the prefix is never looked for under GLUEJOBS_MODELS_DIR.

The API resolves the name in the caller's scope and stores the model's record beside it, under
`registered_model` (`{"name", "owner", "sha256", "bytes"}`), as `uploaded_files` records a data
file: the stored spec says exactly which files the job trained from, by the manifest's sha256.

The manifest lists the folder's files (relative path, size, sha256 of the bytes), sorted by path,
written as canonical JSON; its own sha256 is the model's hash. Each file lives in the store under
its sha256 (shared.core.storage.model_blob_key), so two models sharing a tokenizer store it once.
Another job's model (`job:17`, `job:17/checkpoint-300`, `job:17/best`: shared/jobspec/job_sources.py)
is stored the same way when a spec names it, and recorded the same way, with `job` and `checkpoint`
saying where it came from; `is_registered` is true for both kinds of name: a model the store holds by
hash. This module is light (pydantic only): the client's command line uses it.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from shared.jobspec.job_sources import is_job_source, parse_job_source

PREFIX = "model:"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_NAME = re.compile(NAME_PATTERN)
_OWNER = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$")  # shared.core.config's owner names
SHA256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


def is_registered(value: str) -> bool:
    """Whether a spec's model_name_or_path names a model the store holds by hash: a registered model
    (`model:NAME`) or another job's (`job:ID…`), which the API records under `registered_model`."""
    return value.startswith(PREFIX) or is_job_source(value)


def parse_reference(value: str) -> tuple[str | None, str]:
    """(owner or None, name) of `model:NAME` or `model:OWNER/NAME`; ValueError saying what is wrong.
    A job's model (`job:ID…`) is checked here too, and is (None, the value itself)."""
    if is_job_source(value):
        parse_job_source(value)
        return None, value
    rest = value.removeprefix(PREFIX)
    owner, _, name = rest.rpartition("/")
    if owner and not _OWNER.match(owner):
        raise ValueError(f"{owner!r} is not an owner's name (in model:OWNER/NAME)")
    if not _NAME.match(name):
        raise ValueError(
            f"{name!r} is not a registered model's name: letters, digits, '.', '_' and '-', "
            "at most 64, starting with a letter or digit"
        )
    return owner or None, name


def reference(name: str, owner: str | None = None) -> str:
    """How a spec names the model `name` (of `owner`, when it is someone else's)."""
    return f"{PREFIX}{owner}/{name}" if owner else f"{PREFIX}{name}"


class RegisteredModel(BaseModel):
    """The registered model a spec names: filled in by the API from the model's row."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, description="Its name, as registered")
    owner: str | None = Field(default=None, description="Whose it is (None without API keys)")
    sha256: SHA256 = Field(description="The sha256 of its manifest: the job trains from exactly these files")
    bytes: int = Field(ge=0, description="Its files' size together")
    # Left out of a registered model's record, which keeps its four fields (stored specs, older workers).
    job: int | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        ge=1,
        description="A job's model (job:ID): the job it came from (null: a registered model)",
    )
    checkpoint: str | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        pattern=r"^checkpoint-[0-9]{1,10}$",
        description="A job's checkpoint (job:ID/checkpoint-N, job:ID/best): which one; null: its final model",
    )
    # A LoRA job's adapter (job:ID… of a job with apply_lora): the base it was trained on, which the
    # worker loads the adapter onto (worker/training/lora_sources.py).
    # A stored base is pinned by its own record
    # (its sha256); a Hub base by the commit the adapter's adapter_config.json records (`revision`).
    base_model_name_or_path: str | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="A LoRA job's adapter: its base model as the LoRA job named it (null: a full model)",
    )
    base_model: RegisteredModel | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="A LoRA job's adapter on a stored model (model:NAME, job:ID…): that model's record",
    )


class ManifestFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    bytes: int = Field(ge=0)
    sha256: SHA256


def manifest_bytes(files: list[ManifestFile]) -> bytes:
    """The canonical manifest of these files: sorted by path, keys sorted, no spaces."""
    entries = [f.model_dump() for f in sorted(files, key=lambda f: f.path)]
    return json.dumps({"files": entries}, sort_keys=True, separators=(",", ":")).encode()


def manifest_sha256(files: list[ManifestFile]) -> str:
    return hashlib.sha256(manifest_bytes(files)).hexdigest()


def read_manifest(data: bytes, sha256: str) -> list[ManifestFile]:
    """The files of a manifest fetched from the store; ValueError when it does not hash to `sha256`
    or is not a manifest."""
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ValueError(f"the manifest does not match its sha256 {sha256}")
    parsed: Any = json.loads(data)
    return [ManifestFile.model_validate(entry) for entry in parsed["files"]]
