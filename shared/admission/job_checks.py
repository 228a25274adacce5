"""The one check every job spec goes through before a job is created or planned.

POST /v1/jobs, its dry run, each combination of a sweep and a rerun all call `check_job_spec`, so a
rule added here holds for every way a job comes to exist: a check in one route and not another
would be a hole (a sweep once skipped GLUEJOBS_TRACKERS and wrote mlflow.db into a worker's
working directory).

Every check runs whatever the others found (each data file, the model, the trackers), and a refusal
carries every problem (shared.core.errors.Problem), the spec's first and the data's after them; a refusal
of one problem is raised as it was found (a file id that is not the caller's stays a 404).

What passes but deserves a word (a model the API could not check, a label that looks like a typo of
another, an option that another overrides) goes into the caller's `warnings`, which the job keeps and
the API returns: nothing the user gave is changed or ignored without saying so.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from shared.admission.data_checks import check_job_data, data_problems, too_large_to_check, too_large_words
from shared.admission.model_check import check_model
from shared.core.config import Settings
from shared.core.errors import GluejobsError, InvalidRequest, InvalidSpec, NotFound, Problem
from shared.data.reading import SPEC_FILE_FIELDS
from shared.jobspec.data_scope import DataScope
from shared.jobspec.metric_rules import greater_is_better
from shared.jobspec.registered_models import reference
from shared.jobspec.spec import JobSpec, check_paths, check_trackers


def check_job_spec(
    spec: JobSpec,
    settings: Settings,
    *,
    scope: DataScope,
    read_data: bool = True,
    warnings: list[str] | None = None,
) -> JobSpec:
    """The spec as it will be stored: data files resolved in the caller's data folder (`scope`),
    model folders in GLUEJOBS_MODELS_DIR, the model found (shared/admission/model_check.py), trackers among
    those the workers serve; then, unless GLUEJOBS_CHECK_DATA_ON_SUBMIT is off, its data read and
    checked as a worker will read it.

    `read_data=False` is for the dry run, whose plan reads and checks the data itself (with the same
    checks, shared/admission/data_checks.read_and_check) because it also measures it. InvalidSpec naming the
    field when anything is refused; what passes with a word of warning is appended to `warnings`.
    """
    notes: list[str] = []
    found: list[GluejobsError] = []
    checked = _checked_paths(spec, settings, scope=scope, problems=found)
    if not any(_field(exc) == "model_name_or_path" for exc in found):
        _collect(
            found,
            lambda: check_model(
                checked.model_name_or_path,
                settings,
                notes,
                registered=checked.registered_model,
                is_own_model=_own_model(scope),
            ),
        )
    notes += spec_warnings(spec)
    if read_data and settings.check_data_on_submit:
        large = too_large_to_check(_readable(checked, found), settings)
        if large:  # bounded memory in the API: the worker reads and checks it when the job starts
            notes.append(f"not checked at submission: {too_large_words(large, settings)}")
        elif found:  # the other files are still read, so that one answer names every problem
            failed = {_field(exc) for exc in found}
            found += _as_errors(data_problems(checked, settings, scope=scope, skip=failed))
        else:
            _collect(found, lambda: notes.extend(check_job_data(checked, settings, scope=scope).warnings))
    elif found and not read_data and not too_large_to_check(_readable(checked, found), settings):
        # A dry run refused before its plan reads the data: the data's problems in the same answer.
        failed = {_field(exc) for exc in found}
        found += _as_errors(data_problems(checked, settings, scope=scope, skip=failed))
    if found:
        raise refusal(found)
    if warnings is not None:
        warnings += notes
    return checked


def spec_problems(
    spec: JobSpec, settings: Settings, *, scope: DataScope, skip: Collection[str], read_data: bool
) -> list[Problem]:
    """Every problem `check_job_spec` finds in a spec that was salvaged from a refused one (the
    refused fields, `skip`, left out: they are neither checked nor read), located in the spec. The
    data is read when `read_data` (GLUEJOBS_CHECK_DATA_ON_SUBMIT, or a dry run)."""
    found: list[GluejobsError] = []
    checked = _checked_paths(spec, settings, scope=scope, problems=found)
    if "model_name_or_path" not in skip and not any(_field(e) == "model_name_or_path" for e in found):
        _collect(
            found,
            lambda: check_model(
                checked.model_name_or_path,
                settings,
                [],
                registered=checked.registered_model,
                is_own_model=_own_model(scope),
            ),
        )
    if read_data and not too_large_to_check(_readable(checked, found, skip), settings):
        failed = {*skip, *(_field(exc) for exc in found)}
        found += _as_errors(data_problems(checked, settings, scope=scope, skip=failed))
    return [p for p in _problems(found) if p.field.partition(".")[0] not in skip]


def refusal(found: Sequence[GluejobsError]) -> GluejobsError:
    """One error for every problem found: the error itself when it is the only one (its status and
    code stand), else a 422 listing them all."""
    problems = _problems(found)
    if len(found) == 1 and len(problems) == len(found[0].problems):
        return found[0]
    return InvalidSpec(problems=problems)


def _checked_paths(
    spec: JobSpec, settings: Settings, *, scope: DataScope, problems: list[GluejobsError]
) -> JobSpec:
    checked = check_paths(spec, settings, scope=scope, problems=problems)
    try:
        return check_trackers(checked, settings)
    except InvalidSpec as exc:
        problems.append(exc)
        return checked


def _own_model(scope: DataScope) -> Callable[[str], bool]:
    """Whether the caller has a registered model of a name (a bare `minilm` meaning `model:minilm`)."""

    def has(name: str) -> bool:
        if scope.resolve_model is None:
            return False
        try:
            scope.registered(reference(name), field="model_name_or_path")
        except GluejobsError:  # no such model, or a name no registered model can have
            return False
        return True

    return has


def _readable(spec: JobSpec, found: Sequence[GluejobsError], skip: Collection[str] = ()) -> JobSpec:
    """The spec without the data files that were refused (their paths may leave the data folder)."""
    refused = {*skip, *(_field(exc).removeprefix("uploaded_files.").partition(".")[0] for exc in found)}
    return spec.model_copy(update={name: None for name in SPEC_FILE_FIELDS if name in refused})


def _collect(found: list[GluejobsError], check: Callable[[], object]) -> None:
    try:
        check()
    except GluejobsError as exc:
        found.append(exc)


def _as_errors(problems: list[Problem]) -> list[GluejobsError]:
    return [InvalidSpec(problems=problems)] if problems else []


def _field(exc: GluejobsError) -> str:
    # A NotFound for an uploaded file is located in the request (`spec.train_file`); the rest in the spec.
    return (exc.field or "").removeprefix("spec.")


def _problems(found: Sequence[GluejobsError]) -> list[Problem]:
    """The errors' problems located in the spec, in the order found, each once."""
    problems: list[Problem] = []
    for exc in found:
        for problem in exc.problems:
            code = "not_found" if isinstance(exc, NotFound) else problem.code
            located = Problem(problem.field.removeprefix("spec."), code, problem.message)
            if located not in problems:
                problems.append(located)
    return problems


