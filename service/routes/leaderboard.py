"""/v1/leaderboard: finished jobs and sweeps ranked by their task's main metric, next to the
majority-class baseline."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from service.deps import PrincipalDep, SessionDep, SettingsDep
from service.research.baselines import NEAR_CHANCE_MARGIN, Baseline, majority_baseline
from service.research.leaderboard import build_leaderboard, is_ranked_job
from service.schemas.leaderboard import Leaderboard
from shared import jobs_repo
from shared.core.errors import InvalidRequest
from shared.core.tables import Job, JobMetric, JobStatus
from shared.jobspec.spec import JobSpec, TaskName
from shared.jobspec.suggest import did_you_mean
from shared.jobspec.tasks import TASKS
from shared.research.sweep_stats import sweep_results

router = APIRouter(prefix="/leaderboard", tags=["leaderboard"])


@router.get("", response_model=Leaderboard)
def read_leaderboard(
    session: SessionDep,
    settings: SettingsDep,
    principal: PrincipalDep,
    task: Annotated[
        TaskName | None, Query(description="One GLUE task (rte, sst2 …); every task when absent")
    ] = None,
) -> dict[str, Any]:
    """Per task: succeeded jobs and sweeps, best first by the task's main metric (a sweep by the median
    over seeds of its winning configuration), each with its majority-class baseline and near_chance."""
    if task is not None:
        task = task.strip().lower().replace("-", "")
        if task not in TASKS:
            hint = did_you_mean(task, TASKS)
            raise InvalidRequest(
                f"unknown task {task!r}{hint} (GLUE's tasks: {', '.join(TASKS)})", field="task"
            )
    finished = jobs_repo.list_finished_jobs(session, task_name=task, owner=principal.owner_filter)
    sweep_ids = sorted({job.sweep_id for job in finished if job.sweep_id is not None})
    members: dict[int, list[Job]] = {}
    for job in jobs_repo.list_sweep_jobs(session, sweep_ids=sweep_ids):
        members.setdefault(job.sweep_id or 0, []).append(job)
    rows = jobs_repo.list_eval_metrics(
        session, job_ids=[j.id for jobs in members.values() for j in jobs if j.status == JobStatus.succeeded]
    )
    sweep_of = {job.id: sweep_id for sweep_id, jobs in members.items() for job in jobs}
    rows_by_sweep: dict[int, list[JobMetric]] = {}
    for row in rows:
        rows_by_sweep.setdefault(sweep_of[row.job_id], []).append(row)
    sweeps = [
        (sweep, members[sweep.id], sweep_results(sweep, members[sweep.id], rows_by_sweep.get(sweep.id, [])))
        for sweep in jobs_repo.get_sweeps(session, sweep_ids=sweep_ids)
    ]

    def baseline_of(spec: dict[str, Any]) -> Baseline | None:
        try:
            return majority_baseline(JobSpec.model_validate(spec), settings)
        except ValueError:  # a stored spec this version no longer accepts: no baseline, no failure
            return None

    def task_baseline(name: str) -> Baseline | None:
        return majority_baseline(JobSpec(model_name_or_path="-", task_name=name), settings)

    boards = build_leaderboard(
        [job for job in finished if is_ranked_job(job)],
        sweeps,
        baseline_of=baseline_of,
        task_baseline=task_baseline,
        only_task=task,
    )
    return {"data": boards, "near_chance_margin": NEAR_CHANCE_MARGIN}
