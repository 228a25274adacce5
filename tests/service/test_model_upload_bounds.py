"""Model uploads bounded and checked as data files are (issue 32, items 2, 5-9): an archive's declared
sizes (sparse maps included) against GLUEJOBS_MAX_MODEL_BYTES before a byte is written, capped
config and tokenizer files, every member name checked, every malformed archive a 422 naming the
problem, a declared shape past GLUEJOBS_MAX_MODEL_PARAMETERS refused at upload, submit and dry run,
nothing half-stored, dedup within an owner only, and the start-up sweep of models/."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from service.main import create_app
from shared import jobs_repo
from shared.core.config import Settings
from shared.core.db import Database
from shared.core.faults import CRASH_AT_ENV
from shared.core.storage import Store, model_blob_key, open_store
from shared.jobs_repo.model_objects import sweep_model_orphans
from tests.support.e2e import LOOPBACK_URL, api_process, wait_for
from tests.support.kit import ALICE, ROOT, TINY_MODEL

BOB = "bob-key-0123456789abcdefgh"
MAX_MODEL_BYTES = 64 * 1024 * 1024
SPEC = {"task_name": "sst2", "max_train_samples": 16, "eval_strategy": "no", "save_strategy": "no"}
# Where the store matters, each store runs on one database (both are covered, the suite stays fast);
# what is refused before the store is touched runs on both databases with the local store.
STORES = [
    pytest.param(("local", "sqlite"), id="local-sqlite"),
    pytest.param(("s3", "postgres"), id="s3-postgres", marks=pytest.mark.postgres),
]


def as_(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _keyed(settings_factory: Any, db_url: str, store_url: str | None, **overrides: Any) -> Settings:
    settings: Settings = settings_factory(
        db_url,
        storage_url=store_url,
        api_keys=[f"alice={ALICE}", f"bob={BOB}"],
        admin_keys=[f"root={ROOT}"],
        max_model_bytes=MAX_MODEL_BYTES,
        orphan_grace_s=0.0,
        **overrides,
    )
    open_store(settings).check()
    return settings


@pytest.fixture(params=STORES)
def keyed(request: pytest.FixtureRequest, settings_factory: Any) -> Settings:
    store, database = request.param
    store_url = request.getfixturevalue("s3_url") if store == "s3" else None
    return _keyed(settings_factory, request.getfixturevalue(f"{database}_url"), store_url)


@pytest.fixture
def keyed_local(settings_factory: Any, db_url: str) -> Settings:
    return _keyed(settings_factory, db_url, None)


def _client(settings: Settings) -> TestClient:
    # A failure inside the app answers 500 here, as it does behind a server.
    return TestClient(create_app(settings), base_url=LOOPBACK_URL, raise_server_exceptions=False)


@pytest.fixture
def client(keyed: Settings) -> Iterator[TestClient]:
    with _client(keyed) as test_client:
        yield test_client


@pytest.fixture
def client_local(keyed_local: Settings) -> Iterator[TestClient]:
    with _client(keyed_local) as test_client:
        yield test_client


@pytest.fixture
def tiny(models_dir: Path, tmp_path: Path) -> Path:
    """A copy of the tiny BERT folder that a test may spoil."""
    folder = tmp_path / "upload" / TINY_MODEL
    shutil.copytree(models_dir / TINY_MODEL, folder)
    return folder


def packed(folder: Path, *extra: tuple[tarfile.TarInfo, bytes]) -> bytes:
    """The folder as `gluejobs models upload` packs it, then `extra` members as an attacker adds them."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT, errors="surrogateescape") as tar:
        for path in sorted(folder.rglob("*")):
            tar.add(path, arcname=path.relative_to(folder).as_posix(), recursive=False)
        for info, data in extra:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return out.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    return info


def upload(
    client: TestClient, tar: bytes, name: str = "m", key: str = ALICE
) -> Any:  # the test client's response
    return client.post(
        "/v1/models", files={"file": ("model.tar", tar)}, data={"name": name}, headers=as_(key)
    )


def stored(settings: Settings) -> list[str]:
    """Every object under models/, partial copies included."""
    return [f.path for f in open_store(settings).list("models")]


