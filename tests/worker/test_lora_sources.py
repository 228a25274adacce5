"""A LoRA job's adapter as a source (issue 33 item 3), without processes: the adapter names its Hub base
by commit, and the worker reads the head's size from the adapter to load the base before PEFT puts the
adapter on it (the end-to-end run: test_lora_sources_end_to_end.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from shared.core.config import Settings
from shared.jobspec.registered_models import RegisteredModel
from shared.jobspec.spec import JobSpec
from shared.model_folders.reading import api_model_folder
from tests.support.kit import TINY_MODEL
from worker.training.lora_sources import head_size, hub_revision, merge_into
from worker.training.modeling import apply_lora, save_model_files

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def test_an_adapter_names_its_hub_base_by_commit_and_merges_with_its_head(
    models_dir: Path, tmp_path: Path
) -> None:
    base = models_dir / TINY_MODEL
    assert hub_revision(f"/hub/models--org--name/snapshots/{COMMIT}") == COMMIT
    assert hub_revision(str(base)) is None  # a folder under GLUEJOBS_MODELS_DIR: named, not pinned
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=3)
    model.hub_revision = COMMIT  # as load_model records a Hub model's snapshot
    lora = apply_lora(model, r=2, alpha=4)
    for name, weight in lora.named_parameters():
        if "lora_B" in name:  # trained: no longer zero
            torch.nn.init.normal_(weight, std=0.5)
    save_model_files(lora, AutoTokenizer.from_pretrained(base), tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (config["base_model_name_or_path"], config["revision"]) == (str(base), COMMIT)

    assert head_size(tmp_path / "adapter", str(base)) == 3  # three labels, where the default is two
    merge_into(tmp_path / "adapter", str(base), tmp_path / "merged")
    merged = AutoModelForSequenceClassification.from_pretrained(tmp_path / "merged").eval()
    batch = AutoTokenizer.from_pretrained(tmp_path / "merged")(["a fine film"], return_tensors="pt")
    with torch.no_grad():
        assert torch.allclose(lora.eval()(**batch).logits, merged(**batch).logits, atol=1e-5)


def test_the_api_reads_an_adapters_config_from_its_base(
    settings_factory: Any, sqlite_url: str, models_dir: Path
) -> None:
    settings: Settings = settings_factory(sqlite_url)
    adapter = RegisteredModel(
        name="job-5", sha256="a" * 64, bytes=1, job=5, base_model_name_or_path=TINY_MODEL
    )
    spec = JobSpec(model_name_or_path="job:5", task_name="sst2", registered_model=adapter)
    # The job's model is the adapter merged into its base: the base's config (shape) and tokenizer.
    assert api_model_folder(spec, settings) == models_dir / TINY_MODEL


def test_a_merge_on_request_is_an_evaluation_job_from_an_adapter_that_saves_it() -> None:
    merge = {"task_name": "sst2", "do_train": False, "do_eval": True, "save_merged_model": True}
    assert JobSpec.model_validate({**merge, "model_name_or_path": "job:5/checkpoint-40"}).save_merged_model
    for refused in (
        {**merge, "model_name_or_path": TINY_MODEL},  # no adapter to merge
        {"model_name_or_path": TINY_MODEL, "task_name": "sst2", "save_merged_model": True},  # no LoRA
    ):
        with pytest.raises(ValidationError) as caught:
            JobSpec.model_validate(refused)
        assert [error["loc"][0] for error in caught.value.errors()] == ["save_merged_model"]
