"""Error log lines are bounded and never quote key material or what a request carried (issue 21,
finding 8): the expiry that overflowed into a 500 is a 422, and an unexpected error's log line names
its exception types and frames, never its message, on SQLite and Postgres."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError

from service.error_log import MAX_LOG_CHARS, BoundedLines, describe_failure
from service.main import create_app
from shared.core.config import Settings
from shared.core.db import Database
from shared.core.tables import ApiKey, KeyRole, utcnow
from tests.support.e2e import LOOPBACK_URL
from tests.support.kit import auth

ROOT = "root-admin-key-0123456789abcdef"
SECRET = "gj_" + "s3cr3t" * 7  # what must never reach a log line
CELL = "a cell of somebody's file " * 4000  # 100 KB


@pytest.fixture
def keyed(settings_factory: Any, db_url: str) -> Settings:
    settings: Settings = settings_factory(db_url, admin_keys=[f"root={ROOT}"])
    return settings


@pytest.fixture
def api(keyed: Settings) -> Iterator[TestClient]:
    app = create_app(keyed)

    @app.get("/v1/broken")
    def broken() -> None:  # a bug that quotes what it was handed, as a parser does
        raise ValueError(f"could not convert {CELL!r} with {SECRET}")

    with TestClient(app, base_url=LOOPBACK_URL, raise_server_exceptions=False) as client:
        yield client


@pytest.mark.parametrize("when", ["9999-12-31T23:59:59-14:00", "9999-12-31T23:59:59Z", "2999-01-01T00:00:00"])
def test_an_expiry_past_what_a_key_may_have_is_422(
    api: TestClient, caplog: pytest.LogCaptureFixture, when: str
) -> None:
    with caplog.at_level(logging.INFO):
        made = api.post("/v1/keys", json={"owner": "bob", "expires_at": when}, headers=auth(ROOT))

    assert made.status_code == 422, made.text
    assert made.json()["error"]["field"] == "expires_at"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_an_unexpected_error_is_logged_bounded_without_its_message(
    api: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        answer = api.get("/v1/broken", headers=auth(ROOT))

    assert answer.status_code == 500
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "ValueError" in line and "broken" in line  # what failed, and where
    assert SECRET not in line and "a cell of" not in line
    assert len(line) <= MAX_LOG_CHARS and not caplog.records[-1].exc_info


def test_a_failed_statement_names_no_parameter(db: Database) -> None:
    """A key's digest in a failed insert (here: a second key with the same digest) stays out of the
    error's text on both databases, and so out of any log line that quotes it."""
    digest = "d" * 64
    row = {
        "name": "k",
        "owner": "bob",
        "role": KeyRole.user,
        "digest": digest,
        "prefix": SECRET[:10],
        "created_at": utcnow(),
    }
    with db.engine.begin() as connection:
        connection.execute(insert(ApiKey).values(**row))
    with pytest.raises(IntegrityError) as failed, db.engine.begin() as connection:
        connection.execute(insert(ApiKey).values(**row))
    assert "[SQL parameters hidden" in str(failed.value)
    # Postgres' own DETAIL quotes the duplicate value: the log line holds no message at all.
    logged = describe_failure(failed.value)
    assert "IntegrityError" in logged and "INSERT INTO api_keys" in logged
    assert digest not in logged and SECRET[:10] not in logged


def test_a_handler_with_bounded_lines_never_writes_a_traceback_message() -> None:
    """What the server's handlers get (uvicorn's "Exception in ASGI application" traceback too)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(BoundedLines())
    logger = logging.getLogger("tests.bounded")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        try:
            try:
                raise KeyError(SECRET)
            except KeyError as inner:
                raise RuntimeError(CELL) from inner
        except RuntimeError:
            logger.exception("Exception in ASGI application")
        logger.warning("a library's warning quoting %s", CELL)
    finally:
        logger.removeHandler(handler)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and all(len(line) <= MAX_LOG_CHARS for line in lines)
    assert "RuntimeError" in lines[0] and "KeyError" in lines[0] and SECRET not in out.getvalue()
    assert "a cell of" not in lines[0]


def test_access_lines_keep_uvicorns_format_with_the_path_cut() -> None:
    """uvicorn's access formatter unpacks the record's own arguments: they stay a 5-tuple."""
    from uvicorn.logging import AccessFormatter

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        AccessFormatter('%(client_addr)s - "%(request_line)s" %(status_code)s', use_colors=False)
    )
    handler.addFilter(BoundedLines())
    logger = logging.getLogger("uvicorn.access")
    logger.addHandler(handler)
    was, logger.propagate, level = logger.propagate, False, logger.level
    logger.setLevel(logging.INFO)
    try:
        logger.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", "/v1/" + "x" * 20_000, "1.1", 404)
    finally:
        logger.removeHandler(handler)
        logger.propagate = was
        logger.setLevel(level)
    [line] = out.getvalue().splitlines()
    assert line.startswith('127.0.0.1:5 - "GET /v1/xxx') and line.endswith('HTTP/1.1" 404 Not Found')
    assert len(line) < 1100
