"""What makes two POST /v1/jobs requests "the same" for an Idempotency-Key."""

from __future__ import annotations

import hashlib
import json

from service.schemas.jobs import JobCreate


def request_hash(body: JobCreate) -> str:
    """The digest of the request as validated (defaults filled in, keys sorted), so spelling the
    same job differently (key order, an explicit default, an alias) is still the same request. The
    seed is taken as sent: a job without one repeats with the seed its first request drew."""
    canonical = json.dumps(body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
