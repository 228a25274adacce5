"""A sweep's jobs: one spec per combination of grid values and seeds, each checked like a job.

Every combination is validated exactly as POST /v1/jobs validates a job (the spec's rules, then
shared.admission.job_checks.check_job_spec: paths in the caller's data folder, trackers, data checks); the
first one that fails refuses the whole sweep with 422 naming the
combination and the field (`grid.<name>`, `seeds` or `spec.<name>`), and nothing is stored.
"""

from __future__ import annotations

import itertools
import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from shared.admission.job_checks import check_job_spec
from shared.core.config import Settings
from shared.core.errors import MAX_PROBLEMS, InvalidRequest, InvalidSpec, Problem
from shared.jobs_repo import SweepJob
from shared.jobspec import validation_messages
from shared.jobspec.data_scope import DataScope
from shared.jobspec.spec import JobSpec, field_names, spec_keys

MAX_SWEEP_JOBS = 100
MAX_GRID_VALUES = 50


@dataclass(frozen=True)
class Combination:
    values: dict[str, Any]  # one value per grid field
    seed: int

    def describe(self) -> str:
        return " ".join([*(f"{k}={v}" for k, v in self.values.items()), f"seed={self.seed}"])


def combinations(grid: dict[str, list[Any]], seeds: list[int]) -> Iterator[Combination]:
    """Grid values in the order given (the first field varies slowest), each with every seed."""
    for values in itertools.product(*grid.values()):
        for seed in seeds:
            yield Combination(dict(zip(grid, values, strict=True)), seed)


@dataclass(frozen=True)
class ResolvedSweep:
    """A sweep as it will be stored: its spec and grid with the types the jobs have (a grid value
    sent as "1e-4" is stored as 0.0001, as its jobs store it), the seeds, and one job per combination."""

    spec: dict[str, Any]
    grid: dict[str, list[Any]]
    seeds: list[int]
    jobs: list[SweepJob]


def resolve_sweep(
    spec: dict[str, Any],
    seeds: list[int],
    grid: dict[str, list[Any]],
    settings: Settings,
    *,
    scope: DataScope,
) -> ResolvedSweep:
    """The seeds used and one resolved job spec per combination; InvalidRequest naming what is wrong."""
    _check_shape(spec, seeds, grid)
    if not seeds:
        # One seed for every configuration, so that they differ only in their grid values
        # (drawn as JobSpec.with_seed draws one for a job without a seed).
        seeds = [spec["seed"]] if spec.get("seed") is not None else [secrets.randbelow(2**31)]
    jobs: list[SweepJob] = []
    seen: dict[str, str] = {}
    for combination in combinations(grid, seeds):
        warnings: list[str] = []
        resolved = _resolve(spec, combination, settings, scope=scope, warnings=warnings)
        # Described with the values as the job holds them ("1e-4" sent is 0.0001 stored).
        described = Combination({name: resolved[name] for name in combination.values}, combination.seed)
        key = json.dumps(resolved, sort_keys=True)
        if key in seen:
            raise InvalidRequest(
                f"combinations {seen[key]!r} and {described.describe()!r} are the same job", field="grid"
            )
        seen[key] = described.describe()
        jobs.append(SweepJob(resolved, described.describe(), tuple(warnings), combination.values))
    return ResolvedSweep(_typed_spec(spec, jobs[0].spec), _typed_grid(grid, jobs), seeds, jobs)


def _typed_spec(spec: dict[str, Any], first: dict[str, Any]) -> dict[str, Any]:
    """The keys the sweep's spec gave, under their field names, with the values its jobs hold."""
    typed: dict[str, Any] = {}
    for key in spec:
        for name in field_names(key):
            if name in first:
                typed[name] = first[name]
    return typed


def _typed_grid(grid: dict[str, list[Any]], jobs: list[SweepJob]) -> dict[str, list[Any]]:
    """Each grid value as the jobs with it store it."""
    typed: dict[str, list[Any]] = {}
    for name, values in grid.items():
        typed[name] = [
            next(job.spec[name] for job in jobs if job.grid_values.get(name) == value) for value in values
        ]
    return typed


def _check_shape(spec: dict[str, Any], seeds: list[int], grid: dict[str, list[Any]]) -> None:
    if not seeds and not grid:
        raise InvalidRequest("a sweep needs seeds, a grid, or both", field="seeds")
    if len(set(seeds)) != len(seeds):
        raise InvalidRequest("seeds repeat: each seed once", field="seeds")
    if seeds and spec.get("seed") is not None:
        raise InvalidRequest("give the seeds in `seeds`, not a seed in the spec as well", field="spec.seed")
    for name, values in grid.items():
        if name == "seed":
            raise InvalidRequest("seeds go in `seeds`, not in the grid", field="grid.seed")
        if name not in JobSpec.model_fields:
            raise InvalidRequest(f"{name!r} is not a job spec field", field=f"grid.{name}")
        if name in spec:
            raise InvalidRequest(f"{name!r} is both in the spec and in the grid", field=f"grid.{name}")
        if not values or len(values) > MAX_GRID_VALUES:
            raise InvalidRequest(f"give 1 to {MAX_GRID_VALUES} values", field=f"grid.{name}")
    count = max(len(seeds), 1)
    for values in grid.values():
        count *= len(values)
    if count > MAX_SWEEP_JOBS:
        raise InvalidRequest(
            f"the sweep would make {count} jobs; at most {MAX_SWEEP_JOBS} in one sweep", field="grid"
        )


def _resolve(
    spec: dict[str, Any],
    combination: Combination,
    settings: Settings,
    *,
    scope: DataScope,
    warnings: list[str],
) -> dict[str, Any]:
    values = {**spec, **combination.values, "seed": combination.seed}
    try:
        job_spec = check_job_spec(JobSpec.model_validate(values), settings, scope=scope, warnings=warnings)
    except ValidationError as exc:
        found = []
        for index, error in enumerate(exc.errors()):
            location = error.get("loc") or ()
            name = str(location[0]) if location else None
            # A near match ("did you mean") only for the problems the answer lists (MAX_PROBLEMS):
            # one per unknown key of a 5,000-key spec was seconds of CPU (issue 32).
            known = (lambda _loc: spec_keys()) if index < MAX_PROBLEMS else None
            message = validation_messages.message(error, known)
            found.append((name, validation_messages.code(error), message))
        raise _refused(combination, found) from exc
    except InvalidSpec as exc:  # every problem, each located in the sweep's body
        raise _refused(combination, [(p.field or None, p.code, p.message) for p in exc.problems]) from exc
    return job_spec.model_dump(mode="json")


def _refused(combination: Combination, found: list[tuple[str | None, str, str]]) -> InvalidRequest:
    problems = []
    for name, code, message in found:
        if name == "seed":
            field = "seeds"
        elif name in combination.values:
            field = f"grid.{name}"
        else:
            field = f"spec.{name}" if name else "spec"
        problems.append(Problem(field, code, f"combination {combination.describe()}: {message}"))
    return InvalidRequest(problems=problems)
