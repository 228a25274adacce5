"""What can still be checked of a spec that was refused for some of its fields.

A request whose spec has a typo in one flag is refused before any route runs (pydantic validates the
body first); the data files it names would then go unchecked, and the user would learn of a missing
file or a bad label only after fixing the typo. `salvage` takes the refused fields out of the spec
and validates the rest, so that the other checks (shared/admission/job_checks.spec_problems) can still run
and one answer names every problem.

Only the first round of refusals is reported: what the remainder's validation refuses after a field
was taken out may be caused by taking it out (no task_name left, so "give a task_name or a
train_file"), so those fields are taken out too but not reported. A refused task_name leaves nothing
to salvage: every data check depends on the task.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from shared.jobspec.spec import JobSpec

# Rounds of "take out what was refused and validate again" before giving up.
MAX_ROUNDS = 3


@dataclass(frozen=True)
class Salvaged:
    spec: JobSpec
    dropped: frozenset[str]  # the spec's keys taken out (refused, or refused once others were)


def refused_keys(locations: Iterable[Sequence[Any]]) -> set[str] | None:
    """The spec keys that pydantic errors at `locations` (relative to the spec) name; None when one
    names the spec as a whole (nothing to take out)."""
    keys: set[str] = set()
    for loc in locations:
        if not loc:
            return None
        keys.add(str(loc[0]))
    return keys


def salvage(raw: dict[str, Any], refused: set[str]) -> Salvaged | None:
    """The spec `raw` without its `refused` keys, validated; None when there is nothing to check."""
    dropped = set(refused)
    for _round in range(MAX_ROUNDS):
        if "task_name" in dropped:
            return None
        try:
            spec = JobSpec.model_validate({k: v for k, v in raw.items() if k not in dropped})
        except ValidationError as exc:
            more = refused_keys(tuple(e.get("loc") or ()) for e in exc.errors())
            if not more or more <= dropped:
                return None
            dropped |= more
            continue
        return Salvaged(spec, frozenset(dropped))
    return None
