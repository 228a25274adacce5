"""What the API checks about a job's data before storing it, with shared/data/reading.py's reading rule.

A real submission (POST /v1/jobs, a sweep, a rerun) and a dry run read the data the worker will
read and refuse, with 422 naming the spec field, what the worker would fail on: a file that is
missing or unreadable, a column the task needs that is not there, a label that does not fit the
task, a GLUE test split that do_predict needs. The Hub's rows are the one thing the API does not
read (it never downloads); the report says so.

Reports are cached per data version: the key holds every source's path, size and modification
time (plus the spec fields that change what is read), so the tenth job of a sweep on the same
files costs a few stat() calls, and a changed file is read again. Refusals are cached the same way,
so resubmitting a spec whose large file fails on its last row does not read that file again.

A refusal names every file's problem, not the first one's: when a file fails, the job's data is read
again without it (shared/admission/data_checks.data_problems), so a missing validation_file does not hide a
bad label in the train_file.

Whose files may be quoted in a refusal is the caller's data scope's to say (shared/jobspec/data_scope.py):
a label from a file the caller does not own is never quoted back.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.admission.model_check import spec_model_labels
from shared.core.config import Settings
from shared.core.errors import InvalidSpec, Problem
from shared.data.quality_warnings import (
    STRAY_ROWS_SHOWN,
    class_warnings,
    label_pairs,
    long_rows_warning,
    rows_words,
    word_counts,
)
from shared.data.reading import (
    DATA_PROBLEM,
    GLUE_LAYOUTS,
    SPEC_FILE_FIELDS,
    UNKNOWN_MODEL_LABELS,
    DataError,
    JobData,
    PredictSplit,
    Split,
    job_data_files,
    read_job_data,
    read_local_test_splits,
    reads_model_labels,
)
from shared.jobspec.column_mapping import ColumnMapping
from shared.jobspec.data_scope import DataScope
from shared.jobspec.spec import IntervalStrategy, JobSpec
from shared.jobspec.suggest import near_matches
from shared.jobspec.tasks import TASKS
from shared.jobspec.uploaded_files import is_file_id

# numpy is imported in the functions that use it: the API imports this module at start and reads a
# job's data only on its request, so that its start does not pay for numpy's import.

CACHED_REPORTS = 256
# A label is a likely typo of another when it is this much rarer than a near-identical one
# (shared/jobspec/suggest.py's measure, stricter here: "entailment"/"not_entailment" are 0.83 apart).
TYPO_RARITY = 10
TYPO_RATIO = 0.85


@dataclass(frozen=True)
class SplitReport:
    where: str
    rows: int  # in the source
    rows_used: int  # after max_train_samples / max_eval_samples
    label_counts: dict[str, int] | None  # classification: rows per label name (of the rows used)
    score_range: dict[str, float] | None  # regression: min, max, mean of the scores used


@dataclass(frozen=True)
class DataReport:
    splits: dict[str, SplitReport]  # train, eval, eval_mismatched, test (test_file)
    predict: dict[str, dict[str, Any]]  # do_predict's GLUE test splits: {split: {where, rows}}
    unread: list[str]  # sources the API does not read (the Hub's), left to the worker
    text_keys: tuple[str, str | None]
    is_regression: bool
    label_names: list[str] | None
    warnings: list[str] = field(default_factory=list)  # what reads but looks wrong (label typos)

    def as_dict(self) -> dict[str, Any]:
        return {
            "splits": {
                name: {
                    "where": s.where,
                    "rows": s.rows,
                    "rows_used": s.rows_used,
                    **({"label_counts": s.label_counts} if s.label_counts is not None else {}),
                    **({"score_range": s.score_range} if s.score_range is not None else {}),
                }
                for name, s in self.splits.items()
            },
            "predict": self.predict,
            "unread": self.unread,
            "text_columns": [key for key in self.text_keys if key is not None],
            "is_regression": self.is_regression,
            "label_names": self.label_names,
        }


def too_large_to_check(spec: JobSpec, settings: Settings) -> dict[str, int]:
    """The data-folder and GLUE files of a job that the API does not read (over
    GLUEJOBS_MAX_CHECKED_DATA_BYTES): {role: bytes}. Uploaded files are not read again (their tally
    stands in), so they are never too large here."""
    limit = settings.max_checked_data_bytes
    large: dict[str, int] = {}
    for role, source in job_data_files(spec, settings).items():
        value = getattr(spec, role, None)
        if not isinstance(source, Path) or (isinstance(value, str) and is_file_id(value)):
            continue
        size = source.stat().st_size if source.is_file() else 0
        if size > limit:
            large[role] = size
    return large


def too_large_words(large: dict[str, int], settings: Settings) -> str:
    sizes = ", ".join(f"{role} ({size:,} bytes)" for role, size in large.items())
    limit = settings.max_checked_data_bytes
    return f"{sizes}: larger than GLUEJOBS_MAX_CHECKED_DATA_BYTES ({limit:,} bytes), the most the API reads"


def check_job_data(spec: JobSpec, settings: Settings, *, scope: DataScope) -> DataReport:
    """The checks a submission runs (cached per data version); InvalidSpec naming the field."""
    try:
        key = _cache_key(spec, settings, scope)
    except DataError as exc:
        raise as_invalid_spec(exc) from exc
    cached = _cache.get(key)
    if isinstance(cached, InvalidSpec):
        raise InvalidSpec(problems=cached.problems)
    if cached is not None:
        return cached
    _data, report = read_and_check(spec, settings, scope=scope)
    return report


def read_and_check(spec: JobSpec, settings: Settings, *, scope: DataScope) -> tuple[JobData, DataReport]:
    """Read the job's data once (the dry run also measures its texts) and check it."""
    try:
        key = _cache_key(spec, settings, scope)
    except DataError as exc:
        raise as_invalid_spec(exc) from exc
    large = too_large_to_check(spec, settings)
    if large:
        raise InvalidSpec(
            f"{too_large_words(large, settings)}: submit it without a dry run (the worker checks it) or "
            "raise the setting",
            field=next(iter(large)),
        )
    labels = spec_model_labels(spec, settings)
    try:
        with _reading(settings.max_file_checks):
            data = read_job_data(
                spec, settings, quotable=scope.owns, stored=scope.stored_uploads, labels=labels
            )
        predict = _predict_splits(spec, settings)
    except DataError as exc:
        first = list(as_invalid_spec(exc).problems)
        others = data_problems(spec, settings, scope=scope, skip={first[0].field})
        refusal = InvalidSpec(problems=in_file_order([*first, *(p for p in others if p not in first)]))
        _cache.put(key, refusal)
        raise refusal from exc
    strays = stray_labels(spec, data, scope)
    if strays:
        refusal = InvalidSpec(problems=strays)
        _cache.put(key, refusal)
        raise refusal
    report = _report(
        data, predict, own_labels=spec.task_name is None, max_length=spec.max_length, trains=spec.trains
    )
    if labels is not None and not labels.known:
        report.warnings.append(
            "labels: not checked at submission: the API cannot read the model's config (its id2label); "
            "the worker reads the files' labels by it"
        )
    if spec.predicts_glue_test and spec.task_name and settings.glue_dir is None:
        report.unread.extend(
            f"{split}: the Hub's test split" for split in GLUE_LAYOUTS[spec.task_name].test_splits
        )
    _cache.put(key, report)
    return data, report


