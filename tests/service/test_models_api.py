"""/v1/models through the client: a model folder registered once, checked as it lands, stored by
content in the store (a local folder and moto's S3), owned, and named by jobs as `model:NAME`."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gluejobs import ApiError, Client
from shared.core.config import Settings
from shared.core.storage import open_store
from shared.model_folders.cache import cached_model
from shared.model_folders.model_types import KNOWN_MODEL_TYPES
from tests.support.e2e import live_api
from tests.support.kit import ALICE, ROOT, TINY_MODEL

BOB = "bob-key-0123456789abcdefgh"
SPEC = {"task_name": "sst2", "max_train_samples": 16, "eval_strategy": "no", "save_strategy": "no"}


@pytest.fixture
def keyed(request: pytest.FixtureRequest, settings_factory: Any, sqlite_url: str) -> Settings:
    """The local store, or moto's S3 where a test asks for it (`indirect`)."""
    kind = getattr(request, "param", "local")
    storage = {"storage_url": request.getfixturevalue("s3_url")} if kind == "s3" else {}
    settings: Settings = settings_factory(
        sqlite_url,
        api_keys=[f"alice={ALICE}", f"bob={BOB}"],
        admin_keys=[f"root={ROOT}"],
        max_model_bytes=8 * 1024 * 1024,
        **storage,
    )
    open_store(settings).check()
    return settings


@pytest.fixture
def url(keyed: Settings) -> Iterator[str]:
    with live_api(keyed) as http:
        yield str(http.base_url).rstrip("/")


@pytest.fixture
def tiny(models_dir: Path, tmp_path: Path) -> Path:
    """A copy of the tiny BERT folder that a test may spoil."""
    folder = tmp_path / "upload" / TINY_MODEL
    shutil.copytree(models_dir / TINY_MODEL, folder)
    return folder


def stored(settings: Settings) -> list[str]:
    return [f.path for f in open_store(settings).list("models")]