def staged(settings: Settings) -> list[Path]:
    """What the API left in its upload folder."""
    folder = settings.cache_dir / "uploads"
    return sorted(folder.iterdir()) if folder.is_dir() else []


def refused(client: TestClient, settings: Settings, tar: bytes, status: int, *words: str) -> None:
    answer = upload(client, tar)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["field"] == "file", error
    for word in words:
        assert word in error["message"], error["message"]
    assert "/" + settings.cache_dir.name not in error["message"]  # no machine path
    assert stored(settings) == [] and staged(settings) == []
    for key in (ALICE, ROOT):
        listing = client.get("/v1/models", headers=as_(key))
        assert listing.status_code == 200 and listing.json()["data"] == []


def gnu_sparse(tiny: Path, tmp_path: Path, name: str, size: int) -> bytes:
    """A real GNU sparse tar of the folder with `name` a hole of `size` bytes (tar --sparse)."""
    (tiny / name).unlink(missing_ok=True)
    subprocess.run(["truncate", "-s", str(size), str(tiny / name)], check=True)
    out = tmp_path / "sparse.tar"
    subprocess.run(["tar", "--sparse", "--format=gnu", "-C", str(tiny), "-cf", str(out), "."], check=True)
    data = out.read_bytes()
    others = sum(path.stat().st_size for path in tiny.rglob("*") if path.name != name)
    assert len(data) < others + 64 * 1024  # the hole is not in the archive: only its map is
    return data


# --- item 2: sizes declared, not sent ----------------------------------------------------------------


def test_a_sparse_weight_file_past_the_cap_is_refused_before_a_byte_is_written(
    client_local: TestClient, keyed_local: Settings, tiny: Path, tmp_path: Path
) -> None:
    tar = gnu_sparse(tiny, tmp_path, "model.safetensors", 4 * 1024**3)
    refused(client_local, keyed_local, tar, 413, "GLUEJOBS_MAX_MODEL_BYTES")


@pytest.mark.parametrize("size", [2 * 1024**3, 2 * 1024 * 1024], ids=["2GiB", "2MiB"])
def test_a_sparse_config_past_its_own_cap_is_refused(
    client_local: TestClient, keyed_local: Settings, tiny: Path, tmp_path: Path, size: int
) -> None:
    """The config's cap holds whatever room the folder's cap leaves (2 MiB is well within 64 MiB)."""
    tar = gnu_sparse(tiny, tmp_path, "config.json", size)
    refused(client_local, keyed_local, tar, 422, "config.json", "1048576 bytes")


def test_a_pax_sparse_member_counts_at_its_real_size(
    client_local: TestClient, keyed_local: Settings, tiny: Path, tmp_path: Path
) -> None:
    (tiny / "model.safetensors").unlink()
    subprocess.run(["truncate", "-s", str(MAX_MODEL_BYTES + 1), str(tiny / "model.safetensors")], check=True)
    out = tmp_path / "pax.tar"
    subprocess.run(["tar", "--sparse", "--format=posix", "-C", str(tiny), "-cf", str(out), "."], check=True)
    refused(client_local, keyed_local, out.read_bytes(), 413, "GLUEJOBS_MAX_MODEL_BYTES")


def _long_header(kind: bytes, size: int) -> bytes:
    """A GNU long-name or PAX header of `size` bytes (a name of 'a's, or one comment record), then the
    small member it describes: what tarfile would read whole into the API's memory."""
    if kind == tarfile.XHDTYPE:
        record = b" comment=" + b"c" * (size - 20) + b"\n"
        length = len(record) + len(str(len(record)))  # a PAX record's length counts its own digits
        length = len(record) + len(str(length))
        data = b"%d" % length + record
    else:
        data = b"a" * (size - 1) + b"\0"
    head = member("././@LongLink" if kind != tarfile.XHDTYPE else "PaxHeaders/x", kind)
    head.size = len(data)
    small = member("extra.json")
    small.size = 2
    return (
        head.tobuf(tarfile.USTAR_FORMAT) + data + bytes(-len(data) % tarfile.BLOCKSIZE)
        + small.tobuf(tarfile.USTAR_FORMAT) + b"{}" + bytes(tarfile.BLOCKSIZE - 2)
    )  # fmt: skip


