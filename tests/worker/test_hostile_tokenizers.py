"""A registered model's tokenizer cannot hurt the API (issue 32 item 4): its tokenizer.json is its owner's
program (regexes Oniguruma backtracks on), so a dry run measures token lengths in a child process under
memory, CPU and wall-clock limits (service/dry_run/tokenizer_child.py). A catastrophic `Split` answers
422 naming the limit within its deadline while other clients are served; a tokenizer that panics
answers a clean 422 with one line in the log; one owner holds at most half the dry-run slots; a
normal tokenizer measures what the worker's would.
Against a live API, models registered through the client, on SQLite and Postgres."""

from __future__ import annotations

import csv
import json
import logging
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gluejobs import Client
from shared.core.config import Settings
from shared.jobspec.data_scope import OWNERS_DIR, owner_folder
from tests.support.e2e import live_api
from tests.support.kit import ALICE, BOB, TINY_MODEL, auth

# Exponential backtracking on a run of `a`s that does not end the string: 0.06 s for 22 of them, and
# past a few more Oniguruma's retry limit ends the search with a Rust panic.
CATASTROPHIC = "^(a+)+$"
SLOW_ROW = "a" * 22 + "!"
PANIC_ROW = "a" * 40 + "!"
SPEC = {"task_name": "sst2", "eval_strategy": "no", "save_strategy": "no", "seed": 1}
# The deadline is far beyond the CPU limit, so that a loaded machine (a child given a quarter of a core)
# still ends by the CPU limit the test names.
CPU_S, DEADLINE_S = 4, 60


def hostile_folder(tiny: Path, into: Path) -> Path:
    """The tiny BERT with MiniLM's tokenizer, its pre-tokenizer replaced by a catastrophic Split."""
    folder = into / "hostile-bert"
    shutil.copytree(tiny, folder)
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    tokenizer["pre_tokenizer"] = {
        "type": "Split",
        "pattern": {"Regex": CATASTROPHIC},
        "behavior": "Isolated",
        "invert": False,
    }
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    return folder


def write_rows(settings: Settings, owner: str, name: str, rows: list[str]) -> None:
    folder = settings.data_dir / OWNERS_DIR / owner_folder(owner)
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / name).open("w", newline="") as out:
        csv.writer(out).writerows([("sentence", "label"), *((row, i % 2) for i, row in enumerate(rows))])


@pytest.fixture
def keyed(settings_factory: Any, db_url: str, request: pytest.FixtureRequest) -> Settings:
    limits = getattr(request, "param", {})
    settings: Settings = settings_factory(
        db_url,
        api_keys=[f"alice={ALICE}", f"bob={BOB}"],
        max_model_bytes=8 * 1024 * 1024,
        dry_run_tokenizer_cpu_s=limits.get("cpu_s", CPU_S),
        dry_run_tokenizer_deadline_s=limits.get("deadline_s", DEADLINE_S),
    )
    write_rows(settings, "alice", "attack.csv", [SLOW_ROW] * 1200)
    write_rows(settings, "alice", "panic.csv", [PANIC_ROW] * 4)
    write_rows(settings, "bob", "good.csv", ["a fine film", "a dull film"] * 20)
    return settings


@pytest.fixture
def url(keyed: Settings) -> Iterator[str]:
    with live_api(keyed) as http:
        yield str(http.base_url).rstrip("/")


@pytest.fixture
def hostile(url: str, models_dir: Path, tmp_path: Path) -> str:
    """Alice's registered hostile model, as a spec names it."""
    with Client(url, api_key=ALICE) as alice:
        alice.models.upload(hostile_folder(models_dir / TINY_MODEL, tmp_path / "upload"), name="hostile")
    return "model:hostile"


def dry_run(http: httpx.Client, key: str, spec: dict[str, Any]) -> httpx.Response:
    return http.post("/v1/jobs", params={"dry_run": "true"}, json={"spec": spec}, headers=auth(key))


