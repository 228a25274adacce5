"""The job's life as one table (shared/core/lifecycle.py, issue 36 item 1): every (from, to) pair of
statuses is tried against it, purely and through transition() on both databases, where a move not
in it is refused with nothing written; finish_job records outcomes only; the users' lifecycle table
in docs/users/http-api.md lists exactly the code's moves."""

from __future__ import annotations

import itertools
import re

import pytest
from sqlalchemy import func, select, update

from shared import jobs_repo
from shared.core.db import Database, write
from shared.core.lifecycle import NEW, TRANSITIONS, IllegalTransition, Source, allowed, check_move
from shared.core.tables import TERMINAL_STATUSES, Job, JobEvent, JobStatus
from shared.jobs_repo.events import transition
from tests.support import kit
from tests.support.dbutil import claimed

SOURCES: list[Source] = [NEW, *JobStatus]
PAIRS = list(itertools.product(SOURCES, JobStatus))


def test_the_table_covers_every_status_and_only_finished_ones_are_dead_ends() -> None:
    assert set(TRANSITIONS) == set(SOURCES)
    assert {status for status in JobStatus if not TRANSITIONS[status]} == TERMINAL_STATUSES
    reachable = {to for moves in TRANSITIONS.values() for to in moves}
    assert reachable == set(JobStatus)
    assert all(why.strip() for moves in TRANSITIONS.values() for why in moves.values())


@pytest.mark.parametrize(("before", "to"), PAIRS, ids=[f"{b}->{t}" for b, t in PAIRS])
def test_check_move_allows_exactly_the_tables_moves(before: Source, to: JobStatus) -> None:
    if to in TRANSITIONS[before]:
        check_move(7, before, to)
        return
    with pytest.raises(IllegalTransition) as refused:
        check_move(7, before, to)
    assert refused.value.message.startswith(f"job 7 cannot move from {before} to {to}")


def test_the_moves_the_issue_names_are_in_the_table() -> None:
    # The claim, the cancel paths, lease loss and hand-backs (back to the queue), and a job that
    # finishes while being stopped.
    named: list[tuple[Source, JobStatus]] = [
        (NEW, JobStatus.queued),
        (JobStatus.queued, JobStatus.running),
        (JobStatus.queued, JobStatus.cancelled),
        (JobStatus.running, JobStatus.cancelling),
        (JobStatus.running, JobStatus.queued),
        (JobStatus.cancelling, JobStatus.cancelled),
        (JobStatus.cancelling, JobStatus.succeeded),
    ]
    for before, to in named:
        assert allowed(before, to), (before, to)
    assert not allowed(JobStatus.cancelling, JobStatus.queued)  # a cancel wins over a retry
    assert not allowed(JobStatus.succeeded, JobStatus.queued)  # a rerun is a new job


def _events(db: Database, job_id: int) -> int:
    with db.engine.connect() as connection:
        query = select(func.count()).select_from(JobEvent).where(JobEvent.job_id == job_id)
        return int(connection.scalar(query) or 0)


def _status(db: Database, job_id: int) -> JobStatus:
    with db.engine.connect() as connection:
        return JobStatus(connection.execute(select(Job.status).where(Job.id == job_id)).scalar_one())


def test_transition_refuses_every_pair_not_in_the_table_with_nothing_written(db: Database) -> None:
    with db.session() as session:
        job_id = jobs_repo.create_job(session, spec=kit.SPEC).id
    outcomes: dict[tuple[JobStatus, JobStatus], bool] = {}
    for before, to in itertools.product(JobStatus, JobStatus):
        with db.engine.begin() as connection:
            connection.execute(update(Job).where(Job.id == job_id).values(status=before))
        events = _events(db, job_id)
        try:
            with db.session() as session, write(session):
                job = session.get_one(Job, job_id, with_for_update=True)
                transition(session, job, to, "a move under test")
            outcomes[(before, to)] = True
        except IllegalTransition:
            outcomes[(before, to)] = False
        if outcomes[(before, to)]:
            assert (_status(db, job_id), _events(db, job_id)) == (to, events + 1), (before, to)
        else:
            assert (_status(db, job_id), _events(db, job_id)) == (before, events), (before, to)
    assert outcomes == {(b, t): allowed(b, t) for b, t in itertools.product(JobStatus, JobStatus)}


def test_finish_job_records_outcomes_only_and_a_cancel_wins_over_a_failure(db: Database) -> None:
    with db.session() as session:
        job_id = jobs_repo.create_job(session, spec=kit.SPEC).id
        claim = claimed(session, job_id)
    events = _events(db, job_id)
    with db.session() as session, pytest.raises(IllegalTransition, match="queued is not an outcome"):
        jobs_repo.finish_job(session, claim=claim, status=JobStatus.queued)
    with db.session() as session:
        jobs_repo.request_cancel(session, job_id=job_id)
    with db.session() as session, pytest.raises(IllegalTransition, match="from cancelling to failed"):
        jobs_repo.finish_job(session, claim=claim, status=JobStatus.failed, error="boom")
    with db.engine.connect() as connection:
        row = connection.execute(select(Job.status, Job.error).where(Job.id == job_id)).one()
    assert tuple(row) == (JobStatus.cancelling, None)
    assert _events(db, job_id) == events + 1  # the cancel request's, no other
    with db.session() as session:  # what the worker records when the training ended anyway
        assert jobs_repo.finish_job(session, claim=claim, status=JobStatus.succeeded)
    assert _status(db, job_id) == JobStatus.succeeded


def _docs_moves() -> set[tuple[str, str]]:
    """The (from, to) rows of the table under "## Job lifecycle" in docs/users/http-api.md."""
    page = (kit.REPO / "docs" / "users" / "http-api.md").read_text()
    section = page.split("## Job lifecycle", 1)[1].split("\n## ", 1)[0]
    moves = set()
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) >= 3 and not set(cells[0]) <= set("-: ") and cells[0] != "From":
            names = [re.findall(r"`(\w+)`", cell) for cell in cells[:2]]
            assert all(len(found) == 1 for found in names), line
            moves.add((names[0][0], names[1][0]))
    return moves


def test_the_docs_lifecycle_table_lists_exactly_the_codes_moves() -> None:
    code = {(str(before), str(to)) for before, moves in TRANSITIONS.items() for to in moves}
    docs = _docs_moves()
    assert docs - code == set(), "moves docs/users/http-api.md lists that the code does not have"
    assert code - docs == set(), "moves of shared/core/lifecycle.py missing from docs/users/http-api.md"