_readers: dict[int, threading.BoundedSemaphore] = {}
_readers_lock = threading.Lock()


def _reading(at_once: int) -> threading.BoundedSemaphore:
    """At most GLUEJOBS_MAX_FILE_CHECKS data reads at once in this API process (the rest wait their
    turn): with GLUEJOBS_MAX_CHECKED_DATA_BYTES, what bounds the memory the checks take."""
    with _readers_lock:
        return _readers.setdefault(at_once, threading.BoundedSemaphore(at_once))


def as_invalid_spec(exc: DataError) -> InvalidSpec:
    """Each of the error's problems (a file lacking two mapped columns has two) under its spec field.
    A GLUE file's problem is the task's (its folder or layout): named task_name."""
    return InvalidSpec(
        problems=[Problem(p.field or "task_name", DATA_PROBLEM, p.message) for p in exc.problems]
    )


def data_problems(
    spec: JobSpec, settings: Settings, *, scope: DataScope, skip: Collection[str] = ()
) -> list[Problem]:
    """Every problem of the job's data files but those of the fields in `skip` (refused already):
    the data is read without the files that failed, again after each failure, so each file is
    checked whatever the others hold. At most one read per data file, plus one."""
    problems: list[Problem] = []
    failed = set(skip)
    labels = None if "model_name_or_path" in failed else spec_model_labels(spec, settings)
    for _attempt in range(len(SPEC_FILE_FIELDS) + 1):
        variant = _without(spec, failed)
        if variant is None:
            break
        rest, train = variant
        try:
            with _reading(settings.max_file_checks):
                data = read_job_data(
                    rest,
                    settings,
                    train=train,
                    quotable=scope.owns,
                    stored=scope.stored_uploads,
                    labels=labels or UNKNOWN_MODEL_LABELS,
                )
            problems += stray_labels(rest, data, scope)
            break
        except DataError as exc:
            found = as_invalid_spec(exc).problems  # one file's problems share its field
            if found[0].field in failed:
                break
            problems += found
            failed.add(found[0].field)
    return in_file_order(problems)