@pytest.mark.parametrize("kind", [tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE], ids=["gnu-long-name", "pax"])
def test_a_member_header_past_its_cap_is_refused_before_tarfile_reads_it(
    client_local: TestClient, keyed_local: Settings, tiny: Path, kind: bytes
) -> None:
    """Issue 32's re-test: a 200 MB long name or PAX record made the API hold 800 MB and stalled
    /healthz 1.4-4.9 s while tarfile parsed it; now a header past 1 MiB is a 422 before it is read."""
    tar = _long_header(kind, 2 * 1024 * 1024) + packed(tiny)
    refused(client_local, keyed_local, tar, 422, "PAX header", "1048576")
    # A header a tool writes stays well within the cap: a PAX comment of 64 KiB registers.
    within = upload(client_local, _long_header(tarfile.XHDTYPE, 64 * 1024) + packed(tiny), name="within")
    assert within.status_code == 201, within.text


def test_a_large_tokenizer_file_is_refused(
    client_local: TestClient, keyed_local: Settings, tiny: Path, tmp_path: Path
) -> None:
    """Within the folder's cap (raised here), past the 64 MiB of a file the dry run reads whole."""
    tar = gnu_sparse(tiny, tmp_path, "merges.txt", 64 * 1024 * 1024 + 1)
    client_local.app.state.settings = keyed_local.model_copy(update={"max_model_bytes": 1024**3})  # type: ignore[attr-defined]
    refused(client_local, keyed_local, tar, 422, "merges.txt", "67108864 bytes")


# --- items 5 and 7: names and malformed archives -----------------------------------------------------

BAD_MEMBERS = [
    pytest.param([member("\udcff\udcfe.json")], "not UTF-8", id="non-utf8-name"),
    pytest.param([member("a" * 295 + ".json")], "longer than 200 characters", id="300-character-name"),
    pytest.param([member("d/" + "é" * 130 + ".json")], "longer than 255 bytes", id="255-byte-part"),
    pytest.param([member("extra.json"), member("extra.json")], "twice", id="duplicate"),
    pytest.param(
        [member("x.json"), member("x.json", tarfile.DIRTYPE)],
        "both a file and a folder",
        id="file-then-folder",
    ),
    pytest.param(
        [member("x.json", tarfile.DIRTYPE), member("x.json")],
        "both a file and a folder",
        id="folder-then-file",
    ),
    pytest.param(
        [member("x.json"), member("x.json/inner.json")], "both a file and a folder", id="file-as-parent"
    ),
    pytest.param([member("tab\there.json")], "control character", id="control-character"),
]


@pytest.mark.parametrize(("extra", "words"), BAD_MEMBERS)
def test_bad_member_names_are_422_naming_the_problem_and_keep_nothing(
    client_local: TestClient, keyed_local: Settings, tiny: Path, extra: list[tarfile.TarInfo], words: str
) -> None:
    tar = packed(tiny, *[(info, b"{}") for info in extra])
    refused(client_local, keyed_local, tar, 422, words)


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(lambda tar, data_end: data_end - 100, id="inside-the-last-file"),
        pytest.param(lambda tar, data_end: 512 + 300, id="inside-a-header"),
        pytest.param(lambda tar, data_end: 1024 + 512 * 2, id="at-a-header"),
    ],
)
def test_a_truncated_tar_is_422(
    client_local: TestClient, keyed_local: Settings, tiny: Path, cut: Any
) -> None:
    whole = packed(tiny)
    with tarfile.open(fileobj=io.BytesIO(whole)) as archive:
        last = archive.getmembers()[-1]
        data_end = last.offset_data + last.size
    refused(client_local, keyed_local, whole[: cut(whole, data_end)], 422, "cut short")


def test_garbage_where_a_header_belongs_is_422(
    client_local: TestClient, keyed_local: Settings, tiny: Path
) -> None:
    whole = packed(tiny)
    end = len(whole.rstrip(b"\0"))
    end += -end % 512
    refused(client_local, keyed_local, whole[:end] + b"\x01" * 512 + bytes(1024), 422, "malformed")


# --- item 8: a declared shape past the parameter cap ------------------------------------------------


def absurd(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "hidden_size": 10**6}))


def test_an_absurd_config_is_refused_at_upload(
    client_local: TestClient, keyed_local: Settings, tiny: Path
) -> None:
    absurd(tiny)
    refused(client_local, keyed_local, packed(tiny), 422, "GLUEJOBS_MAX_MODEL_PARAMETERS", "trillion", "GiB")


