"""API keys: who is calling. Bootstrap keys come from the configuration (hashed once, at start-up);
keys made over the API are rows of `api_keys` (service/accounts/api_keys.py). A stored key found live is
remembered for at most KEY_CACHE_S (StoredKeyCache), so that a client polling many times a second
costs one key lookup a second, not one a request: a revocation or rotation holds on the next
request on the API process that made it (a change to /v1/keys drops the cache there) and within
KEY_CACHE_S on every other process; an expiry holds at once (the remembered row's expires_at is
checked on every request), an expiry moved earlier by editing the row within KEY_CACHE_S. A
presented key is always hashed as a secret and looked up by its digest.

Configured entries are keys or `sha256:<hex>` digests of keys (so a deployment need not keep the
keys themselves), optionally after `owner=`. A client never sends a digest: whatever follows
`Bearer ` is hashed, so knowing a key's digest (from a config file or a log) does not let anyone act
as that key.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from fastapi.security.utils import get_authorization_scheme_param
from sqlalchemy.exc import SQLAlchemyError

from shared.core.config import Settings, secret_digest, split_owner
from shared.core.db_retries import is_transient
from shared.core.errors import Forbidden, Unauthorized
from shared.core.owners import ConfiguredKey, configured_keys
from shared.core.tables import ApiKey, KeyRole, utcnow

logger = logging.getLogger(__name__)

# Shorter keys can be guessed; warn the operator (refusing them would break existing set-ups).
MIN_KEY_CHARS = 16


@dataclass(frozen=True)
class Principal:
    """Who is calling: an owner (None when auth is off), through which key, with which role."""

    owner: str | None
    role: KeyRole
    # The stored key's id (None for a configured key, and without auth), and a label for events and
    # logs that never holds the secret: the stored key's name and prefix, or `configured`.
    key_id: int | None = None
    key_label: str = "configured"
    # What counts this caller's requests against the rate limits: one key, not one owner.
    bucket: str = ""

    @property
    def is_admin(self) -> bool:
        return self.role == KeyRole.admin

    @property
    def can_write(self) -> bool:
        return self.role != KeyRole.read_only

    @property
    def owner_filter(self) -> str | None:
        """The owner a query must match: admins (and everyone when auth is off) see every job."""
        return None if self.is_admin else self.owner

    def require_admin(self) -> None:
        if not self.is_admin:
            raise Forbidden("this needs an admin key")

    @property
    def actor(self) -> dict[str, object]:
        """Who acted, as events and the audit log record it (never the secret)."""
        return {"owner": self.owner, "key": self.key_label, "key_id": self.key_id}


ANONYMOUS = Principal(owner=None, role=KeyRole.admin, key_label="no auth")

# Looks a digest up among the stored keys: the live key, or None.
StoredKeyLookup = Callable[[str], ApiKey | None]

# How long a live stored key is remembered: the bound on how late a revocation or rotation is seen.
KEY_CACHE_S = 1.0


@dataclass(frozen=True)
class StoredKey:
    """What a request needs of a stored key row (a snapshot, safe to share between threads)."""

    id: int
    owner: str
    role: str
    name: str
    expires_at: datetime | None

    @property
    def expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= utcnow()


class StoredKeyCache:
    """Live stored keys by digest, each remembered for at most KEY_CACHE_S after it was read. Only
    keys found live are remembered: an unknown or revoked key is asked for every time (a guessing
    client cannot fill the cache, and a new key works at once). Bounded: at MAX_ENTRIES live keys
    seen within one KEY_CACHE_S, the cache starts over."""

    MAX_ENTRIES = 10_000

    def __init__(self, lookup: StoredKeyLookup, ttl_s: float = KEY_CACHE_S) -> None:
        self._lookup = lookup
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._keys: dict[str, tuple[StoredKey, float]] = {}

    def remembered(self, digest: str) -> StoredKey | None:
        """The key if it was read within the bound (and has not expired since); None: ask."""
        with self._lock:
            entry = self._keys.get(digest)
        if entry is None or time.monotonic() - entry[1] >= self._ttl_s or entry[0].expired:
            return None
        return entry[0]

    def clear(self) -> None:
        with self._lock:
            self._keys.clear()

    def find(self, digest: str) -> StoredKey | None:
        """The live key with this digest (from memory within the bound, else from the database)."""
        known = self.remembered(digest)
        if known is not None:
            return known
        row = self._lookup(digest)
        with self._lock:
            if row is None:
                self._keys.pop(digest, None)
                return None
            key = StoredKey(row.id, row.owner, row.role, row.name, row.expires_at)
            if len(self._keys) >= self.MAX_ENTRIES:
                self._keys.clear()
            self._keys[digest] = (key, time.monotonic())
            return key


class StoredKeysFlag:
    """Whether the database holds any key, asked at most every RECHECK_S. Without configured keys
    this decides whether auth is on at all, so it fails closed, never an open API by accident: while
    the database is away the request gets 503 (as any request needing it does), and a database that
    answers with an error (not migrated yet) counts as holding keys (401). Either way the next request
    asks again."""

    RECHECK_S = 10.0

    def __init__(self, ask: Callable[[], bool]) -> None:
        self._ask = ask
        self._lock = threading.Lock()
        self._value = True  # read only once asked
        self._asked_at: float | None = None

    def known(self) -> bool | None:
        """The answer if it is fresh, without asking: None when present() would ask."""
        if self._asked_at is None or time.monotonic() - self._asked_at >= self.RECHECK_S:
            return None
        return self._value

    def present(self) -> bool:
        # The lock is held while the database is asked (a millisecond every RECHECK_S): a request
        # arriving meanwhile waits for the answer rather than read a value nobody has asked yet.
        with self._lock:
            now = time.monotonic()
            if self._asked_at is not None and now - self._asked_at < self.RECHECK_S:
                return self._value
            try:
                self._value = self._ask()
            except SQLAlchemyError as exc:
                if is_transient(exc):
                    raise  # the guard answers 503 database_unavailable, as for any request then
                logger.warning("could not ask the database whether keys exist (%s): auth stays on", exc)
                return True  # not remembered: the next request asks again
            self._asked_at = now
            return self._value


@dataclass(frozen=True)
class KeyRing:
    """The configured keys by digest, and the stored keys through `lookup`.

    A configured key is looked up by the SHA-256 digest of the presented key in a dict: safe
    against timing attacks without hmac.compare_digest, because the caller chooses the key, not its
    digest, so whatever a comparison reveals of a digest's prefix tells nothing about any key. A
    stored key is found by the same digest through a unique index.
    """

    configured: dict[str, ConfiguredKey]
    lookup: StoredKeyLookup | None = None
    # Whether the database holds any key (revoked ones too); None: it is never asked.
    stored_keys: StoredKeysFlag | None = None
    cache: StoredKeyCache | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.lookup is not None and self.cache is None:
            object.__setattr__(self, "cache", StoredKeyCache(self.lookup))

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        lookup: StoredKeyLookup | None = None,
        stored_keys: StoredKeysFlag | None = None,
    ) -> KeyRing:
        short = [
            entry
            for entry in (split_owner(entry)[1] for entry in (*settings.api_keys, *settings.admin_keys))
            if not entry.startswith("sha256:") and len(entry) < MIN_KEY_CHARS
        ]
        if short:
            logger.warning(
                "%d configured API key(s) are shorter than %d characters: use long random keys",
                len(short),
                MIN_KEY_CHARS,
            )
        keys = {key.digest: key for key in configured_keys(settings)}
        return cls(keys, lookup, stored_keys)

    @property
    def enabled(self) -> bool:
        """Auth is on once any key exists: a stored key left after the configured ones were removed
        (a revoked one too) still closes the API to anonymous callers."""
        return bool(self.configured) or (self.stored_keys is not None and self.stored_keys.present())

    def principal(self, authorization: str | None) -> Principal:
        """The caller named by an `Authorization` header, or Unauthorized."""
        if not self.enabled:
            return ANONYMOUS
        digest = self._digest(authorization)
        configured = self._configured(digest)
        if configured is not None:
            return configured
        stored = self.cache.find(digest) if self.cache is not None else None
        if stored is None:
            raise Unauthorized("the API key is not valid (or was revoked, or has expired)")
        return _stored_principal(stored)

    def forget_stored(self) -> None:
        """Drop the remembered stored keys (after this process changed one: its change holds here
        on the next request; other processes see it within KEY_CACHE_S)."""
        if self.cache is not None:
            self.cache.clear()

    def principal_without_waiting(self, authorization: str | None) -> Principal | None:
        """The caller when it can be told without the database (auth off and known to be, a
        configured key, a stored key read within KEY_CACHE_S), Unauthorized for a header that names
        no key at all; None: ask principal() (in a thread: it may read the database)."""
        if not self.configured:
            known = self.stored_keys.known() if self.stored_keys is not None else False
            if known is None:
                return None
            if not known:
                return ANONYMOUS
        digest = self._digest(authorization)
        configured = self._configured(digest)
        if configured is not None:
            return configured
        stored = self.cache.remembered(digest) if self.cache is not None else None
        return _stored_principal(stored) if stored is not None else None

    def _digest(self, authorization: str | None) -> str:
        scheme, key = get_authorization_scheme_param(authorization)
        if not authorization or scheme.lower() != "bearer" or not key:
            raise Unauthorized()
        # Keys are printable ASCII; anything else cannot be one (and need not be hashed).
        if not key.isascii():
            raise Unauthorized("the API key is not valid")
        return secret_digest(key)

    def _configured(self, digest: str) -> Principal | None:
        configured = self.configured.get(digest)
        if configured is None:
            return None
        role = KeyRole.admin if configured.is_admin else KeyRole.user
        return Principal(owner=configured.owner, role=role, bucket=f"c:{digest[:32]}")


def _stored_principal(stored: StoredKey) -> Principal:
    return Principal(
        owner=stored.owner,
        role=KeyRole(stored.role),
        key_id=stored.id,
        # The name and id, not the prefix: the owner of a job an admin cancelled reads this.
        key_label=f"{stored.name} (key {stored.id})",
        bucket=f"k:{stored.id}",
    )