def test_known_model_types_are_transformers_own() -> None:
    """The snapshot is transformers' own list: the families GLUE work uses are in it, and it matches the
    installed transformers but for the few types a release adds or drops (an exact match would fail the
    suite on every transformers release; regenerate the snapshot when this drifts)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    installed = set(CONFIG_MAPPING_NAMES)
    families = {"bert", "roberta", "deberta", "deberta-v2", "distilbert", "electra", "albert", "xlm-roberta"}
    assert families <= KNOWN_MODEL_TYPES & installed
    assert len(KNOWN_MODEL_TYPES ^ installed) <= 0.1 * len(installed), sorted(KNOWN_MODEL_TYPES ^ installed)


@pytest.mark.parametrize("keyed", ["local", "s3"], indirect=True)
def test_a_registered_model_is_stored_by_content_owned_and_named_by_jobs(
    url: str, keyed: Settings, tiny: Path
) -> None:
    with (
        Client(url, api_key=ALICE) as alice,
        Client(url, api_key=BOB) as bob,
        Client(url, api_key=ROOT) as root,
    ):
        model = alice.models.upload(tiny, name="my-bert")
        assert model.model_name_or_path == "model:my-bert" and model.model_type == "bert"
        files = {f["path"]: f for f in model.files}
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)
        blobs = sorted(f"blobs/{f['sha256']}" for f in model.files)
        assert stored(keyed) == [*blobs, f"manifests/{model.sha256}.json"]
        with pytest.raises(ApiError) as taken:
            alice.models.upload(tiny, name="my-bert")
        assert taken.value.status_code == 409 and taken.value.field == "name"

        # Bob neither sees nor uses it; an admin does both.
        assert [m.name for m in bob.models.list()] == []
        with pytest.raises(ApiError) as hidden:
            bob.models.get("my-bert")
        assert hidden.value.status_code == 404
        with pytest.raises(ApiError) as refused:
            bob.jobs.create({**SPEC, "model_name_or_path": "model:alice/my-bert"})
        assert refused.value.status_code == 404 and refused.value.field == "spec.model_name_or_path"
        assert root.models.get("my-bert", owner="alice").sha256 == model.sha256
        assert [m.model_name_or_path for m in root.models.list()] == ["model:alice/my-bert"]

        # The job records the model's hash; its dry run reads the tokenizer the API fetched alone.
        job = alice.jobs.create({**SPEC, "model_name_or_path": "model:my-bert"})
        assert job.spec["registered_model"] == {
            "name": "my-bert",
            "owner": "alice",
            "sha256": model.sha256,
            "bytes": model.bytes,
        }
        assert list(job.spec)[:3] == ["model_name_or_path", "registered_model", "task_name"]
        plan = alice.jobs.dry_run({**SPEC, "model_name_or_path": "model:my-bert"})
        assert plan.raw["tokens"]["status"] == "measured", plan.raw["tokens"]
        api_copy = keyed.cache_dir / "models" / f"{model.sha256}.tokenizer"
        assert (api_copy / "tokenizer.json").is_file() and not (api_copy / "model.safetensors").exists()
        admins = root.jobs.create({**SPEC, "model_name_or_path": "model:alice/my-bert"})
        assert admins.spec["registered_model"]["sha256"] == model.sha256

        # Not deleted while a queued job uses it; then gone from the store with its files.
        with pytest.raises(ApiError) as busy:
            alice.models.delete("my-bert")
        assert busy.value.status_code == 409 and str(job.id) in busy.value.message
        alice.jobs.cancel(job.id)
        root.jobs.cancel(admins.id)
        alice.models.delete("my-bert")
        assert stored(keyed) == []
        with pytest.raises(ApiError) as gone:
            alice.jobs.create({**SPEC, "model_name_or_path": "model:my-bert"})
        assert gone.value.status_code == 404


def _spoil(folder: Path, how: str) -> str:
    """Spoil the folder one way; the words the API's refusal must contain."""
    if how == "no config":
        (folder / "config.json").unlink()
        return "config.json"
    if how == "auto_map":
        config = json.loads((folder / "config.json").read_text())
        config["auto_map"] = {"AutoModel": "modeling_evil.EvilModel"}
        (folder / "config.json").write_text(json.dumps(config))
        return "auto_map"
    if how == "python":
        (folder / "modeling_evil.py").write_text("import os\n")
        return "modeling_evil.py"
    if how == "symlink":
        (folder / "vocab.txt").symlink_to("/etc/passwd")
        return "vocab.txt"
    if how == "unknown type":
        config = json.loads((folder / "config.json").read_text())
        config["model_type"] = "evil-net"
        (folder / "config.json").write_text(json.dumps(config))
        return "evil-net"
    assert how == "too big"
    (folder / "pytorch_model.bin").write_bytes(b"\0" * 9 * 1024 * 1024)
    return "larger than"


@pytest.mark.parametrize("how", ["no config", "auto_map", "python", "symlink", "unknown type", "too big"])
def test_a_spoilt_folder_is_refused_and_nothing_is_kept(
    url: str, keyed: Settings, tiny: Path, how: str
) -> None:
    words = _spoil(tiny, how)
    with Client(url, api_key=ALICE) as alice:
        with pytest.raises(ApiError) as refused:
            alice.models.upload(tiny, name="spoilt")
        assert refused.value.status_code == (413 if how == "too big" else 422), refused.value
        assert words in refused.value.message
        assert list(alice.models.list()) == []
    assert stored(keyed) == []
    assert list((keyed.cache_dir / "uploads").glob("*")) == []  # the tar and its unpacked folder


@pytest.mark.parametrize("keyed", ["local", "s3"], indirect=True)
def test_a_corrupt_cached_copy_is_fetched_again(url: str, keyed: Settings, tiny: Path) -> None:
    with Client(url, api_key=ALICE) as alice:
        model = alice.models.upload(tiny, name="my-bert")
    store = open_store(keyed)
    worker_cache = keyed.cache_dir / "worker"
    folder = cached_model(store, worker_cache, model.sha256)
    weights = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(weights[: len(weights) // 2])  # truncated on disk

    again = cached_model(store, worker_cache, model.sha256)

    assert again == folder and (again / "model.safetensors").read_bytes() == weights
