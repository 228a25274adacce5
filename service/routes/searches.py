"""/v1/searches: hyperparameter searches whose trials are ordinary jobs (shared/searches)."""

from __future__ import annotations

import secrets
import statistics
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response, status

from service.deps import After, DataScopeDep, PrincipalDep, SearchDep, SessionDep, SettingsDep
from service.schemas.common import ErrorResponse, Page
from service.schemas.searches import (
    SearchBest,
    SearchCreate,
    SearchPublic,
    SearchSavings,
    SearchSeeds,
    SearchTrialPublic,
    SeedsCreate,
)
from shared import jobs_repo
from shared.admission.job_checks import check_priority
from shared.core.errors import Conflict
from shared.core.tables import Job, Search, SearchStatus, SearchTrial, utcnow
from shared.research.sweep_stats import sweep_status
from shared.research.sweeps import resolve_sweep
from shared.scheduling.quotas import QuotaDefaults
from shared.searches import store
from shared.searches.config import dump
from shared.searches.optimizer import Optimizer, best_value
from shared.searches.specs import check_space, corners, draw_seed, resolve_objective, resolve_trials

router = APIRouter(prefix="/searches", tags=["searches"])

TRIAL_STATES = ("running", "complete", "pruned", "failed")


def search_public(
    search: Search,
    trials: list[SearchTrial],
    jobs: dict[int, Job],
    *,
    detail: bool = False,
    seeds: SearchSeeds | None = None,
    savings: SearchSavings | None = None,
) -> SearchPublic:
    best = next((t for t in trials if t.number == search.best_trial), None)
    counts = {state: sum(1 for t in trials if t.state == state) for state in TRIAL_STATES}
    return SearchPublic(
        id=search.id,
        status=search.status,
        spec=search.spec,
        space=search.space,
        objective=search.objective,
        n_trials=search.n_trials,
        parallelism=search.parallelism,
        sampler=search.sampler,
        pruner=search.pruner,
        sampler_seed=search.seed,
        metadata=search.metadata_,
        created_at=search.created_at,
        finished_at=search.finished_at,
        cancel_requested_at=search.cancel_requested_at,
        note=search.note,
        trial_counts=counts,
        job_ids=[t.job_id for t in trials if t.job_id is not None],
        best=(
            SearchBest(number=best.number, job_id=best.job_id, params=best.params, value=best.value)
            if best is not None and best.value is not None
            else None
        ),
        trials=[trial_public(t, jobs.get(t.job_id) if t.job_id else None) for t in trials]
        if detail
        else None,
        seeds=seeds,
        savings=savings,
    )


def pruning_savings(
    trials: list[SearchTrial], jobs: dict[int, Job], planned: dict[int, int]
) -> SearchSavings:
    """The optimizer steps the search's complete and pruned trials planned and ran. A trial's plan is
    what its training loop announced, else its spec's max_train_steps; what a pruned one ran is the
    furthest step it reported (its worker stops it a little after the pruner's evaluation)."""
    counted = pruned = unknown = steps_planned = steps_run = 0
    for trial in trials:
        if trial.state not in ("complete", "pruned"):
            continue
        job = jobs.get(trial.job_id) if trial.job_id is not None else None
        plan = planned.get(job.id) if job is not None else None
        if job is not None and plan is None:
            plan = job.spec.get("max_train_steps") or None
        if job is None or not isinstance(plan, int):
            unknown += 1
            continue
        reported = [
            (job.result or {}).get("completed_steps"),
            ((job.latest_metrics or {}).get("train") or {}).get("step"),
            (trial.pruned or {}).get("step"),
        ]
        ran = max((r for r in reported if isinstance(r, int)), default=plan)
        counted += 1
        pruned += trial.state == "pruned"
        steps_planned += plan
        steps_run += min(ran, plan) if trial.state == "pruned" else plan
    saved = steps_planned - steps_run
    return SearchSavings(
        pruned_trials=pruned,
        steps_planned=steps_planned,
        steps_run=steps_run,
        steps_saved=saved,
        saved_share=round(saved / steps_planned, 4) if steps_planned else None,
        trials_unknown=unknown,
    )