def check_priority(priority: int, settings: Settings, *, is_admin: bool) -> None:
    """A priority above GLUEJOBS_MAX_USER_PRIORITY goes before fair share: only admins may set one.
    Checked by every route that creates jobs (it needs the caller's role, which specs do not carry)."""
    limit = settings.max_user_priority
    if priority > limit and not is_admin:
        raise InvalidRequest(
            f"priority {priority} is above {limit}, the highest a non-admin key may set "
            "(GLUEJOBS_MAX_USER_PRIORITY; higher priorities go before fair share and need an admin key)",
            field="priority",
        )


def spec_warnings(spec: JobSpec) -> list[str]:
    """Options that are honoured but may not do what was meant."""
    notes = []
    metric = spec.metric_for_best_model
    if metric is not None and spec.greater_is_better is not None:
        name = metric.removeprefix("eval_")
        if spec.greater_is_better != greater_is_better(name):
            way = "larger" if spec.greater_is_better else "smaller"
            notes.append(
                f"greater_is_better: {spec.greater_is_better} ranks {name} as better when {way}, "
                "against the metric's own direction (honoured as given)"
            )
    epochs = "num_train_epochs"
    changed = (
        epochs in spec.model_fields_set and spec.num_train_epochs != JobSpec.model_fields[epochs].default
    )
    if spec.max_train_steps is not None and changed:
        notes.append(
            f"num_train_epochs: max_train_steps {spec.max_train_steps} overrides num_train_epochs "
            f"{spec.num_train_epochs:g}, as in the scripts"
        )
    return notes
