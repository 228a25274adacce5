"""Files built by an attacker: each is refused with 422 naming the limit and its setting, before it
unfolds, while the API's own memory stays flat and other users are served (issue 21, findings 1-3, 8).

The files are built here, capped so that the suite's disk stays small: the ~1 KB parquet bomb (one
100 KB string, dictionary-encoded, 50,000 times: 5 GB once decoded), a CSV header of 1,000,000
columns (14 MB), a CSV of one 100 MB quoted cell (written to disk in blocks, never held in memory), a
56 MB JSON array, and labels that are JSON objects.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from service.files.check_runner import FileChecks
from service.main import create_app
from shared.core.config import Settings
from shared.core.errors import InvalidRequest, TooBusy
from shared.core.storage import file_key, open_store
from shared.data.limits import FileLimits
from shared.data.reading import DataError, read_frame
from shared.jobspec.uploaded_files import cache_path
from tests.support.e2e import LOOPBACK_URL, api_process
from tests.support.kit import ALICE, TINY_MODEL

logger = logging.getLogger(__name__)
BOB = "bob-key-0123456789abcdefgh"
MIB = 1024 * 1024
# The API's peak RSS may grow this much while it receives and checks any one of the files below: the
# upload streams to disk and the check runs in a child process (measured: 0-3 MiB).
API_GROWTH_BOUND_MIB = 40


def as_(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def parquet_bomb(path: Path) -> Path:
    """A zstd dictionary column of one 100 KB string repeated 50,000 times: ~1 KB on disk, 5 GB read."""
    cell = pa.array(["x" * 100_000])
    column = pa.DictionaryArray.from_arrays(pa.array([0] * 50_000, pa.int32()), cell)
    table = pa.table({"sentence": column, "label": pa.array([1] * 50_000)})
    pq.write_table(table, path, compression="zstd", write_statistics=False)
    return path


def wide_csv(path: Path, columns: int = 1_000_000) -> Path:
    with path.open("w") as out:
        out.write(",".join(f"c{i}" for i in range(columns)) + "\n")
        for _ in range(3):
            out.write(",".join("1" for _ in range(columns)) + "\n")
    return path


def one_cell_csv(path: Path, megabytes: int) -> Path:
    """One quoted cell of `megabytes` MB (commas and newlines inside it), written a block at a time."""
    block = "a sentence, with a comma\n" * (MIB // 25)
    with path.open("w") as out:
        out.write('sentence,label\n"')
        for _ in range(megabytes):
            out.write(block)
        out.write('",1\n')
    return path


def json_array(path: Path, records: int) -> Path:
    with path.open("w") as out:
        out.write("[")
        for i in range(records):
            out.write(
                ("," if i else "") + json.dumps({"sentence": f"sentence number {i} here", "label": i % 2})
            )
        out.write("]")
    return path


def object_labels(path: Path) -> Path:
    path.write_text("".join(json.dumps({"sentence": "s", "label": {"a": i}}) + "\n" for i in range(10)))
    return path


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def _post(client: Any, path: Path, key: str = ALICE) -> Any:
    with path.open("rb") as handle:
        return client.post("/v1/files", files={"file": (path.name, handle)}, headers=as_(key))


@pytest.fixture
def keyed(settings_factory: Any, sqlite_url: str) -> Settings:
    settings: Settings = settings_factory(sqlite_url, api_keys=[ALICE, BOB])
    return settings


@pytest.mark.e2e
def test_hostile_uploads_get_422_naming_the_limit_while_the_api_stays_flat_and_serves_others(
    keyed: Settings, tmp_path: Path
) -> None:
    attacks = {
        "bomb.parquet": (parquet_bomb(tmp_path / "bomb.parquet"), "GLUEJOBS_FILE_MAX_CELL_BYTES"),
        "wide.csv": (wide_csv(tmp_path / "wide.csv"), "GLUEJOBS_FILE_MAX_COLUMNS"),
        "labels.jsonl": (object_labels(tmp_path / "labels.jsonl"), "'label' column holds a dict"),
    }
    with api_process(keyed, log=tmp_path / "api.log") as (client, process):
        warm = _post(client, json_array(tmp_path / "warm.json", 50))
        assert warm.status_code == 201, warm.text
        api = psutil.Process(process.pid)
        for name, (path, named) in attacks.items():
            before, cpu = _peak_rss_kib(process.pid), api.cpu_times()
            answer = _post(client, path)
            grown = (_peak_rss_kib(process.pid) - before) / 1024
            used = sum(api.cpu_times()[:2]) - sum(cpu[:2])
            logger.info(
                f"{name}: {path.stat().st_size} bytes, API peak RSS +{grown:.1f} MiB, API CPU {used:.2f} s"
            )
            assert answer.status_code == 422, answer.text
            assert named in answer.json()["error"]["message"], answer.text
            assert len(answer.text) < 1000  # never the cell, never the header
            assert grown < API_GROWTH_BOUND_MIB, f"{name}: the API's peak RSS grew {grown:.0f} MiB"

        # A 100 MB quoted cell, while another user lists their files.
        cell = one_cell_csv(tmp_path / "cell.csv", megabytes=100)
        before = _peak_rss_kib(process.pid)
        answers: list[Any] = []
        upload = threading.Thread(target=lambda: answers.append(_post(client, cell)))
        upload.start()
        served = 0
        while upload.is_alive():
            listing = client.get("/v1/files", headers=as_(BOB))
            assert listing.status_code == 200, listing.text
            served += 1
        upload.join()
        cell.unlink()
        grown = (_peak_rss_kib(process.pid) - before) / 1024
        logger.info(f"cell.csv: 100 MB, API peak RSS +{grown:.1f} MiB, {served} listings served meanwhile")
        assert answers[0].status_code == 422, answers[0].text
        assert "GLUEJOBS_FILE_MAX_CELL_BYTES" in answers[0].json()["error"]["message"]
        assert served >= 1 and grown < API_GROWTH_BOUND_MIB

        # A large JSON array is read element by element: accepted, the API flat.
        array = json_array(tmp_path / "array.json", records=1_000_000)
        before = _peak_rss_kib(process.pid)
        answer = _post(client, array)
        grown = (_peak_rss_kib(process.pid) - before) / 1024
        logger.info(f"array.json: {array.stat().st_size} bytes, API peak RSS +{grown:.1f} MiB")
        assert answer.status_code == 201, answer.text
        assert answer.json()["rows"] == 1_000_000
        assert grown < API_GROWTH_BOUND_MIB
        assert sorted(f["filename"] for f in client.get("/v1/files", headers=as_(ALICE)).json()["data"]) == [
            "array.json",
            "warm.json",
        ]


@pytest.fixture
def small_limits(settings_factory: Any, postgres_url: str) -> Settings:
    settings: Settings = settings_factory(
        postgres_url,
        api_keys=[ALICE, BOB],
        file_max_columns=5,
        file_max_row_bytes=4096,
        file_max_cell_bytes=1024,
        file_max_row_group_bytes=1024 * 1024,
    )
    return settings


def test_each_limit_answers_422_naming_its_setting_and_keeps_nothing_on_postgres(
    small_limits: Settings, tmp_path: Path
) -> None:
    wide_row = tmp_path / "long_row.tsv"
    wide_row.write_text("a\tb\tc\td\tlabel\n" + "\t".join(["word " * 200] * 5) + "\n")  # 5 KB
    long_element = tmp_path / "long.json"
    long_element.write_text(json.dumps([{"sentence": "s", "label": 1}, {"sentence": "w" * 5000, "label": 0}]))
    long_value = tmp_path / "long.jsonl"
    long_value.write_text(json.dumps({"sentence": "w" * 2000, "label": 1}) + "\n")
    group = tmp_path / "group.parquet"
    pq.write_table(pa.table({"sentence": [f"s{i}" for i in range(200_000)], "label": [1] * 200_000}), group)
    cases = {
        wide_csv(tmp_path / "wide.csv", columns=6): "GLUEJOBS_FILE_MAX_COLUMNS",
        wide_row: "GLUEJOBS_FILE_MAX_ROW_BYTES",
        one_cell_csv(tmp_path / "cell.csv", megabytes=1): "GLUEJOBS_FILE_MAX_CELL_BYTES",
        long_element: "GLUEJOBS_FILE_MAX_ROW_BYTES",
        long_value: "GLUEJOBS_FILE_MAX_CELL_BYTES",
        group: "GLUEJOBS_FILE_MAX_ROW_GROUP_BYTES",
    }
    with TestClient(create_app(small_limits), base_url=LOOPBACK_URL) as client:
        for path, setting in cases.items():
            answer = _post(client, path)
            assert answer.status_code == 422, (path.name, answer.text)
            assert setting in answer.json()["error"]["message"], (path.name, answer.text)
            assert answer.json()["error"]["field"] == "file"
        assert client.get("/v1/files", headers=as_(ALICE)).json()["data"] == []
    assert open_store(small_limits).list("files") == []


def test_a_check_past_its_memory_limit_is_a_422_and_a_full_house_a_429(
    settings_factory: Any, sqlite_url: str, tmp_path: Path
) -> None:
    # Limits on the shape let this through (one 60 MB row group of zeros, 2 KB on disk); the child's
    # address-space limit stops it.
    settings: Settings = settings_factory(
        sqlite_url, file_check_memory_bytes=64 * MIB, file_max_row_group_bytes=1024**3, max_file_checks=1
    )
    path = tmp_path / "zeros.parquet"
    zeros = pa.array([0.0] * 8_000_000)
    pq.write_table(pa.table({"sentence": ["s"] * 8_000_000, "label": zeros}), path, compression="zstd")
    checks = FileChecks(settings)
    with pytest.raises(InvalidRequest, match="GLUEJOBS_FILE_CHECK_MEMORY_BYTES"):
        checks.check(path, filename="zeros.parquet", purpose="train", task_name=None)
    with checks.slots.slot(), pytest.raises(TooBusy) as busy:
        checks.check(path, filename="zeros.parquet", purpose="train", task_name=None)
    assert busy.value.status_code == 429 and busy.value.retry_after_s > 0


def test_data_folder_files_are_held_to_the_same_limits(tmp_path: Path) -> None:
    limits = FileLimits.defaults()
    for path, setting in (
        (parquet_bomb(tmp_path / "bomb.parquet"), "GLUEJOBS_FILE_MAX_CELL_BYTES"),
        (wide_csv(tmp_path / "wide.csv", columns=2_000), "GLUEJOBS_FILE_MAX_COLUMNS"),
    ):
        with pytest.raises(DataError, match=setting) as refused:
            read_frame(path, f"train_file {path.name!r}", field="train_file", limits=limits)
        assert refused.value.field == "train_file" and len(refused.value.message) < 400


def test_jobs_on_an_uploaded_file_use_its_upload_s_checks_and_do_not_read_it_again(
    keyed: Settings, tmp_path: Path
) -> None:
    """A submission checks an uploaded file by what its upload found (rows, columns, label tally):
    with the stored bytes and this machine's copy replaced by junk, a job on it still passes, and one
    whose task its labels do not fit is refused in the reading rule's words."""
    names = ("negative", "positive")
    rows = b"sentence,label\n" + b"".join(f"a sentence {i},{names[i % 2]}\n".encode() for i in range(40))
    with TestClient(create_app(keyed), base_url=LOOPBACK_URL) as client:
        file = client.post("/v1/files", files={"file": ("train.csv", rows)}, headers=as_(ALICE)).json()
        plan = client.post(
            "/v1/jobs?dry_run=true",
            json={"spec": {"model_name_or_path": TINY_MODEL, "task_name": "sst2", "train_file": file["id"]}},
            headers=as_(ALICE),
        )
        assert plan.status_code == 200, plan.text
        assert plan.json()["data"]["splits"]["train"]["rows"] == 40
        assert plan.json()["data"]["splits"]["train"]["label_counts"] == {"negative": 20, "positive": 20}
        assert plan.json()["tokens"]["train"]["sample"] == "the first 40 of 40 rows (an uploaded file)"

        store = open_store(keyed)
        stored = Path(store.path(file_key(file["sha256"])))
        stored.unlink()  # the copy in the cache is a link to it: both go
        stored.write_bytes(b"\x00 not a table any more \xff")
        cache_path(keyed.cache_dir, file["sha256"], ".csv").unlink(missing_ok=True)

        spec = {"model_name_or_path": TINY_MODEL, "task_name": "sst2", "train_file": file["id"], "seed": 1}
        job = client.post("/v1/jobs", json={"spec": spec}, headers=as_(ALICE))
        assert job.status_code == 201, job.text
        sweep_spec = {**spec, "task_name": "mnli", "eval_strategy": "no"}
        refused = client.post("/v1/jobs", json={"spec": sweep_spec}, headers=as_(ALICE))
        assert refused.status_code == 422, refused.text
        message = refused.json()["error"]["message"]
        assert (
            "label 'negative' on row ? (one of 20 rows with it, by the upload's tally) does not fit"
            in message
        )
        assert refused.json()["error"]["field"] == "spec.train_file"
        assert not cache_path(keyed.cache_dir, file["sha256"], ".csv").exists()  # never fetched to be read