def in_file_order(problems: list[Problem]) -> list[Problem]:
    """Data problems in the spec's order of its files (train, validation, test), then the task's."""
    order = {name: index for index, name in enumerate(SPEC_FILE_FIELDS)}
    return sorted(problems, key=lambda problem: order.get(problem.field, len(order)))


def _without(spec: JobSpec, fields: Collection[str]) -> tuple[JobSpec, bool] | None:
    """The spec that reads the job's data but the files of `fields`, and whether it reads the train
    split; None when nothing is left that can be checked on its own: the task's own data failed, or
    the train_file that an own-labels job takes its labels from. A left-out file is not replaced by
    the task's split (which would read, say, all of GLUE's train split in its place)."""
    # `uploaded_files.train_file.sha256` (a pin that does not match) is the train_file's problem.
    named = {field.removeprefix("uploaded_files.").partition(".")[0] for field in fields}
    dropped = [name for name in SPEC_FILE_FIELDS if name in named]
    if "task_name" in named or (spec.task_name is None and "train_file" in dropped):
        return None
    if not dropped:
        return spec, True
    updates: dict[str, Any] = {name: None for name in dropped}
    if "validation_file" in dropped:  # nor GLUE's dev split read in a bad validation_file's place
        updates.update(eval_strategy=IntervalStrategy.no, do_eval=False)
    rest = spec.model_copy(update=updates)
    if not any(getattr(rest, name) is not None for name in SPEC_FILE_FIELDS):
        return None
    # A task's job without its train_file reads its evaluation rows alone (read_job_data(train=False)).
    return rest, "train_file" not in dropped


