"""Crash points for the tests: a process killed at a named place, to show what a crash there leaves.

A test sets GLUEJOBS_TEST_CRASH_AT to a point's name in the environment of the process it starts;
that process exits at once (no cleanup, no `finally`: as a SIGKILL or a power cut would) when it
reaches the point. Unset, a crash point is one environment lookup.
"""

from __future__ import annotations

import os

CRASH_AT_ENV = "GLUEJOBS_TEST_CRASH_AT"
CRASH_EXIT_CODE = 70


def crash_point(name: str) -> None:
    """Exit here, at once, when the environment names this point."""
    if os.environ.get(CRASH_AT_ENV) == name:
        os._exit(CRASH_EXIT_CODE)