def trial_public(trial: SearchTrial, job: Job | None) -> SearchTrialPublic:
    return SearchTrialPublic(
        number=trial.number,
        job_id=trial.job_id,
        job_status=job.status if job is not None else None,
        state=trial.state,
        params=trial.params,
        value=trial.value,
        intermediate=trial.intermediate,
        pruned=trial.pruned,
        created_at=trial.created_at,
        finished_at=trial.finished_at,
    )


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=SearchPublic,
    responses={429: {"model": ErrorResponse, "description": "The owner's queue is full"}},
)
def create_search(
    body: SearchCreate,
    session: SessionDep,
    settings: SettingsDep,
    principal: PrincipalDep,
    scope: DataScopeDep,
) -> SearchPublic:
    """Start a search: its first `parallelism` trials are queued at once as ordinary jobs, the rest as
    trials end (the API's search driver asks the sampler for them); the pruner stops trials whose
    evaluations fall behind by the cancel path (status cancelled, error_code `pruned`).

    The spec is checked with every end of every range and every choice, as POST /v1/jobs checks a
    job: one that cannot run refuses the search with 422 naming `space.<name>` or `spec.<name>`, and
    nothing is stored. Every trial runs with one seed (the spec's, else drawn)."""
    check_priority(body.priority, settings, is_admin=principal.is_admin)
    check_space(body.spec, body.space)
    objective = resolve_objective(body.spec, body.objective)
    sampler_seed = body.sampler.seed if body.sampler.seed is not None else secrets.randbelow(2**31)
    optimizer = Optimizer(
        space=body.space,
        direction=objective.direction,
        sampler=dump(body.sampler),
        pruner=dump(body.pruner),
        seed=sampler_seed,
        trials=[],
    )
    first = [optimizer.ask() for _ in range(min(body.parallelism, body.n_trials))]
    checked = corners(body.space)
    _, jobs = resolve_trials(
        body.spec, checked + [params for _, params in first], draw_seed(body.spec), settings, scope=scope
    )
    search, trials = store.create_search(
        session,
        search=Search(
            owner=principal.owner,
            status=SearchStatus.running,
            spec={k: v for k, v in jobs[0].spec.items() if k not in body.space},
            space={name: dump(parameter) for name, parameter in body.space.items()},
            objective={"metric": objective.metric, "direction": objective.direction},
            n_trials=body.n_trials,
            parallelism=body.parallelism,
            sampler=dump(body.sampler),
            pruner=dump(body.pruner),
            seed=sampler_seed,
            priority=body.priority,
            max_attempts=body.max_attempts,
            metadata_=body.metadata,
            created_at=utcnow(),
        ),
        trials=[
            store.NewTrial(number, params, job)
            for (number, params), job in zip(first, jobs[len(checked) :], strict=True)
        ],
        actor=principal.actor,
        quotas=QuotaDefaults.from_settings(settings),
    )
    return search_public(search, trials, {}, detail=True)


@router.get("", response_model=Page[SearchPublic])
def read_searches(
    session: SessionDep,
    principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=100, description="Page size")] = 20,
    after: After = None,
) -> dict[str, Any]:
    """Searches, newest first, in cursor pages (with their best trial, without the trials table)."""
    searches, has_more = store.list_searches(session, after=after, limit=limit, owner=principal.owner_filter)
    trials = store.list_trials(session, search_ids=[s.id for s in searches])
    return {
        "data": [search_public(s, [t for t in trials if t.search_id == s.id], {}) for s in searches],
        "has_more": has_more,
        "next_cursor": str(searches[-1].id) if has_more and searches else None,
    }


@router.get("/{search_id}", response_model=SearchPublic)
def read_search(search: SearchDep, session: SessionDep) -> SearchPublic:
    """The search: its best trial (parameters and value), and the trials table (state, parameters,
    the objective at each evaluation, the final value, where a pruned one was stopped)."""
    return _full(session, search)