def stray_labels(spec: JobSpec, data: JobData, scope: DataScope) -> list[Problem]:
    """The stray values among the labels of one's own train_file (shared/data/quality_warnings.label_pairs:
    `positive ` once beside 200 `pos`), each a problem naming its rows and the label it is near, unless
    the spec's keep_labels names it: it would train as a class of its own, and the head would grow one.
    A task's labels are fixed, so there a stray value does not fit the task and reading refuses it;
    labels of a file the caller does not own are not quoted (nor refused: its owner is told)."""
    import numpy as np

    train = data.train
    if spec.task_name is not None or train is None or train.labels is None or data.is_regression:
        return []
    if not train.table.quotable:
        return []
    names = data.label_names or []
    tally = np.bincount(train.labels, weights=train.weights, minlength=len(names)).astype(np.int64)
    counts = {name: int(tally[i]) for i, name in enumerate(names)}
    kept = set(spec.keep_labels or ())
    field = train.table.field or "train_file"
    problems = []
    for rarer, other, how, stray in label_pairs(counts):
        if not stray or rarer in kept:
            continue
        rows = _label_rows(spec, train, names.index(rarer), rarer, scope)
        where = f"on {rows_words(rows, counts[rarer])}" if rows else f"in {counts[rarer]} rows"
        problems.append(
            Problem(
                field,
                "stray_label",
                f"{train.table.where}: label {rarer!r} {where} ({counts[rarer]} of {int(tally.sum())}) "
                f"{how} {other!r} ({counts[other]} rows): a stray value, which would train as a class of "
                f"its own ({len(names)} classes, not {len(names) - 1}); fix the row, or name it in "
                f"keep_labels if it is a class",
            )
        )
    return problems


def _label_rows(spec: JobSpec, train: Split, label_id: int, label: str, scope: DataScope) -> list[int]:
    """The first rows (numbered as in the file) holding a label: from the rows read, or, for an
    uploaded file read as its tally, from what its upload's check noted."""
    import numpy as np

    if train.weights is None:
        at = np.flatnonzero(train.labels == label_id)[:STRAY_ROWS_SHOWN]
        return [int(train.table.row_number(int(i))) for i in at]
    record = (spec.uploaded_files or {}).get(train.table.field or "")  # type: ignore[call-overload]
    stored = scope.stored_uploads.get(record.sha256) if record is not None else None
    noted = (stored.checks.get("label_rows") or {}).get(label) if stored is not None else None
    return [int(row) for row in noted or []]


def _predict_splits(spec: JobSpec, settings: Settings) -> dict[str, PredictSplit]:
    if not (spec.predicts_glue_test and spec.task_name and settings.glue_dir is not None):
        return {}
    return read_local_test_splits(TASKS[spec.task_name], settings.glue_dir)


def _report(
    data: JobData, predict: dict[str, PredictSplit], *, own_labels: bool, max_length: int, trains: bool = True
) -> DataReport:
    splits: dict[str, SplitReport] = {}
    named = {"train": data.train, **data.evals, "test": data.test}
    for name, rows in named.items():
        if rows is not None:
            splits[name] = _split_report(rows, data)
    unread = list(data.unread)
    if trains and data.train is None and not any(item.startswith("train:") for item in unread):
        unread.insert(0, "train")
    return DataReport(
        splits=splits,
        predict={name: {"where": s.where, "rows": len(s.ids)} for name, s in predict.items()},
        unread=unread,
        text_keys=data.text_keys,
        is_regression=data.is_regression,
        label_names=data.label_names,
        warnings=[
            *(label_typos(data.train, splits.get("train")) if own_labels else []),
            *(w.line() for w in _train_warnings(data.train, splits.get("train"), max_length)),
        ],
    )


def _train_warnings(train: Split | None, report: SplitReport | None, max_length: int) -> list[Problem]:
    """Rare classes, imbalance and rows that will be truncated, in the rows the job trains on (of a
    file the caller may be told about: a GLUE split's or the caller's own)."""
    if train is None or report is None or not train.table.quotable:
        return []
    field = train.table.field or "task_name"
    warnings = class_warnings(report.label_counts or {}, field)
    if train.weights is None and len(train.texts):  # an upload's tally has no texts: its upload warned
        long = int((word_counts(train.texts) > max_length).sum())
        found = long_rows_warning(long, len(train.texts), max_length, field)
        warnings += [found] if found is not None else []
    return warnings


