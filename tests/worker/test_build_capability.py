"""A worker decides from the job itself whether its build can run it (issue 35 item 1): a spec field
it lacks that the job uses, or a spec it cannot parse, hands the job back untouched (no attempt
spent, not a resource hand-back) with an event naming the build, and it never claims that job again
while another build takes it; every way a job ends sends its webhook once."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from shared import jobs_repo
from shared.core import build
from shared.core.config import Settings
from shared.core.db import Database, read
from shared.core.tables import ErrorCode, JobEvent, JobStatus, WebhookDelivery, utcnow
from shared.jobspec.capability import OFF_VALUES, is_off, known_fields, read_spec
from shared.jobspec.spec import JobSpec
from shared.webhooks import endpoints
from tests.support.kit import QUICK_JOB
from worker.fleet.runner import Worker

# Fields whose default is a value, not "off", from before the rule below: a build that lacks one of
# them could not tell whether a job uses it. Every field added since defaults to an off value
# (shared/jobspec/capability.py OFF_VALUES), so that a job leaving it off runs on a build from before.
VALUED_DEFAULTS = frozenset(
    {
        "model_name_or_path", "max_length", "per_device_train_batch_size", "per_device_eval_batch_size",
        "learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "num_train_epochs",
        "gradient_accumulation_steps",
        "lr_scheduler_type", "num_warmup_steps", "warmup_ratio", "shuffle_length_groups", "lora_r",
        "lora_alpha", "lora_dropout", "eval_strategy", "save_strategy", "logging_steps",
        "num_processes", "recipe", "max_grad_norm", "adam_epsilon", "optim", "early_stopping_threshold",
        "use_deterministic_algorithms", "do_predict", "with_tracking",
    }
)  # fmt: skip


def test_every_new_spec_field_defaults_to_off() -> None:
    valued = {
        name
        for name, field in JobSpec.model_fields.items()
        if not field.is_required() and not is_off(field.get_default(call_default_factory=True))
    }
    new = sorted(valued - VALUED_DEFAULTS)
    assert not new, (
        f"spec field(s) {new} default to a value, not one of {OFF_VALUES}: a worker built before them "
        "could not tell whether a job uses them; give them an off default"
    )


def test_a_spec_is_read_against_the_build_that_runs_it() -> None:
    full = JobSpec.model_validate(QUICK_JOB).model_dump(mode="json")
    assert read_spec(full).spec == JobSpec.model_validate(QUICK_JOB)
    # A newer build's fields, left off: the job runs here without them.
    verdict = read_spec({**full, "calibrate_logits": None, "sparse_heads": False, "extra_tags": []})
    assert verdict.spec == JobSpec.model_validate(QUICK_JOB) and verdict.refusal is None
    # Used: this build cannot run it, and says which fields.
    verdict = read_spec({**full, "sparse_heads": True, "calibrate_logits": "temperature"})
    assert verdict.spec is None and verdict.missing == ("calibrate_logits", "sparse_heads")
    assert (
        verdict.refusal == "its spec uses calibrate_logits, sparse_heads, which this build does not support"
    )
    # A value a newer build allows for a field this one knows.
    verdict = read_spec({**full, "optim": "adamw_8bit_newer"})
    assert verdict.spec is None and verdict.missing == ()
    assert verdict.refusal is not None and verdict.refusal.startswith(
        "its spec does not parse on this build (optim:"
    )


def _spec(**extra: Any) -> dict[str, Any]:
    return {**JobSpec.model_validate(QUICK_JOB).model_dump(mode="json"), **extra}


def _events(session: Session, job_id: int) -> list[JobEvent]:
    with read(session):
        return list(session.scalars(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)))


def test_a_build_that_cannot_run_a_job_hands_it_back_untouched_and_never_claims_it_again(
    db: Database, settings: Settings
) -> None:
    with db.session() as session:
        needs = jobs_repo.create_job(session, spec=_spec(sparse_heads=True)).id
        runnable = jobs_repo.create_job(session, spec=_spec(sparse_heads=False)).id
    worker = Worker(settings, db, worker_id="old-build")
    started: list[int] = []
    worker.launch = lambda job, devices, log: started.append(job.id)  # type: ignore[assignment,method-assign,return-value]
    try:
        assert worker._claim_and_start()  # claims `needs` first, and hands it back
        with db.session() as session:
            job = jobs_repo.get_job(session, job_id=needs)
            assert (job.status, job.attempts, job.worker_id, job.error, job.started_at) == (
                JobStatus.queued,
                0,
                None,
                None,
                None,
            )
            last = _events(session, needs)[-1]
            assert last.message == (
                f"worker old-build of {build.describe()} cannot run this job: its spec uses sparse_heads, "
                "which this build does not support; handed back untouched, no attempt spent"
            )
            assert last.data is not None and last.data["missing_fields"] == ["sparse_heads"]
            assert last.data["refused_by"] == {"worker_id": "old-build", "build": build.describe()}
            assert jobs_repo.resource_handbacks(session, job_id=needs) == 0
        assert worker.refused == {needs: "its spec uses sparse_heads, which this build does not support"}
        # The next claim skips it and takes the job this build can run.
        assert worker._claim_and_start()
        worker._join_all()
        assert worker.missing_fields == {"sparse_heads"}
        assert not worker._claim_and_start()  # nothing else it may claim
        with db.session() as session:
            assert jobs_repo.get_job(session, job_id=needs).status == JobStatus.queued
            # Another build claims it (attempt 1: the refusal spent none).
            other = jobs_repo.claim_next(session, worker_id="new-build", lease_s=30)
            assert other is not None and (other.id, other.attempts) == (needs, 1)
    finally:
        worker._join_all()
    assert runnable not in worker.refused


def _deliveries(session: Session, job_id: int) -> list[str]:
    with read(session):
        rows = session.scalars(
            select(WebhookDelivery).where(WebhookDelivery.event_key.like(f"job:{job_id}:%"))
        ).all()
    return sorted(row.event_type for row in rows)


def _claimed(session: Session, **spec: Any) -> jobs_repo.Claim:
    job_id = jobs_repo.create_job(session, spec=_spec(**spec), owner="team").id
    job = jobs_repo.claim_next(session, worker_id="w", lease_s=30)
    assert job is not None and job.id == job_id
    return jobs_repo.Claim(job.id, "w", job.attempts)


def test_every_way_a_job_ends_sends_its_webhook_once(db: Database) -> None:
    """issue 35: a job whose spec its worker could not parse failed for good and sent no job.failed."""
    with db.session() as session:
        endpoints.create_endpoint(
            session,
            owner="team",
            url="http://x.org/",
            event_types=["job.failed", "job.succeeded", "job.cancelled"],
        )
        ended: dict[str, tuple[int, str]] = {}

        # The spec failed to parse in the job's process (invalid_data: not retried).
        claim = _claimed(session)
        jobs_repo.fail_job(
            session,
            claim=claim,
            error_code=ErrorCode.invalid_data,
            error="bad spec",
            retry_base_s=0,
            retry_cap_s=0,
        )
        ended["parse failure"] = (claim.job_id, "job.failed")

        # A retryable failure on its last attempt.
        claim = _claimed(session)
        for _ in range(2):
            jobs_repo.fail_job(
                session,
                claim=claim,
                error_code=ErrorCode.worker_lost,
                error="x",
                retry_base_s=0,
                retry_cap_s=0,
            )
            job = jobs_repo.claim_next(session, worker_id="w", lease_s=30)
            assert job is not None
            claim = jobs_repo.Claim(job.id, "w", job.attempts)
        jobs_repo.fail_job(
            session, claim=claim, error_code=ErrorCode.worker_lost, error="x", retry_base_s=0, retry_cap_s=0
        )
        ended["attempts spent"] = (claim.job_id, "job.failed")

        # Lease lost on the last attempt: lease recovery fails it.
        claim = _claimed(session)
        job_id = claim.job_id
        for attempt in range(3):
            later = utcnow() + timedelta(seconds=3600 * (attempt + 1))
            jobs_repo.recover_expired_leases(session, now=later)
            if attempt < 2:
                job = jobs_repo.claim_next(session, worker_id="w", lease_s=30)
                assert job is not None and job.id == job_id
        ended["lease lost"] = (job_id, "job.failed")

        # Resource hand-backs past their bound.
        claim = _claimed(session)
        jobs_repo.hand_back_job(
            session, claim=claim, error_code=ErrorCode.no_space, error="full", max_handbacks=1
        )
        job = jobs_repo.claim_next(session, worker_id="w", lease_s=30)
        assert job is not None and job.id == claim.job_id
        claim = jobs_repo.Claim(job.id, "w", job.attempts)
        jobs_repo.hand_back_job(
            session, claim=claim, error_code=ErrorCode.no_space, error="full", max_handbacks=1
        )
        ended["resource hand-backs"] = (claim.job_id, "job.failed")

        # Cancelled while queued; cancelled while running (its worker stopped it); cancelled while a
        # build that cannot run it held it.
        queued = jobs_repo.create_job(session, spec=_spec(), owner="team").id
        jobs_repo.request_cancel(session, job_id=queued)
        ended["cancel queued"] = (queued, "job.cancelled")
        claim = _claimed(session)
        jobs_repo.request_cancel(session, job_id=claim.job_id)
        jobs_repo.finish_job(session, claim=claim, status=JobStatus.cancelled)
        ended["cancel running"] = (claim.job_id, "job.cancelled")
        claim = _claimed(session, sparse_heads=True)
        jobs_repo.request_cancel(session, job_id=claim.job_id)
        jobs_repo.refuse_job(session, claim=claim, build="old", reason="no sparse_heads")
        ended["cancel while refused"] = (claim.job_id, "job.cancelled")

        claim = _claimed(session)
        jobs_repo.finish_job(session, claim=claim, status=JobStatus.succeeded)
        ended["succeeded"] = (claim.job_id, "job.succeeded")

        # A refusal alone ends nothing, and sends nothing.
        claim = _claimed(session, sparse_heads=True)
        jobs_repo.refuse_job(session, claim=claim, build="old", reason="no sparse_heads")
        ended["refused"] = (claim.job_id, "")

        got = {path: _deliveries(session, job_id) for path, (job_id, _) in ended.items()}
    assert got == {path: [event] if event else [] for path, (_, event) in ended.items()}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_worker_row_names_its_build_and_what_it_supports(db: Database) -> None:
    record = build.build_record(known_fields(), "0014")
    with db.session() as session:
        for worker_id in ("a", "b"):  # one build, one row of it
            jobs_repo.register_worker(
                session, worker_id=worker_id, host="h", pid=1, version=build.version_string(), build=record
            )
        jobs_repo.register_worker(session, worker_id="before", host="h", pid=2, version="0.2.0")
        views = {view.id: view for view in jobs_repo.list_workers(session, lease_s=30)}
    assert views["a"].build == views["b"].build == record
    assert views["a"].version == f"0.2.0+{build.build_hash()}" and views["before"].build is None
    assert "text_column" in record["spec_fields"] and len(build.build_hash()) == 12


def test_a_job_no_running_build_supports_says_what_it_waits_for(db: Database) -> None:
    from shared.scheduling.fair_share import ClaimPolicy
    from shared.scheduling.wait_reasons import waiting_for

    older = build.build_record(known_fields() - {"keep_labels", "text_column"}, "0013")
    older = {**older, "build": "0123456789ab"}
    with db.session() as session:
        jobs_repo.register_worker(
            session,
            worker_id="old",
            host="h",
            pid=1,
            devices=["cpu0"],
            version="0.2.0+0123456789ab",
            build=older,
        )
        uses = jobs_repo.create_job(session, spec=_spec(keep_labels=["x"], text_column="review")).id
        leaves_off = jobs_repo.create_job(session, spec=_spec()).id
        jobs = [jobs_repo.get_job(session, job_id=i) for i in (uses, leaves_off)]
        reasons = waiting_for(session, jobs, ClaimPolicy())
    assert reasons == {
        uses: {
            "reason": "build",
            "message": "uses keep_labels, text_column, which no running worker's build supports: it waits "
            "for a worker of a build that does (upgrade the workers)",
        }
    }
    # A worker of a build that supports them: nothing to wait for but the queue.
    with db.session() as session:
        jobs_repo.register_worker(
            session,
            worker_id="new",
            host="h",
            pid=2,
            devices=["cpu0"],
            version=build.version_string(),
            build=build.build_record(known_fields(), "0014"),
        )
        jobs = [jobs_repo.get_job(session, job_id=i) for i in (uses, leaves_off)]
        assert waiting_for(session, jobs, ClaimPolicy()) == {}
