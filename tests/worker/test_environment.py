"""The reproducibility record: real versions, the device, and content hashes that follow the bytes."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest
import torch

from shared.core.config import Settings
from shared.jobspec.spec import JobSpec
from tests.support.kit import REPO
from worker.fleet.reproducibility import collect_environment, sha256_of


@pytest.fixture
def own_data(settings_factory, tmp_path: Path) -> Settings:  # type: ignore[no-untyped-def]
    settings: Settings = settings_factory(f"sqlite:///{tmp_path / 'unused.db'}")
    (settings.data_dir / "train.csv").write_text("sentence,label\na fine film,1\na dull film,0\n")
    (settings.data_dir / "dev.csv").write_text("sentence,label\ngood,1\nbad,0\n")
    return settings


SPEC = JobSpec(model_name_or_path="tiny-bert", train_file="train.csv", validation_file="dev.csv", seed=4)


def test_the_record_holds_real_versions_the_device_and_the_spec(own_data: Settings, models_dir: Path) -> None:
    record = collect_environment(SPEC, own_data, attempt=2)

    for package in ("torch", "transformers", "accelerate", "peft", "datasets", "tokenizers", "gluejobs"):
        assert record["packages"][package] == metadata.version(package)
    assert record["packages"]["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert record["python"] == ".".join(map(str, sys.version_info[:3]))
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    )
    assert record["gluejobs_commit"] == head.stdout.strip()
    assert isinstance(record["gluejobs_checkout_modified"], bool)
    assert record["device"]["cpu"] and record["device"]["cpu_count"] == os.cpu_count()
    assert record["device"]["torch_threads"] == torch.get_num_threads()
    assert len(record["device"]["gpus"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert record["spec"] == SPEC.model_dump(mode="json") and record["attempt"] == 2
    weights = models_dir / "tiny-bert" / "model.safetensors"
    assert record["model_files"] == [
        {
            "role": "model.safetensors",
            "path": str(weights),
            "size": weights.stat().st_size,
            "sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
        }
    ]


def test_a_data_hash_changes_when_one_byte_does(own_data: Settings) -> None:
    train = own_data.data_dir / "train.csv"
    before = {f["role"]: f for f in collect_environment(SPEC, own_data)["data_files"]}

    content = bytearray(train.read_bytes())
    content[-3] = ord("9")  # "0\n" of the last label becomes "9\n": same size, one byte changed
    train.write_bytes(bytes(content))
    after = {f["role"]: f for f in collect_environment(SPEC, own_data)["data_files"]}

    assert set(before) == {"train_file", "validation_file"}
    assert before["train_file"]["size"] == after["train_file"]["size"]
    assert before["train_file"]["sha256"] != after["train_file"]["sha256"]
    assert after["train_file"]["sha256"] == hashlib.sha256(bytes(content)).hexdigest()
    assert before["validation_file"]["sha256"] == after["validation_file"]["sha256"]


def test_digests_of_settled_files_are_cached_by_path_size_and_mtime(tmp_path: Path) -> None:
    settled, fresh = tmp_path / "settled.bin", tmp_path / "fresh.bin"
    settled.write_bytes(b"weights" * 1000)
    fresh.write_bytes(b"new weights")
    an_hour_ago = time.time() - 3600
    os.utime(settled, (an_hour_ago, an_hour_ago))
    cache = tmp_path / "cache"

    first = sha256_of(settled, cache)
    assert sha256_of(fresh, cache) == hashlib.sha256(b"new weights").hexdigest()

    # One entry: the fresh file may still change within its mtime tick (git's "racily clean"), so
    # its digest is computed again next time rather than trusted.
    [entry] = (cache / "sha256").iterdir()
    assert entry.read_text() == first == hashlib.sha256(settled.read_bytes()).hexdigest()
    settled.write_bytes(b"WEIGHTS" * 1000)  # same size, a new mtime: the entry no longer applies
    assert sha256_of(settled, cache) == hashlib.sha256(b"WEIGHTS" * 1000).hexdigest()
