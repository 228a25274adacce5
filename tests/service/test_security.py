"""Issue 5's holes, each probed through real HTTP on SQLite and Postgres.

Every refused request is checked three ways: the status (and the field it names), that nothing was
stored, and that the owner's and the admins' job lists still answer afterwards (a stored bad string
used to break every later list).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from shared.core.config import Settings
from shared.core.db import Database
from shared.core.tables import Job
from tests.support.dbutil import count_rows
from tests.support.e2e import live_api
from tests.support.kit import ALICE, BOB, ROOT, SPEC, auth

OPS = "ops-key-0123456789abcdef"  # an admin key configured as its digest
MAX_ID = 2**63 - 1


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture
def api(settings_factory, db_url: str) -> Iterator[httpx.Client]:  # type: ignore[no-untyped-def]
    keyed: Settings = settings_factory(
        db_url, api_keys=[ALICE, BOB], admin_keys=[ROOT, f"sha256:{digest(OPS)}"]
    )
    with live_api(keyed) as client:
        yield client


@pytest.fixture
def alice_job(api: httpx.Client) -> int:
    response = api.post("/v1/jobs", json={"spec": SPEC}, headers=auth(ALICE))
    assert response.status_code == 201, response.text
    job_id: int = response.json()["id"]
    return job_id


def post_json_text(api: httpx.Client, text: str, key: str = ALICE) -> httpx.Response:
    """POST /v1/jobs with JSON written by hand: escapes such as \\ud800 that json.dumps would not write."""
    return api.post(
        "/v1/jobs", content=text.encode(), headers={**auth(key), "content-type": "application/json"}
    )


def body_text(spec: dict[str, Any] | None = None, **fields: Any) -> str:
    return json.dumps({"spec": {**SPEC, **(spec or {})}, **fields})


def assert_refused(response: httpx.Response, status: int, field: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert set(error) <= {"code", "message", "field", "errors", "errors_omitted"} and error["message"]
    if field is not None:
        assert error.get("field") == field, error
    return error


def assert_untouched(api: httpx.Client, db: Database, job_ids: list[int]) -> None:
    """Nothing was stored, and the owner and both admins can still list their jobs."""
    assert count_rows(db, Job) == len(job_ids)
    for key, expected in ((ALICE, job_ids), (ROOT, job_ids), (OPS, job_ids), (BOB, [])):
        listed = api.get("/v1/jobs", headers=auth(key))
        assert listed.status_code == 200, listed.text
        assert sorted(job["id"] for job in listed.json()["data"]) == sorted(expected)


# ---------------------------------------------------------------------------------------------------
# 1. A key's digest is not a key
# ---------------------------------------------------------------------------------------------------


def test_a_keys_digest_is_not_a_key(api: httpx.Client, db: Database, alice_job: int) -> None:
    owner = api.get(f"/v1/jobs/{alice_job}", headers=auth(ALICE))
    assert owner.status_code == 200
    stolen = [
        f"sha256:{digest(ALICE)}",  # a user key's digest, as the configuration may hold it
        f"sha256:{digest(ROOT)}",  # an admin key's digest
        f"sha256:{digest(OPS)}",  # exactly what the configuration holds for the OPS admin key
        f"SHA256:{digest(OPS).upper()}",
        digest(ALICE),  # the jobs table's owner column
    ]
    for credential in stolen:
        for response in (
            api.get("/v1/jobs", headers=auth(credential)),
            api.get(f"/v1/jobs/{alice_job}", headers=auth(credential)),
            api.post(f"/v1/jobs/{alice_job}/cancel", headers=auth(credential)),
            api.post("/v1/jobs", json={"spec": SPEC}, headers=auth(credential)),
        ):
            assert assert_refused(response, 401)["code"] == "unauthorized"
            assert response.headers["www-authenticate"] == "Bearer"
    # The key behind the configured digest is an admin key; the job was never cancelled.
    assert api.get(f"/v1/jobs/{alice_job}", headers=auth(OPS)).json()["status"] == "queued"
    assert_untouched(api, db, [alice_job])


def test_configured_keys_are_checked_when_the_settings_load(tmp_path: Any) -> None:
    from pydantic import ValidationError

    secret = "a secret key with spaces"
    for keys, message in (
        ("sha256:abc", "GLUEJOBS_API_KEYS entry 1: it starts with sha256: but is not followed by exactly 64"),
        (f"good-key-0123456789,sha256:{'g' * 64}", "GLUEJOBS_API_KEYS entry 2"),
        (secret, "GLUEJOBS_API_KEYS entry 1: a key is printable ASCII without spaces or commas"),
    ):
        with pytest.raises(ValidationError) as refused:
            Settings(database_url=f"sqlite:///{tmp_path}/x.db", api_keys=keys)  # type: ignore[arg-type]
        assert message in str(refused.value)
        assert secret not in str(refused.value)  # a key is never quoted back
    upper = Settings(database_url=f"sqlite:///{tmp_path}/x.db", admin_keys=f"sha256:{digest(OPS).upper()}")  # type: ignore[arg-type]
    assert upper.admin_keys == [f"sha256:{digest(OPS).upper()}"]


# ---------------------------------------------------------------------------------------------------
# 2. Length limits (the body caps themselves are in test_body_limits.py)
# ---------------------------------------------------------------------------------------------------

LONG_STRINGS = [
    (
        {"task_name": None, "train_file": "t" * 1100 + ".csv", "validation_file": "d.csv"},
        {},
        "spec.train_file",
    ),
    ({"validation_file": "v" * 300 + ".csv"}, {}, "spec.validation_file"),  # a component over 255 bytes
    ({"test_file": "sub/" + "é" * 200 + ".tsv"}, {}, "spec.test_file"),  # 400 bytes in UTF-8
    ({"report_to": "r" * 300}, {}, "spec.report_to"),
    ({"apply_lora": True, "lora_target_modules": ["q" * 300]}, {}, "spec.lora_target_modules.0"),
    ({"apply_lora": True, "lora_target_modules": ["query"] * 300}, {}, "spec.lora_target_modules"),
    ({"metric_for_best_model": "m" * 300}, {}, "spec.metric_for_best_model"),
    ({"model_name_or_path": "o" * 600}, {}, "spec.model_name_or_path"),
    ({}, {"metadata": {"note": "n" * 600}}, "metadata.note"),
    ({}, {"metadata": {f"k{i}": "v" for i in range(40)}}, "metadata"),
]


def test_long_strings_are_refused_naming_the_field(
    api: httpx.Client, db: Database, alice_job: int, subtests: Any
) -> None:
    for spec, fields, field in LONG_STRINGS:
        with subtests.test(field=field):
            assert_refused(post_json_text(api, body_text(spec, **fields)), 422, field)
    long_key = post_json_text(api, body_text(metadata={"k" * 100: "v"}))
    assert assert_refused(long_key, 422)["field"].startswith("metadata.kkkkkkkk")
    assert len(long_key.json()["error"]["field"]) < 60  # the key is named by a short prefix
    assert_untouched(api, db, [alice_job])


def test_error_messages_quote_a_short_prefix_of_a_bad_value(
    api: httpx.Client, db: Database, alice_job: int
) -> None:
    huge = "x" * 100_000
    for response, field in (
        (post_json_text(api, body_text({"task_name": huge})), "spec.task_name"),
        (
            post_json_text(
                api, body_text({"task_name": None, "train_file": huge, "validation_file": "d.csv"})
            ),
            "spec.train_file",
        ),
        (post_json_text(api, body_text({"metric_for_best_model": huge[:200]})), "spec.metric_for_best_model"),
        (api.get("/v1/jobs", params={"status": huge[:5000]}, headers=auth(ALICE)), "status"),
        (post_json_text(api, body_text({"checkpointing_steps": huge})), "spec.checkpointing_steps"),
    ):
        error = assert_refused(response, 422, field)
        assert len(response.content) < 600, error
    assert_untouched(api, db, [alice_job])


# ---------------------------------------------------------------------------------------------------
# 3. Odd strings
# ---------------------------------------------------------------------------------------------------

# Written as JSON text: the escapes are what a client sends.
ODD_BODIES = [
    (body_text(metadata={"team": "__SURROGATE__"}), "metadata.team", "lone UTF-16 surrogate"),
    (body_text(metadata={"__SURROGATE__": "x"}), "metadata", "key that contains a lone UTF-16 surrogate"),
    (body_text({"report_to": "tensor__SURROGATE__board"}), "spec.report_to", "lone UTF-16 surrogate"),
    (body_text({"model_name_or_path": "org/__SURROGATE__"}), "spec.model_name_or_path", "surrogate"),
    (
        body_text({"apply_lora": True, "lora_target_modules": ["q", "__LOW__"]}),
        "spec.lora_target_modules.1",
        "surrogate",
    ),
    (body_text(metadata={"team": "a__NUL__b"}), "metadata.team", "NUL character"),
    (body_text({"task_name": "sst2__NUL__"}), "spec.task_name", "NUL character"),
    (
        body_text({"task_name": None, "train_file": "a__NUL__.csv", "validation_file": "d.csv"}),
        "spec.train_file",
        "NUL",
    ),
    (body_text(metadata={"a__NUL__": "x"}), "metadata", "key that contains a NUL character"),
    (body_text({"not_a_field__NUL__": 1}), "spec", "key that contains a NUL character"),
]


def _odd(text: str) -> str:
    return (
        text.replace("__SURROGATE__", "\\ud800").replace("__LOW__", "\\udfff").replace("__NUL__", "\\u0000")
    )


def test_odd_strings_are_refused_and_never_stored(
    api: httpx.Client, db: Database, alice_job: int, subtests: Any
) -> None:
    for text, field, message in ODD_BODIES:
        with subtests.test(field=field, body=text[:80]):
            error = assert_refused(post_json_text(api, _odd(text)), 422, field)
            assert message in error["message"]
            assert_untouched(api, db, [alice_job])
    for path, params, field in (
        (f"/v1/jobs/{alice_job}/metrics", {"name": "loss\x00"}, "name"),
        (f"/v1/jobs/{alice_job}/metrics", {"split": "\x00"}, "split"),
        ("/v1/jobs", {"status": "queued\x00"}, "status"),
    ):
        assert_refused(api.get(path, params=params, headers=auth(ALICE)), 422, field)
    # A surrogate pair is one character (an emoji), not an odd string: stored and listed as sent.
    emoji = post_json_text(
        api, body_text(metadata={"mood": "__EMOJI__"}).replace("__EMOJI__", "\\ud83d\\ude00")
    )
    assert emoji.status_code == 201, emoji.text
    assert emoji.json()["metadata"] == {"mood": "😀"}
    assert_untouched(api, db, [alice_job, emoji.json()["id"]])


# ---------------------------------------------------------------------------------------------------
# 4. Numbers
# ---------------------------------------------------------------------------------------------------

BAD_NUMBERS = [
    ('"lora_alpha": 1e309', "spec.lora_alpha"),
    ('"learning_rate": NaN', "spec.learning_rate"),
    ('"weight_decay": -Infinity', "spec.weight_decay"),
    ('"warmup_ratio": Infinity', "spec.warmup_ratio"),
    ('"cls_dropout": 1e400', "spec.cls_dropout"),
    ('"per_device_train_batch_size": 1000000', "spec.per_device_train_batch_size"),
    ('"per_device_eval_batch_size": 99999999999999999999', "spec.per_device_eval_batch_size"),
    ('"gradient_accumulation_steps": 1000000', "spec.gradient_accumulation_steps"),
    ('"max_train_steps": 1000000000000', "spec.max_train_steps"),
    ('"num_warmup_steps": 10000000000', "spec.num_warmup_steps"),
    ('"max_train_samples": 10000000000', "spec.max_train_samples"),
    ('"max_eval_samples": 10000000000', "spec.max_eval_samples"),
    ('"eval_strategy": "steps", "eval_steps": 10000000000', "spec.eval_steps"),
    ('"save_strategy": "steps", "save_steps": 10000000000', "spec.save_steps"),
    ('"save_total_limit": 1000000', "spec.save_total_limit"),
    ('"logging_steps": 10000000000', "spec.logging_steps"),
    ('"checkpointing_steps": "99999999999"', "spec.checkpointing_steps"),
    ('"seed": 18446744073709551616', "spec.seed"),
]


def test_numbers_out_of_range_are_refused(
    api: httpx.Client, db: Database, alice_job: int, subtests: Any
) -> None:
    spec = json.dumps(SPEC)[:-1]
    for fragment, field in BAD_NUMBERS:
        with subtests.test(field=field):
            assert_refused(post_json_text(api, f'{{"spec": {spec}, {fragment}}}}}'), 422, field)
    assert_refused(post_json_text(api, f'{{"spec": {json.dumps(SPEC)}, "priority": 1e309}}'), 422, "priority")
    assert_untouched(api, db, [alice_job])


def test_ids_and_cursors_beyond_64_bits_are_refused(api: httpx.Client, db: Database, alice_job: int) -> None:
    huge, cursor = str(MAX_ID + 1), "99999999999999999999"
    for method, path in (
        ("GET", f"/v1/jobs/{huge}"),
        ("POST", f"/v1/jobs/{huge}/cancel"),
        ("GET", f"/v1/jobs/{huge}/metrics"),
        ("GET", f"/v1/jobs/{huge}/events"),
        ("GET", f"/v1/jobs/{huge}/checkpoints"),
        ("GET", f"/v1/jobs/-{huge}"),
    ):
        assert_refused(api.request(method, path, headers=auth(ROOT)), 422, "job_id")
    for path in ("/v1/jobs", f"/v1/jobs/{alice_job}/metrics", f"/v1/jobs/{alice_job}/events"):
        assert_refused(api.get(path, params={"after": cursor}, headers=auth(ALICE)), 422, "after")
        assert_refused(api.get(path, params={"after": "-1"}, headers=auth(ALICE)), 422, "after")
        # The largest id both databases hold is a valid cursor: an empty page (newer ids for the list).
        edge = api.get(path, params={"after": str(MAX_ID)}, headers=auth(ALICE))
        assert edge.status_code == 200, edge.text
    assert api.get(f"/v1/jobs/{MAX_ID}", headers=auth(ROOT)).status_code == 404
    assert_untouched(api, db, [alice_job])


# ---------------------------------------------------------------------------------------------------
# 5. Model names
# ---------------------------------------------------------------------------------------------------

BAD_MODEL_NAMES = [
    ("m" * 256, "longer than 255 bytes"),
    ("org/" + "n" * 300, "longer than 255 bytes"),
    ("é" * 128, "longer than 255 bytes"),  # 256 bytes in UTF-8
    ("/".join(["deep"] * 120), "at most 512 characters"),
    ("org//name", "empty component"),
    (".", "'.' or '..' component"),
    ("..", "'.' or '..' component"),
    ("org/..", "'.' or '..' component"),
    ("./tiny-bert", "'.' or '..' component"),
    ("org/./name", "'.' or '..' component"),
    ("org/name/", "ends with '/'"),
    ("/", "ends with '/'"),
    (" tiny-bert", "starts or ends with a space"),
    ("org/na\tme", "control character"),
    ("/opt/models/bert", "absolute and outside"),
]


def test_bad_model_names_are_refused(
    api: httpx.Client, db: Database, alice_job: int, models_dir: Any, subtests: Any
) -> None:
    for name, message in BAD_MODEL_NAMES:
        with subtests.test(name=name[:40]):
            error = assert_refused(post_json_text(api, body_text({"model_name_or_path": name})), 422)
            assert error["field"] == "spec.model_name_or_path"
            assert message in error["message"]
    assert_untouched(api, db, [alice_job])
    # Names that are fine: a Hub id stays one; a local folder, however named, is stored relative.
    stored = []
    for name, expected in (
        ("org/model.v2", "org/model.v2"),
        ("tiny-bert", "tiny-bert"),
        (f"{models_dir}/tiny-bert", "tiny-bert"),
    ):
        response = api.post(
            "/v1/jobs", json={"spec": {**SPEC, "model_name_or_path": name}}, headers=auth(ALICE)
        )
        assert response.status_code == 201, response.text
        assert response.json()["spec"]["model_name_or_path"] == expected
        stored.append(response.json()["id"])
    assert_untouched(api, db, [alice_job, *stored])


# ---------------------------------------------------------------------------------------------------
# 6. HTTP hygiene
# ---------------------------------------------------------------------------------------------------


def test_wrong_methods_and_bodies_get_the_right_status(
    api: httpx.Client, db: Database, alice_job: int
) -> None:
    for method, path, allow in (
        ("DELETE", "/v1/jobs", "GET, POST"),
        ("PUT", f"/v1/jobs/{alice_job}", "GET"),
        ("GET", f"/v1/jobs/{alice_job}/cancel", "POST"),
        ("POST", "/healthz", "GET"),
    ):
        response = api.request(method, path, headers=auth(ALICE))
        assert assert_refused(response, 405)["code"] == "method_not_allowed"
        assert response.headers["allow"] == allow
    good = json.dumps({"spec": SPEC}).encode()
    for headers in (
        {"content-type": "text/plain"},
        {"content-type": "application/x-www-form-urlencoded"},
        {},
    ):
        response = api.post("/v1/jobs", content=good, headers={**auth(ALICE), **headers})
        assert assert_refused(response, 415)["code"] == "unsupported_media_type"
    malformed = api.post(
        "/v1/jobs", content=b'{"spec": {', headers={**auth(ALICE), "content-type": "application/json"}
    )
    assert assert_refused(malformed, 400)["code"] == "invalid_json"
    bad_utf8 = api.post(
        "/v1/jobs", content=b'{"spec": "\xff"}', headers={**auth(ALICE), "content-type": "application/json"}
    )
    assert_refused(bad_utf8, 400)
    assert_untouched(api, db, [alice_job])


def test_openapi_documents_every_status_the_api_answers(api: httpx.Client) -> None:
    schema = api.get("/openapi.json").json()
    operations = {
        f"{method.upper()} {path}": operation
        for path, item in schema["paths"].items()
        for method, operation in item.items()
    }
    for label, operation in operations.items():
        documented = set(operation["responses"])
        expected = {"400", "413", "422"}
        if label.split()[1].startswith("/v1/"):
            expected.add("401")
        if "{" in label:
            expected.add("404")
        if "requestBody" in operation:
            expected.add("415")
        assert expected <= documented, (label, sorted(documented))
        for status in expected:
            content = operation["responses"][status]["content"]["application/json"]["schema"]
            assert content == {"$ref": "#/components/schemas/ErrorResponse"}, (label, status)
    assert "409" in operations["POST /v1/jobs/{job_id}/cancel"]["responses"]
    status = next(p for p in operations["GET /v1/jobs"]["parameters"] if p["name"] == "status")
    array = next(s for s in status["schema"]["anyOf"] if s.get("type") == "array")
    assert array["items"]["enum"] == ["queued", "running", "cancelling", "succeeded", "failed", "cancelled"]
    after = next(p for p in operations["GET /v1/jobs"]["parameters"] if p["name"] == "after")
    assert any(s.get("maximum") == MAX_ID for s in after["schema"]["anyOf"])
    job_id = next(p for p in operations["GET /v1/jobs/{job_id}"]["parameters"] if p["name"] == "job_id")
    assert job_id["schema"]["maximum"] == MAX_ID
