"""API keys: the key ring is built once at start-up; a presented key is always hashed as a secret.

Configured entries are keys or `sha256:<hex>` digests of keys (so a deployment need not keep the
keys themselves). A client never sends a digest: whatever follows `Bearer ` is hashed, so knowing
a key's digest (from a config file, a log, the `owner` column) does not let anyone act as that key.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fastapi.security.utils import get_authorization_scheme_param

from shared.config import Settings, configured_key_digest, secret_digest
from shared.errors import Unauthorized

logger = logging.getLogger(__name__)

# Shorter keys can be guessed; warn the operator (refusing them would break existing set-ups).
MIN_KEY_CHARS = 16


@dataclass(frozen=True)
class Principal:
    """Who is calling. `owner` is the digest of their key; None when auth is off."""

    owner: str | None
    is_admin: bool

    @property
    def owner_filter(self) -> str | None:
        """The owner a query must match: admins (and everyone when auth is off) see every job."""
        return None if self.is_admin else self.owner


ANONYMOUS = Principal(owner=None, is_admin=True)


@dataclass(frozen=True)
class KeyRing:
    """The digests of the configured keys, each mapped to whether it is an admin key.

    A presented key is looked up by the SHA-256 digest of it in a dict. That is safe against timing
    attacks without hmac.compare_digest: the dict hashes the digest with Python's per-process
    random SipHash key, and a string comparison can only reveal how many leading characters of
    sha256(presented key) match a stored digest. The caller chooses the key, not its digest, so that
    prefix tells nothing about any key (steering it would need SHA-256 preimages), and the lookup
    costs the same whatever the ring holds.
    """

    digests: dict[str, bool]

    @classmethod
    def from_settings(cls, settings: Settings) -> KeyRing:
        digests = {configured_key_digest(entry): False for entry in settings.api_keys}
        # An entry in both lists is an admin key.
        digests |= {configured_key_digest(entry): True for entry in settings.admin_keys}
        short = [
            entry
            for entry in (*settings.api_keys, *settings.admin_keys)
            if not entry.startswith("sha256:") and len(entry) < MIN_KEY_CHARS
        ]
        if short:
            logger.warning(
                "%d configured API key(s) are shorter than %d characters: use long random keys",
                len(short),
                MIN_KEY_CHARS,
            )
        return cls(digests)

    @property
    def enabled(self) -> bool:
        return bool(self.digests)

    def principal(self, authorization: str | None) -> Principal:
        """The caller named by an `Authorization` header, or Unauthorized."""
        if not self.enabled:
            return ANONYMOUS
        scheme, key = get_authorization_scheme_param(authorization)
        if not authorization or scheme.lower() != "bearer" or not key:
            raise Unauthorized()
        # Configured keys are printable ASCII; anything else cannot be one (and need not be hashed).
        digest = secret_digest(key) if key.isascii() else None
        is_admin = self.digests.get(digest) if digest is not None else None
        if is_admin is None:
            raise Unauthorized("the API key is not valid")
        return Principal(owner=digest, is_admin=is_admin)
