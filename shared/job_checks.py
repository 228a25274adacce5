"""The one check every job spec goes through before a job is created or planned.

POST /v1/jobs, its dry run, each combination of a sweep and a rerun all call `check_job_spec`, so a
rule added here holds for every way a job comes to exist: a check in one route and not another
would be a hole (a sweep once skipped GLUEJOBS_TRACKERS and wrote mlflow.db into a worker's
working directory).
"""

from __future__ import annotations

from shared.config import Settings
from shared.data_checks import check_job_data
from shared.data_scope import DataScope
from shared.spec import JobSpec, check_paths, check_trackers


def check_job_spec(spec: JobSpec, settings: Settings, *, scope: DataScope, read_data: bool = True) -> JobSpec:
    """The spec as it will be stored: data files resolved in the caller's data folder (`scope`),
    model folders in GLUEJOBS_MODELS_DIR, trackers among those the workers serve; then, unless
    GLUEJOBS_CHECK_DATA_ON_SUBMIT is off, its data read and checked as a worker will read it.

    `read_data=False` is for the dry run, whose plan reads and checks the data itself (with the same
    checks, shared/data_checks.read_and_check) because it also measures it. InvalidSpec naming the
    field when anything is refused.
    """
    checked = check_trackers(check_paths(spec, settings, scope=scope), settings)
    if read_data and settings.check_data_on_submit:
        check_job_data(checked, settings, scope=scope)
    return checked
