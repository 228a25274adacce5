"""Which build of gluejobs this process is: its release, the commit it was made from (where known)
and a hash of its own code, so that two builds of one release tell apart on GET /v1/workers and in a
refused job's events (issue 35: a worker from an earlier commit of 0.2.0 read as 0.2.0 like the rest).

The hash covers the code a worker runs (shared/ and worker/, every .py file, by path and content):
it is the same for the same files however they were installed (a wheel has no .git), and it
changes with any edit. The commit comes from git where the code is a checkout, else from
GLUEJOBS_BUILD_COMMIT (set by whoever builds an image).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

from shared.core import release

# shared/core/build.py: the folder that holds shared/ and worker/ is three up.
ROOT = Path(__file__).resolve().parents[2]
CODE_DIRS = ("shared", "worker")


@cache
def build_hash() -> str:
    """12 hex digits of sha256 over this build's code (about 20 ms, once a process)."""
    digest = hashlib.sha256()
    for top in CODE_DIRS:
        folder = ROOT / top
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*.py")):
            digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


@cache
def commit() -> str | None:
    """The git commit of this build (12 hex digits), or None where nobody recorded it."""
    if from_env := os.environ.get("GLUEJOBS_BUILD_COMMIT"):
        return from_env[:40]
    if not (ROOT / ".git").exists():
        return None
    try:
        found = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return found.stdout.strip() or None


def version_string() -> str:
    """The release with its build, as a worker row keeps it: "0.2.0+1a2b3c4d5e6f" (PEP 440's local
    version, which shared/core/release.version_key ignores when it compares releases)."""
    return f"{release.RELEASE}+{build_hash()}"


def describe() -> str:
    """One phrase for log lines and events: "gluejobs 0.2.0 (build 1a2b3c4d5e6f, commit 66c9313…)"."""
    at = f", commit {commit()}" if commit() else ""
    return f"gluejobs {release.RELEASE} (build {build_hash()}{at})"


def build_record(spec_fields: frozenset[str], schema_head: str) -> dict[str, Any]:
    """What a worker says of its build (GET /v1/workers): what it is and what it supports."""
    return {
        "version": release.RELEASE,
        "build": build_hash(),
        "commit": commit(),
        "schema_head": schema_head,
        "spec_fields": sorted(spec_fields),
    }
