"""A web page cannot drive the API on the user's machine: requests naming a foreign Host (DNS
rebinding) get 400 and state-changing requests from a foreign Origin get 403, against
`python -m service` without keys (the `make demo` set-up), as its own process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.e2e import api_process, free_port
from tests.support.kit import SPEC

pytestmark = pytest.mark.e2e


def job_status(client: httpx.Client, job_id: int) -> str:
    status: str = client.get(f"/v1/jobs/{job_id}").json()["status"]
    return status


def test_a_foreign_origin_cannot_change_anything(settings_factory: Any, sqlite_url: str) -> None:
    with api_process(settings_factory(sqlite_url)) as (client, _):
        own = str(client.base_url).rstrip("/")
        job = client.post("/v1/jobs", json={"spec": SPEC}).json()
        cancel = f"/v1/jobs/{job['id']}/cancel"
        for origin in ("https://evil.example", "null", f"{own.replace('127.0.0.1', 'localhost')}", "garbage"):
            refused = client.post(cancel, headers={"Origin": origin})
            assert refused.status_code == 403, (origin, refused.text)
            assert refused.json()["error"]["code"] == "forbidden_origin"
        submitted = client.post("/v1/jobs", json={"spec": SPEC}, headers={"Origin": "https://evil.example"})
        assert submitted.status_code == 403
        # A form post with no Origin but the browser's cross-site marker.
        cross = client.post(cancel, headers={"Sec-Fetch-Site": "cross-site"})
        assert cross.status_code == 403
        assert job_status(client, job["id"]) == "queued"
        assert len(client.get("/v1/jobs").json()["data"]) == 1
        # Reading is not refused (the browser keeps a foreign page from seeing the answer: no CORS).
        assert client.get("/v1/jobs", headers={"Origin": "https://evil.example"}).status_code == 200
        # The API's own origin (the dashboard) and clients that are not browsers (no Origin) may.
        assert client.post(cancel, headers={"Origin": own}).status_code == 200
        second = client.post("/v1/jobs", json={"spec": SPEC})
        assert second.status_code == 201
        assert client.post(f"/v1/jobs/{second.json()['id']}/cancel").status_code == 200


def test_a_foreign_host_is_refused(settings_factory: Any, sqlite_url: str) -> None:
    settings = settings_factory(sqlite_url, allowed_hosts=["gluejobs.internal", "*.corp.example"])
    with api_process(settings) as (client, _):
        port = client.base_url.port
        for host in (
            "evil.example",
            f"evil.example:{port}",
            "127.0.0.1.evil.example",
            "corp.example",
            "10.1.2.3",
        ):
            for method, path in (("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", "/")):
                refused = client.request(method, path, headers={"Host": host}, json={"spec": SPEC})
                assert refused.status_code == 400, (host, path, refused.text)
                assert refused.json()["error"]["code"] == "invalid_host"
        for host in (
            f"127.0.0.1:{port}",
            f"localhost:{port}",
            "LOCALHOST",
            "gluejobs.internal",
            "api.corp.example:9",
        ):
            assert client.get("/v1/jobs", headers={"Host": host}).status_code == 200, host
        assert client.get("/v1/jobs").json()["data"] == []  # nothing was submitted


def test_bound_to_every_address_any_address_is_a_host(  # type: ignore[no-untyped-def]
    settings_factory, sqlite_url: str, tmp_path: Path
) -> None:
    settings = settings_factory(sqlite_url)
    with api_process(settings, "--host", "0.0.0.0", "--insecure-no-auth") as (client, _):
        assert client.get("/v1/jobs", headers={"Host": f"192.0.2.7:{free_port()}"}).status_code == 200
        assert client.get("/v1/jobs", headers={"Host": "[2001:db8::1]"}).status_code == 200
        assert client.get("/v1/jobs", headers={"Host": "localhost"}).status_code == 200
        assert client.get("/v1/jobs", headers={"Host": "evil.example"}).status_code == 400
