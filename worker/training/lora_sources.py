"""A LoRA job's adapter as the model of another job (`job:17`, `job:17/checkpoint-300`, `job:17/best`
of a job that trained with apply_lora).

The adapter folder holds the LoRA matrices and the trained head (PEFT's modules_to_save), not the
backbone: the stored spec's record names the base the adapter was trained on (its
`base_model_name_or_path`, and its own record when the base is a stored model, pinned by its sha256;
a Hub base is pinned by the commit the adapter's adapter_config.json records as `revision`). This
worker loads the base, puts the adapter on it with PEFT's own loading (PeftModel.from_pretrained) and
merges it (merge_and_unload): the merged folder, with the adapter's tokenizer, is what the job loads
as its model, like any full model. So an evaluation job evaluates the weights the LoRA job trained
(its predictions are those of the job's own final evaluation, to float rounding), and a job that
trains from it starts from the merged model: a new adapter on it (apply_lora) or every weight.

The merged folder is kept in the cache by the hash of the record (the adapter's sha256 and its base's
pin), written whole under another name and renamed: a second job of the same source reuses it.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Protocol

import torch

from shared.core.config import Settings
from shared.core.errors import JobFailed
from shared.jobspec.registered_models import RegisteredModel
from shared.model_folders.uploads import is_tokenizer_file
from shared.wire.job_folder import MANIFEST_NAME

ADAPTER_CONFIG = "adapter_config.json"
_NOT_TOKENIZER = {ADAPTER_CONFIG, MANIFEST_NAME, "config.json"}
_MERGED_DIR = "merged-adapters"
_DONE = "gluejobs_merged.json"  # written last: a folder without it is an interrupted merge
# A Hugging Face cache folder: …/models--org--name/snapshots/<commit>.
_SNAPSHOT = re.compile(r"/models--[^/]+/snapshots/(?P<commit>[0-9a-f]{40})/?$")


class Resolve(Protocol):
    def __call__(
        self,
        name_or_path: str,
        settings: Settings,
        *,
        registered: RegisteredModel | None,
        revision: str | None,
    ) -> str: ...


def hub_revision(model_folder: str) -> str | None:
    """The commit of a Hub model this worker loaded from its cache (its snapshot folder's name)."""
    found = _SNAPSHOT.search(model_folder)
    return found["commit"] if found else None


def is_adapter(record: RegisteredModel | None) -> bool:
    """Whether the stored model a spec names is a LoRA job's adapter (it names its base)."""
    return record is not None and record.base_model_name_or_path is not None


class AdapterError(JobFailed):
    """The adapter could not be put on its base (modeling.py's ModelError's words and code)."""

    failure_code = "model_load_failed"


def merged_adapter(adapter: Path, record: RegisteredModel, settings: Settings, resolve: Resolve) -> Path:
    """This worker's folder of the adapter `adapter` (the record's files) merged into its base, which
    `resolve` (worker/modeling.resolve_model) finds as any model is found."""
    key = hashlib.sha256(record.model_dump_json().encode()).hexdigest()
    folder = settings.cache_dir / _MERGED_DIR / key
    if (folder / _DONE).is_file():
        return folder
    assert record.base_model_name_or_path is not None
    try:
        revision = json.loads((adapter / ADAPTER_CONFIG).read_text()).get("revision")
    except (OSError, ValueError) as exc:
        raise AdapterError(f"the adapter of {record.name} has no readable {ADAPTER_CONFIG}") from exc
    base = resolve(record.base_model_name_or_path, settings, registered=record.base_model, revision=revision)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{key[:12]}-") as staging:
        merge_into(adapter, base, Path(staging) / "merged")
        (Path(staging) / "merged" / _DONE).write_text(json.dumps({"adapter": record.sha256}))
        shutil.rmtree(folder, ignore_errors=True)
        (Path(staging) / "merged").rename(folder)
    return folder


def merge_into(adapter: Path, base: str, out: Path) -> None:
    """Load the base (a folder), put the adapter on it with PEFT, merge, and save the full model and
    the adapter's tokenizer in `out`: a folder that from_pretrained loads."""
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    try:
        num_labels = head_size(adapter, base)
        model = AutoModelForSequenceClassification.from_pretrained(
            base, num_labels=num_labels, trust_remote_code=False, dtype=torch.float32
        )
        peft_model = PeftModel.from_pretrained(model, str(adapter))
        merged: Any = peft_model.merge_and_unload()
    except Exception as exc:  # PEFT and transformers raise many types: a base that does not fit …
        raise AdapterError(f"could not put the LoRA adapter on its base model: {exc}") from exc
    out.mkdir(parents=True)
    merged.save_pretrained(str(out))
    for path in adapter.iterdir():  # the tokenizer, not the adapter's own files nor its manifest
        if path.is_file() and is_tokenizer_file(path.name) and path.name not in _NOT_TOKENIZER:
            shutil.copyfile(path, out / path.name)


def head_size(adapter: Path, base: str) -> int:
    """How many outputs the adapter's trained head has: the shape of its head's weights (PEFT saves
    them beside the LoRA matrices) where they differ from the head a model of the base's default
    label count would build (a regression head has one; a head of two is the default's own size)."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(base, trust_remote_code=False)
    with torch.device("meta"):
        shapes = {
            name: tuple(p.shape)
            for name, p in AutoModelForSequenceClassification.from_config(config).state_dict().items()
        }
    default = int(config.num_labels)
    with safe_open(str(adapter / "adapter_model.safetensors"), framework="pt") as handle:
        for key in handle.keys():  # noqa: SIM118  # safe_open is not a mapping
            name = key.removeprefix("base_model.model.")
            if "lora_" in name or name not in shapes:
                continue
            saved = tuple(handle.get_slice(key).get_shape())
            if saved != shapes[name] and len(saved) in (1, 2) and saved[1:] == shapes[name][1:]:
                return int(saved[0])
    return default