def test_a_data_folder_file_past_the_api_s_read_bound_is_left_to_the_worker(
    settings_factory: Any, sqlite_url: str
) -> None:
    """A file under GLUEJOBS_DATA_DIR larger than GLUEJOBS_MAX_CHECKED_DATA_BYTES is never read by the
    API: a submission on it is stored with a warning naming the setting (the worker checks it), a dry
    run answers 422 naming it; a file within the bound is checked as before."""
    # Above GLUE's SST-2 dev.tsv (95 KB), which the jobs evaluate on.
    settings: Settings = settings_factory(
        sqlite_url, api_keys=[f"alice={ALICE}"], max_checked_data_bytes=150_000
    )
    folder = settings.data_dir / "owners" / "alice"
    folder.mkdir(parents=True)
    names = ("negative", "positive")
    line = "a sentence of the kind a review holds, number {i},{label}\n"
    rows = [line.format(i=i, label=names[i % 2]) for i in range(4000)]
    (folder / "big.csv").write_text("sentence,label\n" + "".join(rows))  # about 240 KB
    (folder / "small.csv").write_text("sentence,label\n" + "".join(rows[:100]))
    with TestClient(create_app(settings), base_url=LOOPBACK_URL) as client:
        spec = {"model_name_or_path": TINY_MODEL, "task_name": "sst2", "train_file": "big.csv"}
        job = client.post("/v1/jobs", json={"spec": spec}, headers=as_(ALICE))
        assert job.status_code == 201, job.text
        [warning] = [w for w in job.json()["warnings"] if "not checked at submission" in w]
        assert "train_file" in warning and "GLUEJOBS_MAX_CHECKED_DATA_BYTES" in warning
        plan = client.post("/v1/jobs?dry_run=true", json={"spec": spec}, headers=as_(ALICE))
        assert plan.status_code == 422, plan.text
        assert plan.json()["error"]["field"] == "spec.train_file"
        assert "GLUEJOBS_MAX_CHECKED_DATA_BYTES" in plan.json()["error"]["message"]
        small = {**spec, "train_file": "small.csv", "max_train_samples": 5}
        checked = client.post("/v1/jobs", json={"spec": small}, headers=as_(ALICE))
        assert checked.status_code == 201, checked.text
        assert not [w for w in checked.json()["warnings"] if "not checked" in w]
        wrong = client.post(
            "/v1/jobs",
            json={"spec": {**small, "task_name": "mnli", "eval_strategy": "no"}},
            headers=as_(ALICE),
        )
        assert wrong.status_code == 422, wrong.text  # still read and checked: its labels do not fit
