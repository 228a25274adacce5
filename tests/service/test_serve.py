"""`gluejobs serve` without keys: loopback by default, and another address only when asked for
explicitly (`--insecure-no-auth`), with a warning. Real processes, real sockets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from service.server import is_loopback
from shared.core.config import Settings
from tests.support.e2e import REPO, api_process, free_port
from worker.fleet.runner import child_environment

KEY = "serve-test-key-0123456789"


def test_serve_refuses_another_address_without_keys(settings_factory, sqlite_url: str) -> None:  # type: ignore[no-untyped-def]
    settings: Settings = settings_factory(sqlite_url)
    for host in ("0.0.0.0", "::"):
        result = subprocess.run(
            [sys.executable, "-m", "service", "--host", host, "--port", str(free_port())],
            cwd=REPO,
            env=child_environment(settings),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 2, result.stderr
        assert f"refusing to serve on {host} without API keys" in result.stderr
        assert "--insecure-no-auth" in result.stderr


def test_only_loopback_addresses_count_as_private() -> None:
    private = ["127.0.0.1", "127.8.9.10", "localhost", "::1", "[::1]"]
    public = ["0.0.0.0", "::", "192.0.2.10", "10.0.0.1", "example.org", "localhost.example.org", ""]
    assert [is_loopback(host) for host in private] == [True] * len(private)
    assert [is_loopback(host) for host in public] == [False] * len(public)


@pytest.mark.e2e
def test_serve_without_keys_binds_to_loopback_and_says_so(  # type: ignore[no-untyped-def]
    settings_factory, sqlite_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "api.log"
    with api_process(settings_factory(sqlite_url), log=log) as (client, _):
        assert client.get("/v1/jobs").status_code == 200  # no keys: open, to this machine only
    text = log.read_text()
    assert "Uvicorn running on http://127.0.0.1:" in text
    assert "WARNING service.server: no API keys are set" in text


@pytest.mark.e2e
def test_serve_on_another_address_without_keys_needs_the_flag_and_warns(  # type: ignore[no-untyped-def]
    settings_factory, sqlite_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "api.log"
    settings = settings_factory(sqlite_url)
    with api_process(settings, "--host", "0.0.0.0", "--insecure-no-auth", log=log) as (client, _):
        assert client.get("/v1/jobs").status_code == 200
    text = log.read_text()
    assert "Uvicorn running on http://0.0.0.0:" in text
    assert "WARNING service.server: --insecure-no-auth: serving on 0.0.0.0 WITHOUT API keys" in text


@pytest.mark.e2e
def test_serve_with_keys_on_another_address(settings_factory, sqlite_url: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "api.log"
    settings = settings_factory(sqlite_url, api_keys=[KEY], admin_keys=[f"sha256:{'a' * 64}"])
    with api_process(settings, "--host", "0.0.0.0", log=log) as (client, _):
        assert client.get("/v1/jobs").status_code == 401
        assert client.get("/v1/jobs", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    text = log.read_text()
    assert "INFO service.server: API keys are set (1 key(s), 1 admin key(s))" in text
    assert KEY not in text and "a" * 64 not in text  # keys and digests are never logged
