"""Rate limits per key, the same on every API process: counted in the database, not in memory.

Requests: fixed one-minute windows. Each /v1 request of a key (the principal's `bucket`) adds one to
the row (`w:<bucket>` or `r:<bucket>`, this minute) of rate_windows in one statement, an upsert that
returns the new count; over GLUEJOBS_RATE_SUBMITS_PER_MINUTE (writes: any method but GET, HEAD,
OPTIONS) or GLUEJOBS_RATE_READS_PER_MINUTE (reads) the request gets 429 `rate_limited` with
Retry-After = the seconds left in the minute. A refused request counts too: a client that ignores
Retry-After gains nothing by hammering. A fixed window lets a key make up to twice its limit across
a minute's boundary; that is the price of one row and one statement per request (a sliding window
would need a row per request, or two reads).

Writes are counted exactly: one statement per write (measured in docs/operators/security.md:
bench/rate_limit_bench.py). Reads are counted in memory while a key is well under its limit: each
process adds its reads up per key and writes them in one statement every FLUSH_S (ReadCounts), so a
read does not take SQLite's write lock nor cost Postgres a round trip. The flush returns each key's
total over every process; once a key's total as this process knows it, plus its own reads not yet
flushed, reaches half its limit, its reads are counted exactly again, one statement each (and that
statement also adds what was waiting). So a key is refused at its limit as before, across processes;
the slack is what the other processes counted in memory and have not flushed yet — at most
FLUSH_S of reads each, and never more than half the limit per process (a key reading at 6000 a
minute over two processes reads at most 100 over it). A refused read is counted like any other.
Rows older than the last minute are deleted by the first count each process writes in a new minute
(one statement a minute per process, over a table of a few rows per active key).

Open streams: each GET /v1/jobs/{id}/stream is a row of open_streams while it runs (StreamSlots),
refreshed every REFRESH_S; a key over GLUEJOBS_MAX_STREAMS_PER_KEY rows refreshed within STALE_S
(rows left by a process that died stop counting) gets 429 for the next one.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import Connection, delete, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError

from shared.core.config import Settings
from shared.core.db import WRITE_OPTION, Database
from shared.core.errors import RateLimited
from shared.core.tables import OpenStream, RateWindow, utcnow

logger = logging.getLogger(__name__)

WINDOW_S = 60
# Reads counted in memory are written this often (one statement for every key of the process).
FLUSH_S = 1.0
# A flusher with nothing to write for this long stops; the next read counted in memory restarts it.
FLUSH_IDLE_S = 30.0
# A stream refreshes its row this often; a row not refreshed for STALE_S is a dead process's.
REFRESH_S = 30.0
STALE_S = 90.0
# What a key over its stream cap is told to wait: about the time a stream of a finished job lasts.
STREAM_RETRY_AFTER_S = 10


@dataclass
class RateLimits:
    """Counts each key's requests per minute in `rate_windows`: writes one statement each, reads in
    memory while the key is under half its limit (see the module). Thread-safe."""

    db: Database
    writes_per_minute: int
    reads_per_minute: int
    clock: Callable[[], float] = time.time
    _cleaned: int = field(default=0, repr=False)  # the last minute whose old rows this process deleted
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # (bucket, window) → reads admitted here and not written yet; → the total the database last said.
    _pending: dict[tuple[str, int], int] = field(default_factory=dict, repr=False)
    _known: dict[tuple[str, int], int] = field(default_factory=dict, repr=False)
    _flusher: threading.Thread | None = field(default=None, repr=False)

    @classmethod
    def from_settings(cls, settings: Settings, db: Database) -> RateLimits | None:
        """None when both limits are off (0): nothing to count."""
        if not settings.rate_submits_per_minute and not settings.rate_reads_per_minute:
            return None
        return cls(counting_database(db), settings.rate_submits_per_minute, settings.rate_reads_per_minute)

    def count_without_waiting(self, bucket: str, *, write: bool) -> bool:
        """Count a read in memory when the key is well under its limit (no database, so it may run
        on the event loop): True when counted (or nothing to count); False: call count()."""
        limit = self.writes_per_minute if write else self.reads_per_minute
        if not limit or not bucket:
            return True
        if write:
            return False
        key = (bucket, int(self.clock() // WINDOW_S))
        with self._lock:
            pending = self._pending.get(key, 0)
            if self._known.get(key, 0) + pending + 1 >= limit / 2:
                return False
            self._pending[key] = pending + 1
            if self._flusher is None:
                self._flusher = threading.Thread(
                    target=self._flush_forever, name="gluejobs-rate-flush", daemon=True
                )
                self._flusher.start()
        return True

    def count(self, bucket: str, *, write: bool) -> None:
        """Count one request of the key `bucket`; RateLimited when it is over its limit."""
        limit = self.writes_per_minute if write else self.reads_per_minute
        if not limit or not bucket:
            return
        if not write and self.count_without_waiting(bucket, write=False):
            return
        now = self.clock()
        window = int(now // WINDOW_S)
        name = f"{'w' if write else 'r'}:{bucket}"
        with self._lock:  # this process's reads not yet written go with this one
            waiting = 0 if write else self._pending.pop((bucket, window), 0)
        try:
            with self.db.engine.connect().execution_options(**{WRITE_OPTION: True}) as connection:
                with connection.begin():
                    count = _increment(connection, name, window, 1 + waiting)
                self._clean(connection, window)
        except BaseException:
            if waiting:
                self._add_pending((bucket, window), waiting)
            raise
        if not write:
            with self._lock:
                self._known[(bucket, window)] = count
        if count > limit:
            kind = "writes" if write else "reads"
            retry_after_s = max(1, math.ceil((window + 1) * WINDOW_S - now))
            raise RateLimited(
                f"this key made more than {limit} {kind} this minute "
                f"(GLUEJOBS_RATE_{'SUBMITS' if write else 'READS'}_PER_MINUTE); "
                f"try again in {retry_after_s} s",
                retry_after_s=retry_after_s,
            )

    def flush(self) -> None:
        """Write the reads counted in memory, one statement per key in one transaction; learn each
        key's total over every process. A database that is away keeps them for the next flush."""
        with self._lock:
            pending, self._pending = self._pending, {}
        if not pending:
            return
        window = int(self.clock() // WINDOW_S)
        try:
            with self.db.engine.connect().execution_options(**{WRITE_OPTION: True}) as connection:
                with connection.begin():
                    totals = {
                        key: _increment(connection, f"r:{key[0]}", key[1], count)
                        for key, count in pending.items()
                    }
                self._clean(connection, window)
        except BaseException:
            for key, count in pending.items():
                self._add_pending(key, count)
            raise
        with self._lock:
            self._known = {k: v for k, v in self._known.items() if k[1] >= window - 1}
            self._known.update(totals)

    def _add_pending(self, key: tuple[str, int], count: int) -> None:
        with self._lock:
            self._pending[key] = self._pending.get(key, 0) + count

    def _clean(self, connection: Connection, window: int) -> None:
        if window != self._cleaned:
            self._cleaned = window
            with connection.begin():  # the minute before stays, for a process whose clock is behind
                connection.execute(delete(RateWindow).where(RateWindow.window < window - 1))

    def _flush_forever(self) -> None:
        idle_since = time.monotonic()
        while True:
            time.sleep(FLUSH_S)
            with self._lock:
                if not self._pending:
                    if time.monotonic() - idle_since >= FLUSH_IDLE_S:
                        self._flusher = None
                        return
                    continue
            idle_since = time.monotonic()
            try:
                self.flush()
            except SQLAlchemyError as exc:  # away: the counts wait for the next flush
                logger.debug("could not write the read counts yet (%s)", type(exc).__name__)


def counting_database(db: Database) -> Database:
    """Where the counts are written. Postgres: an engine of their own whose statements commit as they
    run (no BEGIN and COMMIT round trips) and do not wait for the WAL to reach the disk (a count lost
    in a crash costs nothing): the upsert is one round trip that no fsync holds up. SQLite's commits
    in WAL mode do not sync the disk (synchronous=NORMAL), and a second engine would only add a
    second writer for the file's one lock: the API's own engine."""
    if db.dialect != "postgresql":
        return db
    return Database(
        db.url, isolation_level="AUTOCOMMIT", connect_args={"options": "-c synchronous_commit=off"}
    )


def _increment(connection: Connection, bucket: str, window: int, by: int = 1) -> int:
    """INSERT … ON CONFLICT (bucket, window) DO UPDATE SET count = count + by RETURNING count: one
    statement, atomic on both databases however many processes count at once."""
    upsert = postgresql.insert if connection.dialect.name == "postgresql" else sqlite.insert
    statement = (
        upsert(RateWindow)
        .values(bucket=bucket, window=window, count=by)
        .on_conflict_do_update(
            index_elements=[RateWindow.bucket, RateWindow.window], set_={"count": RateWindow.count + by}
        )
        .returning(RateWindow.count)
    )
    count: int = connection.execute(statement).scalar_one()
    return count


@dataclass(frozen=True)
class StreamSlots:
    """One key's open streams, across every API process (rows of open_streams). Each method is a
    short transaction: call them in a thread, never on the event loop."""

    db: Database
    max_per_key: int

    def open(self, bucket: str, job_id: int) -> int | None:
        """Take a slot for a stream of `job_id`: the row's id (None when nothing is counted: no auth,
        or no cap), or RateLimited when the key already holds its cap. The row is written first and
        counted after, so two processes racing for the last slot cannot both get it."""
        if not bucket or not self.max_per_key:
            return None
        now = utcnow()
        fresh_since = now - timedelta(seconds=STALE_S)
        with self.db.engine.connect().execution_options(**{WRITE_OPTION: True}) as connection:
            with connection.begin():
                # This key's rows of dead processes go as it opens a stream: no sweeper needed.
                connection.execute(
                    delete(OpenStream).where(OpenStream.bucket == bucket, OpenStream.seen_at < fresh_since)
                )
                slot: int = connection.execute(
                    insert(OpenStream)
                    .values(bucket=bucket, job_id=job_id, opened_at=now, seen_at=now)
                    .returning(OpenStream.id)
                ).scalar_one()
            with connection.begin():
                held = connection.execute(
                    select(func.count())
                    .select_from(OpenStream)
                    .where(OpenStream.bucket == bucket, OpenStream.seen_at >= fresh_since)
                ).scalar_one()
                if held <= self.max_per_key:
                    return slot
                connection.execute(delete(OpenStream).where(OpenStream.id == slot))
        raise RateLimited(
            f"this key has {self.max_per_key} event streams open already (GLUEJOBS_MAX_STREAMS_PER_KEY); "
            "close one, or try again later",
            retry_after_s=STREAM_RETRY_AFTER_S,
        )

    def refresh(self, slot: int) -> None:
        with self.db.engine.begin() as connection:
            connection.execute(update(OpenStream).where(OpenStream.id == slot).values(seen_at=utcnow()))

    def close(self, slot: int) -> None:
        with self.db.engine.begin() as connection:
            connection.execute(delete(OpenStream).where(OpenStream.id == slot))
