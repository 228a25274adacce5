"""A search's specs: the base spec and space checked together, the objective resolved against the
task's metrics, and each trial's job spec resolved exactly as POST /v1/jobs resolves a job's
(shared.admission.job_checks.check_job_spec, through the sweeps' `resolve_sweep`, so that a trial is refused
or warned about as a sweep's job would be)."""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Any

from shared.core.config import Settings
from shared.core.errors import InvalidRequest, Problem
from shared.jobs_repo import SweepJob
from shared.jobspec.data_scope import DataScope
from shared.jobspec.metric_rules import greater_is_better, possible_metrics, task_plan
from shared.jobspec.spec import JobSpec
from shared.research.sweeps import resolve_sweep
from shared.searches.config import Categorical, FloatRange, IntRange, Objective, Parameter
from shared.wire.vocabulary import COLUMN_FIELDS

# Fields a space may not search: where the data and the model come from (they are checked against
# the caller's folders once, with the base spec), and the seed (the search draws it once for all).
NOT_SEARCHABLE = frozenset(
    {"model_name_or_path", "train_file", "validation_file", "test_file", "seed", "output_dir", "report_to"}
    # Which columns hold the texts and labels is the data's, as its files are (the search's spec maps them).
    | frozenset(COLUMN_FIELDS)
)


@dataclass(frozen=True)
class ResolvedObjective:
    metric: str
    direction: str  # maximize or minimize


def check_space(spec: dict[str, Any], space: dict[str, Parameter]) -> None:
    if not space:
        raise InvalidRequest("a search needs at least one parameter in its space", field="space")
    for name in space:
        if name in NOT_SEARCHABLE:
            raise InvalidRequest(f"{name!r} cannot be searched; give it in the spec", field=f"space.{name}")
        if name not in JobSpec.model_fields:
            raise InvalidRequest(f"{name!r} is not a job spec field", field=f"space.{name}")
        if name in spec:
            raise InvalidRequest(f"{name!r} is both in the spec and in the space", field=f"space.{name}")


def resolve_objective(spec: dict[str, Any], objective: Objective) -> ResolvedObjective:
    """The metric (default: the task's main one) among those the trials report, and its direction."""
    task = spec.get("task_name")
    if task is not None and not isinstance(task, str):
        task = None  # the spec's own check names the field
    try:
        reported = possible_metrics(task)
        default = task_plan(task).main if task else "accuracy"
    except ValueError:
        reported, default = (), "accuracy"  # an unknown task: the spec's check refuses it
    metric = (objective.metric or default).removeprefix("eval_")
    if reported and metric not in reported:
        raise InvalidRequest(
            f"{metric!r} is not reported by these trials; they report {', '.join(reported)}",
            field="objective.metric",
        )
    direction = objective.direction or ("maximize" if greater_is_better(metric) else "minimize")
    return ResolvedObjective(metric, direction)


def corners(space: dict[str, Parameter]) -> list[dict[str, Any]]:
    """Points that together touch every end of every range (and a float range's middle) and every
    choice: what is checked before a search is stored, so that no trial it can draw is refused later."""
    first = {name: _values(p)[0] for name, p in space.items()}
    points = [first]
    for name, parameter in space.items():
        points += [{**first, name: value} for value in _values(parameter)[1:]]
    return points


def _values(parameter: Parameter) -> list[Any]:
    if isinstance(parameter, Categorical):
        return list(parameter.choices)
    if isinstance(parameter, IntRange):
        top = parameter.low + (parameter.high - parameter.low) // parameter.step * parameter.step
        return [parameter.low, top]
    assert isinstance(parameter, FloatRange)
    # And a value between them: a float range over an integer field (a batch size) is refused here,
    # not when the sampler first draws a fraction.
    # Each end halved (or rooted) before they meet: low + high, or low * high, can pass the largest float.
    middle = (
        math.sqrt(parameter.low) * math.sqrt(parameter.high)
        if parameter.log
        else parameter.low / 2 + parameter.high / 2
    )
    return [parameter.low, parameter.high, middle]


def resolve_trials(
    spec: dict[str, Any],
    points: list[dict[str, Any]],
    seed: int,
    settings: Settings,
    *,
    scope: DataScope,
) -> tuple[dict[str, Any], list[SweepJob]]:
    """The base spec as stored (its values typed as its jobs hold them) and one checked job per point,
    all with `seed`; InvalidRequest naming the field (`space.<name>` or `spec.<name>`)."""
    spec = {key: value for key, value in spec.items() if key != "seed"}  # every trial runs with `seed`
    jobs: list[SweepJob] = []
    base: dict[str, Any] = {}
    for point in points:
        grid = {name: [value] for name, value in point.items()}
        try:
            resolved = resolve_sweep(spec, [seed], grid, settings, scope=scope)
        except InvalidRequest as exc:  # every problem, in a search's words
            problems = [
                Problem(_field(p.field) or "spec", p.code, p.message.replace("combination", "trial", 1))
                for p in exc.problems
            ]
            raise InvalidRequest(problems=problems) from exc
        base = resolved.spec
        job = resolved.jobs[0]
        jobs.append(SweepJob(job.spec, job.configuration, job.warnings, dict(point)))
    return base, jobs


def _field(field: str | None) -> str | None:
    if field and field.startswith("grid."):
        return "space." + field.removeprefix("grid.")
    return field


def draw_seed(spec: dict[str, Any]) -> int:
    """The seed every trial runs with (the spec's, else drawn), so that trials differ only in the
    searched values."""
    seed = spec.get("seed")
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else secrets.randbelow(2**31)
