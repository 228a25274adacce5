"""Prometheus metrics, computed from the database at scrape time.

Every figure is read from the tables when Prometheus scrapes, never counted in the process: with
several API processes (or replicas) behind one address each scrape still sees the whole fleet, and
a restart loses nothing. A scrape is a handful of aggregate queries over the jobs and workers
tables, plus two indexed rows per running job for its throughput; it never scans metric rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry
from sqlalchemy import ColumnElement, Float, case, func, select, true
from sqlalchemy.orm import Session

from shared.core.db import Database, read
from shared.core.tables import Job, JobMetric, JobStatus, Worker, WorkerState, utcnow
from shared.jobspec.tasks import LOSS_METRIC, TRAIN_SPLIT

PREFIX = "gluejobs"
JOB_DURATION_BUCKETS_S = (10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400)
EPOCH_DURATION_BUCKETS_S = (1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400)


def registry_for(
    db: Database, *, lease_s: float, per_job: bool, owner: str | None = None
) -> CollectorRegistry:
    """A registry of its own (not the process-wide default), holding only the database collector.

    `per_job`: series labelled with job ids (for admins, who may see every job). `owner`: only that
    owner's jobs are counted, and the workers (the fleet) not at all: what a key that is not an
    admin's sees, so that it learns nothing of other owners' jobs.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(db, lease_s=lease_s, per_job=per_job, owner=owner))
    return registry


class DatabaseCollector(Collector):
    def __init__(self, db: Database, *, lease_s: float, per_job: bool, owner: str | None = None) -> None:
        self.db = db
        self.lease_s = lease_s
        self.per_job = per_job
        self.owner = owner
        # Every query of jobs goes through this: all jobs, or the one owner's.
        self.mine: ColumnElement[bool] = true() if owner is None else Job.owner == owner

    def describe(self) -> list[Metric]:
        return []  # nothing to check at registration; collect() queries the database

    def collect(self) -> Iterator[Metric]:
        now = utcnow()
        with self.db.session() as session, read(session):
            yield from self._jobs(session, now)
            yield from self._durations(session)
            if self.owner is None:  # the fleet is the admins' to see
                yield from self._workers(session, now)
            yield from self._throughput(session)

    # --- jobs -----------------------------------------------------------------------------------

    def _jobs(self, session: Session, now: datetime) -> Iterator[Metric]:
        by_status = dict(
            session.execute(select(Job.status, func.count()).where(self.mine).group_by(Job.status)).all()
        )
        jobs = GaugeMetricFamily(f"{PREFIX}_jobs", "Jobs by status", labels=["status"])
        for status in JobStatus:
            jobs.add_metric([status.value], by_status.get(status, 0))
        yield jobs

        oldest, claims = session.execute(
            select(
                func.min(case((Job.status == JobStatus.queued, Job.created_at))),
                func.coalesce(func.sum(Job.attempts), 0),
            ).where(self.mine)
        ).one()
        yield GaugeMetricFamily(
            f"{PREFIX}_queue_depth", "Jobs waiting for a worker", value=by_status.get(JobStatus.queued, 0)
        )
        age = (now - _utc(oldest)).total_seconds() if oldest is not None else 0.0
        yield GaugeMetricFamily(
            f"{PREFIX}_queue_oldest_age_seconds", "How long the oldest queued job has waited", value=age
        )
        yield CounterMetricFamily(
            f"{PREFIX}_job_claims",
            "Attempts workers have started (claims; one handed back at a worker's shutdown is not counted)",
            value=claims,
        )

        failures = CounterMetricFamily(
            f"{PREFIX}_job_failures", "Failed jobs by error code", labels=["error_code"]
        )
        rows = session.execute(
            select(Job.error_code, func.count())
            .where(Job.status == JobStatus.failed, self.mine)
            .group_by(Job.error_code)
        ).all()
        for code, count in rows:
            failures.add_metric([code or "unknown"], count)
        yield failures

    def _durations(self, session: Session) -> Iterator[Metric]:
        job_seconds = _seconds_between(session, Job.started_at, Job.finished_at)
        finished = Job.status.in_([JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled])
        histogram = HistogramMetricFamily(
            f"{PREFIX}_job_duration_seconds",
            "Finished jobs, from their first claim to their end, by final status",
            labels=["status"],
        )
        rows = session.execute(
            select(Job.status, *_bucket_columns(job_seconds, JOB_DURATION_BUCKETS_S))
            .where(finished, Job.started_at.is_not(None), Job.finished_at.is_not(None), self.mine)
            .group_by(Job.status)
        ).all()
        for status, *figures in rows:
            buckets, total = _buckets(JOB_DURATION_BUCKETS_S, figures)
            histogram.add_metric([status.value], buckets, total)
        yield histogram

        # An epoch's training time, from what each finished run reports (train_runtime_s / epochs).
        runtime = Job.result["train_runtime_s"].as_float()
        epochs = Job.result["epochs"].as_float()
        per_epoch = runtime / func.nullif(epochs, 0.0)
        epoch_figures = session.execute(
            select(*_bucket_columns(per_epoch, EPOCH_DURATION_BUCKETS_S)).where(
                Job.status == JobStatus.succeeded, runtime.is_not(None), epochs > 0, self.mine
            )
        ).one()
        buckets, total = _buckets(EPOCH_DURATION_BUCKETS_S, list(epoch_figures))
        epochs_family = HistogramMetricFamily(
            f"{PREFIX}_epoch_duration_seconds",
            "Training time per epoch of succeeded jobs (evaluation excluded)",
        )
        epochs_family.add_metric([], buckets, total)
        yield epochs_family

    # --- workers ----------------------------------------------------------------------------------

    def _workers(self, session: Session, now: datetime) -> Iterator[Metric]:
        stopped = session.scalar(
            select(func.count()).select_from(Worker).where(Worker.state == WorkerState.stopped)
        )
        live = session.execute(
            select(Worker.id, Worker.host, Worker.state, Worker.last_heartbeat_at).where(
                Worker.state != WorkerState.stopped
            )
        ).all()
        counts = {state.value: 0 for state in WorkerState} | {
            "gone": 0,
            WorkerState.stopped.value: stopped or 0,
        }
        ages = GaugeMetricFamily(
            f"{PREFIX}_worker_heartbeat_age_seconds",
            "Seconds since each worker that has not stopped last renewed a lease",
            labels=["worker", "host", "state"],
        )
        for worker_id, host, state, heartbeat in live:
            age = (now - _utc(heartbeat)).total_seconds()
            # A worker that stopped heartbeating without saying goodbye is "gone": derived, never stored.
            state = "gone" if age > self.lease_s else state
            counts[state] = counts.get(state, 0) + 1
            ages.add_metric([worker_id, host, state], age)
        workers = GaugeMetricFamily(f"{PREFIX}_workers", "Workers by state", labels=["state"])
        for state, count in counts.items():
            workers.add_metric([state], count)
        yield workers
        yield ages

    # --- throughput of running jobs -----------------------------------------------------------------

    def _throughput(self, session: Session) -> Iterator[Metric]:
        name = f"{PREFIX}_job_train_samples_per_second"
        running = session.execute(
            select(Job.id, Job.spec, Job.num_processes).where(Job.status == JobStatus.running, self.mine)
        ).all()
        rates = {
            job_id: _samples_per_second(session, job_id, spec, processes)
            for job_id, spec, processes in running
        }
        if not self.per_job:
            yield GaugeMetricFamily(
                name,
                "Training samples per second of the running jobs together, each over its two newest loss "
                "rows (per job, labelled with its id, for admin keys)",
                value=sum(rate for rate in rates.values() if rate is not None),
            )
            return
        family = GaugeMetricFamily(
            name,
            "Training samples per second of each running job, over its two newest loss rows",
            labels=["job"],
        )
        for job_id, rate in rates.items():
            if rate is not None:
                family.add_metric([str(job_id)], rate)
        yield family