def test_a_catastrophic_regex_costs_its_dry_run_a_422_and_no_one_else_anything(
    url: str, hostile: str
) -> None:
    attack: list[tuple[httpx.Response, float]] = []

    def attacker() -> None:
        with httpx.Client(base_url=url, timeout=120) as http:
            started = time.monotonic()
            response = dry_run(
                http, ALICE, {**SPEC, "model_name_or_path": hostile, "train_file": "attack.csv"}
            )
            attack.append((response, time.monotonic() - started))

    thread = threading.Thread(target=attacker)
    health: list[tuple[int, float]] = []
    with httpx.Client(base_url=url, timeout=30) as other:
        thread.start()
        time.sleep(0.5)  # the attack's child is tokenising by now (a child starts in ~0.2 s)
        # The attacker's second dry run does not take the other slot (one owner holds half of them)…
        second = dry_run(other, ALICE, {**SPEC, "model_name_or_path": hostile, "train_file": "attack.csv"})
        # …so another owner's dry run is planned meanwhile, in the other slot, by a normal tokenizer.
        bobs = dry_run(other, BOB, {**SPEC, "model_name_or_path": TINY_MODEL, "train_file": "good.csv"})
        bob_done_during_attack = thread.is_alive()
        while thread.is_alive():  # and another client's health checks go on being answered
            started = time.monotonic()
            health.append((other.get("/healthz").status_code, time.monotonic() - started))
            time.sleep(0.05)
        thread.join()

    assert second.status_code == 429, second.text
    assert "the most one owner may have of the API's 2" in second.json()["error"]["message"]
    assert bobs.status_code == 200, bobs.text
    assert bobs.json()["tokens"]["status"] == "measured" and bob_done_during_attack
    assert health and {code for code, _ in health} == {200}
    response, seconds = attack[0]
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["field"] == "spec.model_name_or_path"
    assert f"'model:hostile''s tokenizer took more than {CPU_S} s of CPU" in error["message"]
    assert "GLUEJOBS_DRY_RUN_TOKENIZER_CPU_S" in error["message"]
    assert seconds < DEADLINE_S, seconds  # ended by the CPU limit, long before the rows' ~70 s of CPU


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("keyed", [{"cpu_s": 600, "deadline_s": 3}], indirect=True)
def test_a_tokenizer_past_its_deadline_is_ended(url: str, hostile: str) -> None:
    """The wall clock bounds a child that the CPU limit would let run on (a slow start, a starved CPU)."""
    with httpx.Client(base_url=url, timeout=60) as http:
        started = time.monotonic()
        response = dry_run(http, ALICE, {**SPEC, "model_name_or_path": hostile, "train_file": "attack.csv"})
        seconds = time.monotonic() - started
    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    assert "tokenizer took more than 3 s (GLUEJOBS_DRY_RUN_TOKENIZER_DEADLINE_S raises it)" in message
    assert 3 <= seconds < 10, seconds


def test_a_panicking_tokenizer_answers_a_clean_422(
    url: str, hostile: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING), httpx.Client(base_url=url, timeout=60) as http:
        response = dry_run(http, ALICE, {**SPEC, "model_name_or_path": hostile, "train_file": "panic.csv"})
        again = dry_run(http, ALICE, {**SPEC, "model_name_or_path": TINY_MODEL, "train_file": "panic.csv"})
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["field"] == "spec.model_name_or_path"
    assert "'model:hostile''s tokenizer failed on these rows (PanicException: " in error["message"]
    assert "retry-limit-in-match" in error["message"]
    # One line in the log for it, no backtrace; the API goes on planning with normal tokenizers.
    records = [r for r in caplog.records if "tokenizer" in r.getMessage()]
    assert len(records) == 1 and "\n" not in records[0].getMessage(), [r.getMessage() for r in records]
    assert records[0].exc_info is None
    assert again.status_code == 200 and again.json()["tokens"]["status"] == "measured", again.text


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_normal_tokenizer_measures_what_the_workers_does(
    url: str, keyed: Settings, minilm_path: Path
) -> None:
    """The child's lengths are the worker's fast tokenizer's (transformers over the same tokenizer.json)."""
    from transformers import AutoTokenizer

    rows = [
        "a fine film",
        "the plot is thin , but the acting carries it through two hours of rain",
        "unbelievably overlong and underwritten ; a waste of everyone 's considerable talents",
        "ok",
    ] * 10
    write_rows(keyed, "bob", "varied.csv", rows)
    spec = {**SPEC, "model_name_or_path": TINY_MODEL, "train_file": "varied.csv", "max_length": 12}
    with httpx.Client(base_url=url, timeout=60) as http:
        response = dry_run(http, BOB, spec)
    assert response.status_code == 200, response.text
    measured = response.json()["tokens"]["train"]

    lengths = [len(ids) for ids in AutoTokenizer.from_pretrained(minilm_path)(rows)["input_ids"]]
    truncated = [min(n, 12) for n in lengths]
    assert measured["rows_measured"] == len(rows)
    assert measured["longest_before_truncation"] == max(lengths)
    assert measured["longest"] == 12
    assert measured["truncated_rows"] == sum(n > 12 for n in lengths) > 0
    assert measured["mean"] == round(sum(truncated) / len(truncated), 2)
    assert measured["padding"]["real_tokens"] == sum(truncated)
