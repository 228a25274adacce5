"""A Postgres that accepts connections but never answers: a connection attempt gives up on its own
time, not the kernel's TCP timeout, so the API answers 503 and workers retry instead of hanging."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from shared.core import db as db_module
from shared.core.db import Database


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP port that accepts and then says nothing, like a host that drops every packet after
    the handshake."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for connection in held:
        connection.close()
    server.close()


def _seconds_to_fail(url: str) -> float:
    database = Database(url)
    started = time.monotonic()
    with pytest.raises(OperationalError), database.engine.connect() as connection:
        connection.execute(text("SELECT 1"))
    database.dispose()
    return time.monotonic() - started


def test_the_default_connect_timeout_bounds_a_silent_database(
    silent_server: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db_module, "POSTGRES_CONNECT_TIMEOUT_S", 1)
    # psycopg tries each address of the host in turn, each with the whole timeout.
    assert _seconds_to_fail(f"postgresql+psycopg://postgres@127.0.0.1:{silent_server}/test") < 10


def test_the_urls_connect_timeout_wins(silent_server: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(db_module, "POSTGRES_CONNECT_TIMEOUT_S", 600)
    url = f"postgresql+psycopg://postgres@127.0.0.1:{silent_server}/test?connect_timeout=1"
    assert _seconds_to_fail(url) < 10