def _samples_per_second(session: Session, job_id: int, spec: dict[str, Any], processes: int) -> float | None:
    """Optimizer steps between the job's two newest training-loss rows, times the samples a step
    takes, over the time between them. The rows come from the (job_id, id) index, newest first."""
    rows = session.execute(
        select(JobMetric.step, JobMetric.created_at)
        .where(JobMetric.job_id == job_id, JobMetric.split == TRAIN_SPLIT, JobMetric.name == LOSS_METRIC)
        .order_by(JobMetric.id.desc())
        .limit(2)
    ).all()
    if len(rows) < 2:
        return None
    (step, at), (previous_step, previous_at) = rows
    seconds = (at - previous_at).total_seconds()
    if seconds <= 0 or step <= previous_step:
        return None
    samples_per_step = (
        int(spec.get("per_device_train_batch_size") or 8)
        * int(spec.get("gradient_accumulation_steps") or 1)
        * max(processes, 1)
    )
    return (step - previous_step) * samples_per_step / seconds


def _seconds_between(session: Session, start: Any, end: Any) -> ColumnElement[Any]:
    if session.get_bind().dialect.name == "postgresql":
        return func.extract("epoch", end - start)
    # SQLite stores UTC timestamps as text; julianday() reads them (in days).
    return (func.julianday(end) - func.julianday(start)) * 86400.0


def _bucket_columns(value: ColumnElement[Any], bounds: Sequence[float]) -> list[ColumnElement[Any]]:
    """One aggregate row: the cumulative count under each bound, the count, the sum."""
    columns: list[ColumnElement[Any]] = [
        func.coalesce(func.sum(case((value <= b, 1), else_=0)), 0) for b in bounds
    ]
    columns.append(func.count(value))
    columns.append(func.coalesce(func.sum(value.cast(Float)), 0.0))
    return columns


def _buckets(bounds: Sequence[float], figures: Sequence[Any]) -> tuple[list[tuple[str, float]], float]:
    *cumulative, count, total = figures
    buckets = [(str(float(b)), float(n)) for b, n in zip(bounds, cumulative, strict=True)]
    buckets.append(("+Inf", float(count)))
    return buckets, float(total)


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=utcnow().tzinfo)
