"""What a user reads of a job's failure: the rules live in shared/jobspec/user_text.py, which the API
also applies to what a non-admin key reads of a job; re-exported here for the worker's modules."""

from __future__ import annotations

from shared.jobspec.user_text import Places, drop_tracebacks, for_users, places_of

__all__ = ["Places", "drop_tracebacks", "for_users", "places_of"]