def test_a_size_that_is_not_a_number_is_refused(
    client_local: TestClient, keyed_local: Settings, tiny: Path
) -> None:
    config = json.loads((tiny / "config.json").read_text())
    (tiny / "config.json").write_text(json.dumps({**config, "num_hidden_layers": "12"}))
    refused(client_local, keyed_local, packed(tiny), 422, "num_hidden_layers", "whole number")


def test_the_real_models_pass_the_default_cap(tiny: Path, minilm_path: Path) -> None:
    """The estimate is a transformer's: the tiny BERT and MiniLM are far below the default cap, and
    near their real sizes (all-MiniLM-L6-v2: 22.7M parameters)."""
    from shared.model_folders.model_size import estimate_parameters

    minilm = json.loads((minilm_path / "config.json").read_text())
    estimate = estimate_parameters(minilm, field="file")
    assert estimate is not None and 21e6 < estimate < 24e6
    assert Settings().max_model_parameters > 100 * estimate
    # A Llama-2-7B config (gated MLP, untied output): 6.74B parameters, within the default cap.
    llama = {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_key_value_heads": 32,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
    }
    seven = estimate_parameters(llama, field="file")
    assert seven is not None and 6.5e9 < seven < 7.0e9 < Settings().max_model_parameters


def test_an_absurd_model_is_refused_at_submit_and_in_the_dry_run(
    settings_factory: Any, db_url: str, tiny: Path, models_dir: Path, tmp_path: Path
) -> None:
    """A local folder under GLUEJOBS_MODELS_DIR, and a model registered before the cap was lowered."""
    local = tmp_path / "models"
    shutil.copytree(models_dir, local)
    absurd(local / TINY_MODEL)
    generous = _keyed(settings_factory, db_url, None, models_dir=local, max_model_parameters=10**20)
    strict = generous.model_copy(update={"max_model_parameters": 10**9})
    with _client(generous) as client:
        tiny_copy = tmp_path / "absurd"
        shutil.copytree(local / TINY_MODEL, tiny_copy)
        assert upload(client, packed(tiny_copy), name="huge").status_code == 201
    with _client(strict) as client:
        for model in (TINY_MODEL, "model:huge"):
            spec = {**SPEC, "model_name_or_path": model}
            for path in ("/v1/jobs", "/v1/jobs?dry_run=true"):
                answer = client.post(path, json={"spec": spec}, headers=as_(ALICE))
                assert answer.status_code == 422, (model, path, answer.text)
                error = answer.json()["error"]
                assert "GLUEJOBS_MAX_MODEL_PARAMETERS" in error["message"], error
                assert "model_name_or_path" in (error["field"] or ""), error
        with Database(strict.database_url).session() as session:
            assert jobs_repo.list_jobs(session)[0] == []


# --- items 6 and 9: dedup within an owner, nothing half-stored, the sweep ----------------------------


class RecordingStore(Store):
    """The app's store, recording every write and look-up and its key."""

    calls: list[tuple[str, str]]

    def exists(self, key: str) -> bool:
        self.calls.append(("exists", key))
        return super().exists(key)

    def put(self, local: Path, key: str) -> None:
        self.calls.append(("put", key))
        super().put(local, key)


def variant(tiny: Path, tmp_path: Path, n: int) -> Path:
    """The tiny folder with its config.json changed: one file of new bytes nobody has."""
    folder = tmp_path / f"variant-{n}"
    shutil.copytree(tiny, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "variant": n}))
    return folder


def test_dedup_is_within_an_owner_only(client: TestClient, tiny: Path, tmp_path: Path) -> None:
    store = client.app.state.store  # type: ignore[attr-defined]
    recording = RecordingStore(store.fs, store.root, url=store.url, local_root=store.local_root, retry_s=1.0)
    recording.calls = []
    client.app.state.store = recording  # type: ignore[attr-defined]

    def send(key: str, folder: Path, name: str) -> tuple[Any, list[str]]:
        recording.calls.clear()
        answer = upload(client, packed(folder), name=name, key=key)
        return answer, sorted(op for op, _key in recording.calls)

    bobs, _ = send(BOB, tiny, "bert")
    known, known_ops = send(ALICE, tiny, "bert")  # every byte Bob holds
    new, new_ops = send(ROOT, variant(tiny, tmp_path, 1), "other")  # one file nobody holds
    assert (bobs.status_code, known.status_code, new.status_code) == (201, 201, 201), new.text
    files = len(known.json()["files"])
    assert known_ops == new_ops == ["exists"] * (files + 1) + ["put"] * (files + 1)
    # The owner's own bytes again: nothing is written.
    again, again_ops = send(ALICE, tiny, "bert-again")
    assert again.status_code == 201 and "put" not in again_ops


