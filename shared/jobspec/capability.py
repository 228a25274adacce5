"""Whether this build can run a job, decided from the job's spec itself (issue 35 item 1).

A version string cannot say it: two builds of one release may know different spec fields (a worker
built from an earlier commit of 0.2.0 failed jobs whose specs had fields it did not know, each for
good, in a second). So a worker reads the stored spec against its own JobSpec before it runs it:

- a field this build does not know, holding its "off" value (None, False, an empty list or mapping),
  asks for nothing: the job runs without it. Every field added to JobSpec defaults to such a value
  (tests/worker/test_build_capability.py holds new fields to it), so a job that uses no new feature runs on
  a build from before that feature;
- a field this build does not know, set to anything else: the job needs a feature this build lacks;
- a spec that does not validate on this build (a value a newer build allows): this build cannot run
  it either.

In the last two cases the worker hands the job back untouched (shared/jobs_repo/queue.py
refuse_job: no attempt spent) for a build that can, instead of failing it as invalid_data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from shared.jobspec.spec import JobSpec

# The values a field that is not in use holds: what a new field must default to.
OFF_VALUES: tuple[Any, ...] = (None, False, [], {}, "")


def known_fields() -> frozenset[str]:
    """The spec fields this build knows (and so supports)."""
    return frozenset(JobSpec.model_fields)


def is_off(value: Any) -> bool:
    return any(value == off and type(value) is type(off) for off in OFF_VALUES)


@dataclass(frozen=True)
class Verdict:
    """This build's reading of a job's spec: the spec to run (`spec`), or why it cannot (`refusal`,
    one line, and `missing`, the fields this build lacks that the job uses)."""

    spec: JobSpec | None
    refusal: str | None = None
    missing: tuple[str, ...] = ()


def read_spec(stored: dict[str, Any]) -> Verdict:
    """The stored spec as this build runs it, or why this build cannot run it."""
    known = known_fields()
    unknown = sorted(set(stored) - known)
    missing = tuple(name for name in unknown if not is_off(stored[name]))
    if missing:
        return Verdict(
            None,
            f"its spec uses {', '.join(missing)}, which this build does not support",
            missing,
        )
    try:
        return Verdict(JobSpec.model_validate({k: v for k, v in stored.items() if k in known}))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, error['loc'])) or 'spec'}: {error['msg']}" for error in exc.errors()[:3]
        )
        return Verdict(None, f"its spec does not parse on this build ({problems})")


def runnable_spec(stored: dict[str, Any]) -> JobSpec:
    """The spec of a job this build took (the worker read it before it claimed it for good): unknown
    fields that are off are dropped; a spec this build cannot run raises ValueError with the reason."""
    verdict = read_spec(stored)
    if verdict.spec is None:
        raise ValueError(f"this build cannot run the job: {verdict.refusal}")
    return verdict.spec
