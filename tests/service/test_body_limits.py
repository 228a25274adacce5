"""Bodies are capped by the bytes received, and a request without a key is refused before its body is
read: real chunked uploads (http.client, no Content-Length) against `python -m service` in its own
process, whose peak memory (VmHWM) must not grow by anything like the body's size.
"""

from __future__ import annotations

import http.client
import json
import select
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.core.db import Database
from shared.core.tables import Job
from tests.support.dbutil import count_rows
from tests.support.e2e import api_process
from tests.support.kit import ALICE, ROOT, SPEC

pytestmark = pytest.mark.e2e

MIB = 1024 * 1024
AS_ALICE = {"Authorization": f"Bearer {ALICE}"}
AS_ROOT = {"Authorization": f"Bearer {ROOT}"}
CAP_BYTES = MIB  # GLUEJOBS_MAX_REQUEST_BYTES's default
# A peak that grew by less than this held no body: each upload below is 20 MiB or more.
MEMORY_SLACK_BYTES = 8 * MIB
CHUNK = b"x" * (64 * 1024)


@dataclass
class Upload:
    status: int
    headers: dict[str, str]
    body: dict[str, Any]
    sent_bytes: int


def chunked_post(base_url: str, path: str, total_bytes: int, headers: dict[str, str]) -> Upload:
    """POST a JSON body of `total_bytes` with Transfer-Encoding: chunked, stopping as soon as the server
    answers (or closes the connection): how a client sees that the server stopped reading."""
    host, port = httpx.URL(base_url).host, httpx.URL(base_url).port
    connection = http.client.HTTPConnection(host, port, timeout=60)
    connection.putrequest("POST", path)
    for name, value in {
        **headers,
        "Content-Type": "application/json",
        "Transfer-Encoding": "chunked",
    }.items():
        connection.putheader(name, value)
    connection.endheaders()
    assert connection.sock is not None
    body = json.dumps({"spec": SPEC, "metadata": {"pad": ""}}).encode()
    prefix, suffix = body[:-3], body[-3:]  # ... "pad": "  and  "}}
    sent = 0
    try:
        while sent < total_bytes:
            answered, _, _ = select.select([connection.sock], [], [], 0)
            if answered:
                break
            piece = prefix if sent == 0 else CHUNK
            connection.send(_chunk(piece))
            sent += len(piece)
        else:
            connection.send(_chunk(suffix) + _chunk(b""))  # an empty chunk ends the body
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server closed the connection: it is not reading any more
    response = connection.getresponse()
    text = response.read()
    try:
        body = json.loads(text)
    except ValueError:
        body = {"not json": text[:200]}
    result = Upload(response.status, {k.lower(): v for k, v in response.getheaders()}, body, sent)
    connection.close()
    return result


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def peak_rss_bytes(pid: int) -> int:
    """The process's peak resident memory so far (VmHWM), from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc")


@pytest.fixture
def api(settings_factory, db_url: str) -> Iterator[tuple[httpx.Client, int]]:  # type: ignore[no-untyped-def]
    settings = settings_factory(db_url, api_keys=[ALICE], admin_keys=[ROOT])
    assert settings.max_request_bytes == CAP_BYTES
    with api_process(settings) as (client, process):
        # Warm up: every code path a refused upload touches has run once before the baseline.
        for _ in range(3):
            assert client.post("/v1/jobs", json={"spec": SPEC}, headers=AS_ALICE).status_code == 201
            assert client.get("/v1/jobs", headers=AS_ROOT).status_code == 200
        yield client, process.pid


def assert_lists_still_work(client: httpx.Client, db: Database, jobs: int) -> None:
    assert count_rows(db, Job) == jobs
    for headers in (AS_ALICE, AS_ROOT):
        listed = client.get("/v1/jobs", headers=headers)
        assert listed.status_code == 200 and len(listed.json()["data"]) == jobs


def declared_post(client: httpx.Client, length: int, headers: dict[str, str]) -> tuple[int, str]:
    """Send only the headers of a POST that declares a `length`-byte body; the status and error code."""
    connection = http.client.HTTPConnection(client.base_url.host, client.base_url.port, timeout=30)
    connection.putrequest("POST", "/v1/jobs")
    for name, value in {**headers, "Content-Type": "application/json", "Content-Length": str(length)}.items():
        connection.putheader(name, value)
    connection.endheaders()
    response = connection.getresponse()
    answer = (response.status, json.loads(response.read())["error"]["code"])
    connection.close()
    return answer


# Refused before the route runs: the database never sees these bodies, so one database is enough.
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_chunked_body_over_the_cap_is_refused_while_it_is_read(
    api: tuple[httpx.Client, int], db: Database
) -> None:
    client, pid = api
    baseline = peak_rss_bytes(pid)

    upload = chunked_post(str(client.base_url), "/v1/jobs", 20 * MIB, AS_ALICE)

    assert upload.status == 413, (upload.status, upload.body, upload.sent_bytes)
    assert upload.body["error"]["code"] == "request_too_large"
    assert str(CAP_BYTES) in upload.body["error"]["message"]
    assert upload.sent_bytes < 20 * MIB  # the server stopped reading and closed the connection
    assert peak_rss_bytes(pid) - baseline < MEMORY_SLACK_BYTES, (baseline, peak_rss_bytes(pid))
    assert_lists_still_work(client, db, 3)

    # A declared Content-Length over the cap is refused before a byte of the body is sent.
    assert declared_post(client, 50 * MIB, AS_ALICE) == (413, "request_too_large")
    assert_lists_still_work(client, db, 3)


# Refused before the route runs: the database never sees these bodies, so one database is enough.
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_anonymous_upload_is_refused_before_its_body_is_read(
    api: tuple[httpx.Client, int], db: Database
) -> None:
    client, pid = api
    baseline = peak_rss_bytes(pid)

    for headers in (
        {},
        {"Authorization": "Bearer not-a-key"},
        {"Authorization": f"Bearer sha256:{'0' * 64}"},
    ):
        upload = chunked_post(str(client.base_url), "/v1/jobs", 100 * MIB, headers)
        assert upload.status == 401, (upload.status, upload.body, upload.sent_bytes)
        assert upload.body["error"]["code"] == "unauthorized"
        assert upload.headers["connection"] == "close"
        assert upload.sent_bytes < 100 * MIB
    # Declared too large and without a key: the key is checked first, still before any body.
    assert declared_post(client, 100 * MIB, {}) == (401, "unauthorized")

    assert peak_rss_bytes(pid) - baseline < MEMORY_SLACK_BYTES, (baseline, peak_rss_bytes(pid))
    assert_lists_still_work(client, db, 3)


# Refused before the route runs: the database never sees these bodies, so one database is enough.
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_refused_small_body_is_read_and_its_connection_kept(
    api: tuple[httpx.Client, int], db: Database
) -> None:
    """Closing a socket with the client's body still arriving resets the connection, and the client
    can lose the answer with it; so a small refused body is read first and the connection stays open."""
    client, _ = api
    connection = http.client.HTTPConnection(client.base_url.host, client.base_url.port, timeout=30)
    body = json.dumps({"spec": SPEC}).encode()
    connection.putrequest("POST", "/v1/jobs")
    for name, value in {"Content-Type": "application/json", "Content-Length": str(len(body))}.items():
        connection.putheader(name, value)
    connection.endheaders()
    time.sleep(0.3)  # the body arrives after the server has seen there is no key
    connection.send(body)
    refused = connection.getresponse()
    assert refused.status == 401 and json.loads(refused.read())["error"]["code"] == "unauthorized"
    assert refused.getheader("connection") != "close"
    connection.request("GET", "/v1/jobs", headers=AS_ALICE)  # the same connection, the next request
    listed = connection.getresponse()
    assert listed.status == 200 and len(json.loads(listed.read())["data"]) == 3
    connection.close()