def _full(session: SessionDep, search: Search) -> SearchPublic:
    trials = store.list_trials(session, search_ids=[search.id])
    job_ids = [t.job_id for t in trials if t.job_id is not None]
    jobs = store.list_jobs(session, job_ids=job_ids)
    savings = pruning_savings(trials, jobs, store.planned_steps(session, job_ids=job_ids))
    return search_public(search, trials, jobs, detail=True, seeds=_seeds(session, search), savings=savings)


def _seeds(session: SessionDep, search: Search) -> SearchSeeds | None:
    if search.seeds_sweep_id is None:
        return None
    sweep = jobs_repo.get_sweep(session, sweep_id=search.seeds_sweep_id)
    jobs = jobs_repo.list_sweep_jobs(session, sweep_ids=[sweep.id])
    metric, direction = search.objective["metric"], search.objective["direction"]
    rows = store.objective_rows(session, job_ids=[j.id for j in jobs], metric=metric)
    values = [
        best_value([r.value for r in rows[j.id]], direction)
        if j.status == "succeeded" and rows.get(j.id)
        else None
        for j in jobs
    ]
    done = [v for v in values if v is not None]
    return SearchSeeds(
        sweep_id=sweep.id,
        seeds=sweep.seeds,
        status=sweep_status([j.status for j in jobs], cancel_requested=sweep.cancel_requested_at is not None),
        job_ids=[j.id for j in jobs],
        values=values,
        median=statistics.median(done) if done else None,
    )


@router.post(
    "/{search_id}/cancel",
    response_model=SearchPublic,
    responses={
        202: {"model": SearchPublic, "description": "Some trials were running: their workers will stop them"},
        409: {"model": ErrorResponse, "description": "The search has already finished"},
    },
)
def cancel_search(
    search: SearchDep, session: SessionDep, principal: PrincipalDep, response: Response
) -> SearchPublic:
    """No more trials; the unfinished ones are cancelled as jobs are (queued at once, running ones by
    their workers). The search is cancelled once they have stopped. 409 when it had finished."""
    store.cancel_search(session, search_id=search.id, owner=principal.owner_filter, actor=principal.actor)
    public = _full(session, store.get_search(session, search_id=search.id))
    if any(t.job_status == "cancelling" for t in public.trials or []):
        response.status_code = status.HTTP_202_ACCEPTED
    return public


@router.post(
    "/{search_id}/seeds",
    status_code=status.HTTP_201_CREATED,
    response_model=SearchPublic,
    responses={
        409: {"model": ErrorResponse, "description": "No trial has completed yet, or the seeds already ran"},
        429: {"model": ErrorResponse, "description": "The owner's queue is full"},
    },
)
def rerun_best_over_seeds(
    body: SeedsCreate,
    search: SearchDep,
    session: SessionDep,
    settings: SettingsDep,
    principal: PrincipalDep,
    scope: DataScopeDep,
) -> SearchPublic:
    """Re-run the best trial's configuration once per seed, as a sweep (POST /v1/sweeps's checks and
    statistics); GET then reports each seed's value and their median under `seeds`."""
    if search.seeds_sweep_id is not None:
        raise Conflict(f"search {search.id} already re-ran its best trial (sweep {search.seeds_sweep_id})")
    trials = store.list_trials(session, search_ids=[search.id])
    best = next((t for t in trials if t.number == search.best_trial), None)
    job = jobs_repo.find_job(session, job_id=best.job_id) if best and best.job_id else None
    if job is None:
        raise Conflict(f"search {search.id} has no completed trial to re-run yet")
    spec = {k: v for k, v in job.spec.items() if k != "seed"}
    resolved = resolve_sweep(spec, body.seeds, {}, settings, scope=scope)
    sweep, _ = jobs_repo.create_sweep(
        session,
        spec=resolved.spec,
        seeds=resolved.seeds,
        grid={},
        jobs=resolved.jobs,
        priority=search.priority,
        metadata={**search.metadata_, "search_id": str(search.id)},
        max_attempts=search.max_attempts,
        owner=principal.owner if search.owner is None else search.owner,
        actor=principal.actor,
        quotas=QuotaDefaults.from_settings(settings),
    )
    store.link_seed_sweep(session, search_id=search.id, sweep_id=sweep.id)
    return _full(session, store.get_search(session, search_id=search.id))