def label_typos(train: Split | None, report: SplitReport | None) -> list[str]:
    """Labels of one's own training file that look like a typo of another: rare beside a near-identical
    frequent one (`postive` once among hundreds of `positive`). They train as classes of their own, so
    the model's head grows a class. A job gets here only with such a label named in its keep_labels
    (or a file it may not quote): otherwise it is refused as a stray value (`stray_labels`); a task's
    labels are fixed, so there such a label is refused by reading (shared/data/reading.py). Labels
    of a file the caller does not own are not quoted."""
    if train is None or report is None or not report.label_counts or not train.table.quotable:
        return []
    counts = report.label_counts
    notes = []
    for label, count in counts.items():
        frequent = [name for name in counts if counts[name] >= TYPO_RARITY * max(count, 1)]
        for near in near_matches(label, frequent, ratio=TYPO_RATIO)[:1]:
            notes.append(
                f"{train.table.field or 'train_file'}: label {label!r} ({count} row{'s' * (count != 1)}) "
                f"looks like a typo of {near!r} ({counts[near]} rows); it trains as a class of its own "
                f"({len(counts)} classes): fix the file if it is one"
            )
    return notes


def _split_report(rows: Split, data: JobData) -> SplitReport:
    import numpy as np

    counts: dict[str, int] | None = None
    scores: dict[str, float] | None = None
    # An uploaded file's split is its upload's tally: each label weighed by its rows.
    weights = rows.weights
    if rows.labels is not None and data.is_regression:
        values = rows.labels.astype(np.float64)
        scores = {
            "min": float(values.min()),
            "max": float(values.max()),
            "mean": round(float(np.average(values, weights=weights)), 4),
        }
    elif rows.labels is not None:
        names = data.label_names or []
        tally = np.bincount(rows.labels, weights=weights, minlength=len(names)).astype(np.int64)
        counts = {name: int(tally[i]) for i, name in enumerate(names)}
    return SplitReport(rows.table.where, rows.rows_in_source, len(rows), counts, scores)


# ---------------------------------------------------------------------------------------------------
# The cache: an LRU of reports, keyed by the data's version
# ---------------------------------------------------------------------------------------------------


def _cache_key(spec: JobSpec, settings: Settings, scope: DataScope) -> str:
    sources: dict[str, Any] = {}
    for role, source in job_data_files(spec, settings).items():
        sources[role] = _version(source) if isinstance(source, Path) else source
    return repr(
        (
            sorted(sources.items()),
            spec.task_name,
            # An evaluation job's labels are its model's: another model, other ids (or a refusal).
            (spec.model_name_or_path, spec.registered_model and spec.registered_model.sha256)
            if reads_model_labels(spec)
            else None,
            spec.max_train_samples,
            spec.max_eval_samples,
            spec.evaluates,
            spec.predicts_glue_test,
            sorted(ColumnMapping.of(spec).as_dict().items()),
            # An upload sent again with another mapping is tallied by other columns.
            sorted((sha, repr(stored.checks.get("columns"))) for sha, stored in scope.stored_uploads.items()),
            spec.max_length,  # the long rows' warning
            sorted(spec.keep_labels or ()),  # a stray label refused, or kept as a class of its own
            str(settings.glue_dir),
            str(settings.data_dir),
            scope.owned_folder,  # what the refusal may quote
            sorted(scope.own_uploads),
        )
    )


def _version(path: Path) -> tuple[str, int, int] | str:
    try:
        stat = path.stat()
    except OSError:
        return f"{path}: missing"
    return (str(path), stat.st_size, stat.st_mtime_ns)


class _Reports:
    """A small thread-safe LRU (routes run in a thread pool) of reports and refusals."""

    def __init__(self, size: int) -> None:
        self._items: OrderedDict[str, DataReport | InvalidSpec] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, key: str) -> DataReport | InvalidSpec | None:
        with self._lock:
            report = self._items.get(key)
            if report is not None:
                self._items.move_to_end(key)
            return report

    def put(self, key: str, report: DataReport | InvalidSpec) -> None:
        with self._lock:
            self._items[key] = report
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)


_cache = _Reports(CACHED_REPORTS)