def test_racing_uploads_for_one_name_leave_only_the_winners_objects(
    client: TestClient, keyed: Settings, tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both passed the name check before either wrote its row (has_model said no to both)."""
    monkeypatch.setattr(jobs_repo, "has_model", lambda *_a, **_k: False)
    winner = upload(client, packed(tiny), name="bert")
    loser = upload(client, packed(variant(tiny, tmp_path, 2)), name="bert")
    assert winner.status_code == 201 and loser.status_code == 409, loser.text
    kept = winner.json()
    blobs = sorted(f"blobs/{f['sha256']}" for f in kept["files"])
    assert stored(keyed) == [*blobs, f"manifests/{kept['sha256']}.json"]


def test_a_failed_row_write_keeps_objects_another_model_holds(
    client: TestClient, keyed: Settings, tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bobs = upload(client, packed(tiny), name="bert", key=BOB).json()
    before = stored(keyed)

    def failing(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("the database went away")

    monkeypatch.setattr(jobs_repo, "add_model", failing)
    assert upload(client, packed(tiny), name="bert").status_code == 500
    assert stored(keyed) == before and len(before) == len(bobs["files"]) + 1


def test_the_sweep_removes_orphans_and_partial_copies_keeps_held_and_young(
    keyed: Settings, tiny: Path
) -> None:
    with _client(keyed) as client:
        kept = upload(client, packed(tiny), name="bert").json()
    store = open_store(keyed)
    orphan = keyed.cache_dir / "orphan.bin"
    orphan.write_bytes(b"nobody's bytes")
    store.put(orphan, model_blob_key("0" * 64))
    store.put(orphan, f"models/manifests/{'1' * 64}.json")
    if store.is_local:  # what a local store's write killed midway leaves
        (Path(store.path("models/blobs")) / f"{'2' * 64}.0a1b2c3d.partial").write_bytes(b"half")
    database = Database(keyed.database_url)
    assert sweep_model_orphans(database, store, grace_s=3600.0) == 0  # too young: an upload may be in flight
    assert sweep_model_orphans(database, store, grace_s=0.0) == (3 if store.is_local else 2)
    blobs = sorted(f"blobs/{f['sha256']}" for f in kept["files"])
    assert stored(keyed) == [*blobs, f"manifests/{kept['sha256']}.json"]


@pytest.mark.e2e
@pytest.mark.parametrize("crash_at", ["store_put", "after_model_put"])
def test_an_api_killed_mid_upload_leaves_nothing_after_its_restart(
    keyed: Settings, tiny: Path, tmp_path: Path, crash_at: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CRASH_AT_ENV, crash_at)
    tar = packed(tiny)
    with api_process(keyed, log=tmp_path / "api.log") as (http, process):
        with pytest.raises(httpx.TransportError):  # the process is gone mid-request
            http.post("/v1/models", files={"file": ("m.tar", tar)}, data={"name": "m"}, headers=as_(ALICE))
        process.wait(timeout=20)
    left = stored(keyed)
    if crash_at == "store_put" and keyed.storage_url:
        assert left == []  # S3 writes an object whole or not at all
    else:
        assert left, "the crash point was not reached"
        if crash_at == "store_put":
            assert all(path.endswith(".partial") for path in left), left
    monkeypatch.delenv(CRASH_AT_ENV)
    with api_process(keyed, log=tmp_path / "api2.log") as (http, _process):  # its start sweeps
        assert http.get("/v1/models", headers=as_(ALICE)).json()["data"] == []
        # The sweep runs beside the API's first requests (service/main.store_chores).
        wait_for(lambda: stored(keyed) == [], timeout_s=60)
