"""Reading a job's data and checking it against its task: ONE rule for the API and the worker.

Torch-free (pandas and numpy only), so the API runs the same checks at submission that a worker
runs before training: a file with the wrong columns or a label that does not fit the task is
refused with 422 naming the field, instead of failing minutes later on a worker.

`read_job_data` turns a job spec into text columns plus label ids (or float scores) per split,
read from, in this order: the spec's own files under GLUEJOBS_DATA_DIR; a local GLUE copy in the
original release layout (GLUEJOBS_GLUE_DIR); the Hub's nyu-mll/glue, through a reader the worker
passes in (the API never downloads: it leaves those rows to the worker and says so). Every source
ends up with the Hub's column names, so one code path checks labels and texts.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.core.config import Settings
from shared.core.errors import InvalidSpec, JobFailed, Problem, shorten
from shared.data.limits import FileLimits, OverLimit, check_file
from shared.jobspec.column_mapping import ROW_ID_COLUMNS, ColumnMapping, flags_hint, guess, missing_message
from shared.jobspec.data_scope import stored_data_path
from shared.jobspec.spec import JobSpec
from shared.jobspec.suggest import did_you_mean
from shared.jobspec.tasks import TASKS, GlueTask
from shared.jobspec.upload_tally import StoredUpload, tally_frame
from shared.jobspec.uploaded_files import cache_path, is_file_id

# numpy and pandas are imported in the functions that use them: the API imports this module at start
# for its names and types and reads files only later (a job's data checks, a dry run), so that its
# start does not pay for their import (~1 s of CPU; issue 34 item 4).
if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

LABEL = "label"
HUB_GLUE = "nyu-mll/glue"
_TSV_OPTIONS: dict[str, Any] = {
    # GLUE files hold unbalanced quotes (MRPC) and words like "null"/"NA" that are text, not missing values.
    "sep": "\t",
    "quoting": csv.QUOTE_NONE,
    "encoding": "utf-8-sig",
    "keep_default_na": False,
    "dtype": str,
    "engine": "c",
}
SPEC_FILE_FIELDS = ("train_file", "validation_file", "test_file")
SHOWN_CHARS = 80  # of a value from a file in a message
DATA_PROBLEM = "invalid_data"  # the code of a data file's problem


class DataError(JobFailed):
    """The job's data could not be loaded."""


@dataclass
class Table:
    """Rows from one source, with the Hub's column names, before labels are checked."""

    frame: pd.DataFrame
    where: str  # names the source in error messages
    fingerprint: str
    field: str | None = None  # the spec field it came from, for DataError.field
    path: Path | None = None  # the file it was read from (None for the Hub)
    # Whether error messages may quote its contents (labels, cells, column names): not when the
    # caller does not own the file (an admin checking another owner's file).
    quotable: bool = True
    # The rows before this piece of the source (a file checked piece by piece as it is uploaded), so
    # that messages number rows as the file does.
    first_row: int = 0
    # An uploaded file's label tally standing in for its rows (shared/jobspec/upload_tally.py): the rows of
    # the file each of the frame's rows stands for.
    weights: np.ndarray | None = None
    # How many text columns the reading wants (a refusal's mapping guess offers as many), and the
    # names each mapped field's column is read under (shared/jobspec/column_mapping.py).
    texts_wanted: int = 1
    read_as: dict[str, str] = dataclasses.field(default_factory=lambda: {"label_column": LABEL})
    written: list[str] | None = None  # its columns as the file names them, before the mapping

    def row_number(self, index: int) -> int | str:
        """The row number (from 1, as people count) of the frame's `index`-th row in the source."""
        if self.weights is not None:
            return f"? (one of {int(self.weights[index])} rows with it, by the upload's tally)"
        return self.first_row + index + 1

    def shown(self, value: Any) -> str:
        """A value from the file as the user wrote it (7 or 'maybe', not np.int64(7)), or withheld."""
        import numpy as np

        if not self.quotable:
            return "(value withheld: not your file)"
        # Bounded: a cell can be 100 KB, a message quotes its start.
        return shorten(repr(value.item() if isinstance(value, np.generic) else value), SHOWN_CHARS)


@dataclass
class Split:
    """A split ready for a model: its text columns (in text_keys order) and label ids or scores."""

    texts: pd.DataFrame
    labels: np.ndarray | None
    table: Table
    rows_in_source: int  # before max_train_samples / max_eval_samples
    # An uploaded file's tally (Table.weights): the rows each label stands for, and the rows used.
    weights: np.ndarray | None = None
    rows_used: int | None = None

    def __len__(self) -> int:
        if self.rows_used is not None:
            return self.rows_used
        return len(self.texts)


@dataclass
class JobData:
    train: Split | None  # None only when the caller asked for evaluation rows alone
    evals: dict[str, Split]  # gluejobs split name ("eval", "eval_mismatched") -> rows
    test: Split | None  # spec.test_file only; its labels are optional
    text_keys: tuple[str, str | None]
    is_regression: bool
    label_names: list[str] | None  # in id order (config.id2label); None for regression
    fingerprint: str  # identifies the source rows: files and their versions, or Hub fingerprints
    # Sources nobody read (the API leaves the Hub's rows to the worker), e.g. "train: the Hub's …".
    unread: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ModelLabels:
    """The labels a model was trained with, from its config.json: what an evaluation or prediction job
    without a task_name and without a train_file reads its files' labels by. `names` in id order
    (config.id2label); None for a regression model (num_labels 1). `known` False: the config could not
    be read here (a Hub id the API has no copy of), so the labels are left to the worker to check."""

    names: tuple[str, ...] | None
    known: bool = True

    @property
    def is_regression(self) -> bool:
        return self.known and self.names is None

    def words(self) -> str:
        """'0 negative, 1 positive' or 'a regression (num_labels 1)': the labels as a refusal names them."""
        if self.names is None:
            return "a regression head (num_labels 1): numeric scores"
        return ", ".join(f"{index} {name}" for index, name in enumerate(self.names))


UNKNOWN_MODEL_LABELS = ModelLabels(None, known=False)


def model_labels(config: Mapping[str, Any] | None) -> ModelLabels:
    """The labels of a model's config.json (transformers' rule: id2label in id order, else num_labels
    LABEL_i names; num_labels 1 or problem_type regression: a regression head)."""
    if not isinstance(config, Mapping):
        return UNKNOWN_MODEL_LABELS
    id2label = config.get("id2label")
    names: list[str] = []
    if isinstance(id2label, Mapping) and id2label:
        try:
            ordered = sorted((int(key), str(value)) for key, value in id2label.items())
        except (TypeError, ValueError):
            ordered = []
        if [index for index, _ in ordered] == list(range(len(ordered))):
            names = [name for _, name in ordered]
    num_labels = config.get("num_labels")
    if not names:
        count = num_labels if isinstance(num_labels, int) and num_labels > 0 else 2
        names = [f"LABEL_{i}" for i in range(count)]
    if config.get("problem_type") == "regression" or len(names) == 1:
        return ModelLabels(None)
    return ModelLabels(tuple(names))


def reads_model_labels(spec: JobSpec) -> bool:
    """Whether the job's labels come from its model's config: a job that does not train, has no
    task_name (whose labels are the task's) and no train_file (whose labels a training job takes)."""
    return not spec.trains and spec.task_name is None and spec.train_file is None


# A reader of the Hub's GLUE splits {gluejobs split: Table}; only the worker has one (it needs datasets).
HubReader = Callable[[GlueTask, list[str]], dict[str, Table]]


# ------------------------------------------------------------------------------------------------
# Which files a job reads (the readers below and the reproducibility record share this rule)
# ------------------------------------------------------------------------------------------------


def spec_file_paths(spec: JobSpec, settings: Settings) -> dict[str, Path]:
    """The spec's own files, resolved under GLUEJOBS_DATA_DIR (a file in an owner's folder inside
    that folder), or this machine's copy of an uploaded file (shared/data/local_copies.py): {field: path}."""
    paths: dict[str, Path] = {}
    for name in SPEC_FILE_FIELDS:
        value = getattr(spec, name)
        if value is not None and is_file_id(value):
            record = (spec.uploaded_files or {}).get(name)  # type: ignore[call-overload]
            if record is None or record.id != value:
                raise DataError(f"{value}: the spec has no record of this uploaded file", field=name)
            paths[name] = cache_path(settings.cache_dir, record.sha256, record.suffix)
        elif value is not None:
            try:
                paths[name] = stored_data_path(settings, value, field=name)
            except InvalidSpec as exc:  # a worker must not trust the database with paths either
                raise DataError(exc.message, field=name) from exc
    return paths


def glue_splits_needed(spec: JobSpec, spec_files: set[str]) -> list[str]:
    """The task's splits that come from GLUE (local copy or Hub), not from the spec's own files."""
    if spec.task_name is None:
        return []
    task = TASKS[spec.task_name]
    needed = [] if "train_file" in spec_files or not spec.trains else ["train"]
    if "validation_file" not in spec_files and spec.evaluates:
        needed.extend(split for split, _ in task.eval_splits)
    return needed


def job_data_files(spec: JobSpec, settings: Settings) -> dict[str, Path | str]:
    """Every source a job reads: {role: local path, or a description of a Hub source}.

    Roles are the spec's fields (train_file …), GLUE splits (train, eval, eval_mismatched) and,
    with do_predict, the GLUE test splits (test, test_matched, test_mismatched, diagnostic).
    """
    sources: dict[str, Path | str] = dict(spec_file_paths(spec, settings))
    if spec.task_name is None:
        return sources
    task = TASKS[spec.task_name]
    needed = glue_splits_needed(spec, set(sources))
    if settings.glue_dir is not None:
        sources.update(_local_glue_paths(task, settings.glue_dir, needed))
        if spec.predicts_glue_test:
            sources.update(glue_test_paths(task, settings.glue_dir))
    else:
        for split in needed:
            sources[split] = f"the Hub's {HUB_GLUE} {task.name} {_hub_split_names(task)[split]!r} split"
        if spec.predicts_glue_test:
            for split in GLUE_LAYOUTS[task.name].test_splits:
                sources[split] = f"the Hub's {HUB_GLUE} {task.name} {split!r} split"
    return sources


# ------------------------------------------------------------------------------------------------
# Loading
# ------------------------------------------------------------------------------------------------


def read_job_data(
    spec: JobSpec,
    settings: Settings,
    *,
    hub: HubReader | None = None,
    train: bool = True,
    quotable: Callable[[Path], bool] = lambda _path: True,
    stored: Mapping[str, StoredUpload] | None = None,
    labels: ModelLabels | None = None,
) -> JobData:
    """The job's train, eval and test rows, with text columns and label ids or scores.

    With a task_name, the spec's files (when given) replace the task's train or eval splits; the
    rest come from GLUEJOBS_GLUE_DIR, else from `hub`. Without `hub`, Hub splits are left out and
    named in `unread` (the API's case). Eval splits are left out when the job never evaluates
    (eval_strategy "no") and no validation_file names them. With train=False only the evaluation
    rows are read (a task's majority-class baseline); that needs a task_name. `quotable` says of a
    spec file whether error messages may quote what it holds (the API asks whether the caller owns it).
    `stored` ({sha256: what its upload's check found}) stands in for uploaded files, which the API
    then does not read again (shared/jobspec/upload_tally.py). `labels`: the model's (its config's), which
    an evaluation or prediction job without a task_name or train_file reads its labels by
    (reads_model_labels); unknown ones leave the files' labels unchecked.
    """
    skip = () if train else ("train_file", "test_file")
    files = _read_spec_files(spec, settings, skip=skip, quotable=quotable, stored=stored or {})
    unread: list[str] = []
    train_split: Split | None
    if spec.task_name is None:
        if not train:
            raise ValueError("reading evaluation rows alone needs a task_name")
        if reads_model_labels(spec):
            train_split, evals, test, text_keys, is_regression, label_names = _model_label_splits(
                files, ColumnMapping.of(spec), labels or UNKNOWN_MODEL_LABELS
            )
        else:
            train_split, evals, test, text_keys, is_regression, label_names = _own_file_splits(
                files, ColumnMapping.of(spec)
            )
    else:
        task = TASKS[spec.task_name]
        train_split, evals, test, unread = _task_splits(
            task, spec, files, settings, hub=hub, want_train=train
        )
        text_keys, is_regression = task.text_keys, task.is_regression
        label_names = list(task.label_names) if task.label_names else None
    train_split = _first_rows(train_split, spec.max_train_samples) if train_split else None
    evals = {name: _first_rows(rows, spec.max_eval_samples) for name, rows in evals.items()}
    sources = {name: rows.table.fingerprint for name, rows in evals.items()}
    if train_split is not None:
        sources["train"] = train_split.table.fingerprint
    if test is not None:
        sources["test"] = test.table.fingerprint
    identity: dict[str, Any] = {
        "task": spec.task_name,
        "max_train_samples": spec.max_train_samples,
        "max_eval_samples": spec.max_eval_samples,
        "sources": sources,
    }
    if reads_model_labels(spec) and labels is not None and labels.known:
        identity["model_labels"] = labels.names  # other labels give the same rows other ids
    columns = ColumnMapping.of(spec).as_dict()
    if columns:  # other columns of the same file are other rows (and unmapped jobs keep their caches)
        identity["columns"] = columns
    fingerprint = digest(identity)
    return JobData(
        train=train_split,
        evals=evals,
        test=test,
        text_keys=text_keys,
        is_regression=is_regression,
        label_names=label_names,
        fingerprint=fingerprint,
        unread=unread,
    )


def _first_rows(rows: Split, limit: int | None) -> Split:
    # run_glue.py's max_train_samples / max_eval_samples: the first N rows, not a random sample.
    if limit is None or limit >= len(rows):
        return rows
    if rows.weights is not None:  # a tally has no order: the count is cut, the labels' tally is the file's
        return Split(rows.texts, rows.labels, rows.table, rows.rows_in_source, rows.weights, limit)
    labels = rows.labels[:limit] if rows.labels is not None else None
    return Split(rows.texts.iloc[:limit].reset_index(drop=True), labels, rows.table, rows.rows_in_source)


# --- the spec's own files ------------------------------------------------------------------------


def _read_spec_files(
    spec: JobSpec,
    settings: Settings,
    *,
    skip: tuple[str, ...],
    quotable: Callable[[Path], bool],
    stored: Mapping[str, StoredUpload],
) -> dict[str, Table]:
    data_root = settings.data_dir.resolve()
    mapping = ColumnMapping.of(spec)
    task_keys = TASKS[spec.task_name].text_keys if spec.task_name else None
    tables: dict[str, Table] = {}
    for name, path in spec_file_paths(spec, settings).items():
        if name in skip:
            continue
        value = getattr(spec, name)
        if is_file_id(value):
            record = (spec.uploaded_files or {})[name]  # type: ignore[index]
            where = f"{name} {value} ({record.filename!r})"
            if record.sha256 in stored:
                frame, weights = tally_frame(stored[record.sha256])
                fingerprint = f"upload:{record.sha256}"
                table = Table(frame, where, fingerprint, name, path, quotable(path), weights=weights)
                tables[name] = mapped_table(table, mapping, task_keys, labels_required=name != "test_file")
                _check_tallied_labels(stored[record.sha256], mapping, where, field=name)
                continue
            if not path.is_file():  # the caller fetches uploaded files first
                raise DataError(f"{where}: this machine has no copy of it", field=name)
        else:
            where = f"{name} {path.relative_to(data_root).as_posix()!r}"
        if not path.is_file():
            raise DataError(f"{where} not found in GLUEJOBS_DATA_DIR", field=name)
        may_quote = quotable(path)
        frame = read_frame(path, where, field=name, quotable=may_quote, limits=FileLimits.of(settings))
        table = Table(frame, where, file_fingerprint(path), name, path, may_quote)
        tables[name] = mapped_table(table, mapping, task_keys, labels_required=name != "test_file")
    return tables


def mapped_table(
    table: Table, mapping: ColumnMapping, task_keys: tuple[str, str | None] | None, *, labels_required: bool
) -> Table:
    """The table with the mapping's columns under the names they are read by; DataError naming every
    mapped column the file lacks (each a problem of its own, with its near match)."""
    columns = [str(c) for c in table.frame.columns]
    missing = mapping.missing(columns, labels_required=labels_required)
    if missing:
        problems = [
            Problem(
                table.field or "",
                DATA_PROBLEM,
                f"{table.where} {missing_message(name, column, columns, quotable=table.quotable)}",
            )
            for name, column in missing
        ]
        raise DataError(problems=problems)
    keys = mapping.text_keys(task_keys)
    table.written = columns
    table.frame = mapping.apply(table.frame, task_keys)
    table.texts_wanted = len([key for key in keys if key is not None]) if keys else 1
    table.read_as = {"label_column": LABEL}
    if task_keys is not None:
        table.read_as |= {"text_column": task_keys[0], "text_pair_column": task_keys[1] or ""}
    return table


def _check_tallied_labels(stored: StoredUpload, mapping: ColumnMapping, where: str, *, field: str) -> None:
    """An upload's tally counts the column its upload named: a job that reads its labels from
    another column cannot be checked by it, and is told how the file was checked."""
    if stored.checks.get("labels", "none") == "none":
        return
    uploaded = ColumnMapping.of(stored.checks.get("columns") or {})
    if uploaded.label == mapping.label:
        return
    if mapping.label_column is None:  # the job maps nothing: the upload's mapping is the one it wants
        hint = flags_hint(uploaded, wanted={})
        raise DataError(
            f"{where} was uploaded with its labels in column {uploaded.label!r}: {hint}", field=field
        )
    hint = flags_hint(ColumnMapping(label_column=uploaded.label), wanted={})
    raise DataError(
        f"{where} was checked with its labels in column {uploaded.label!r}, not {mapping.label!r}: {hint}, "
        f"or upload it again with --label_column {mapping.label}",
        field=field,
    )


def read_frame(
    path: Path, where: str, *, field: str | None, quotable: bool = True, limits: FileLimits | None = None
) -> pd.DataFrame:
    """A csv/tsv/json/jsonl/parquet file as a frame of text columns (labels as numbers where numeric),
    once its shape is within `limits` (shared/data/limits.py: checked before any cell is decoded)."""
    import pandas as pd

    if path.stat().st_size == 0:  # each reader words this its own way (pyarrow: "file size is 0 bytes")
        raise DataError(f"{where} is empty: it has no header row and no rows", field=field)
    try:
        check_file(path, limits or FileLimits.defaults())
        frame = _read_by_suffix(path)
    except OverLimit as exc:
        raise DataError(f"{where}: {exc.message}", field=field) from exc
    except pd.errors.EmptyDataError as exc:  # in pandas' words "No columns to parse from file"
        raise DataError(f"{where} is empty: it has no header row and no rows", field=field) from exc
    except (ValueError, OSError) as exc:  # parser, decoding and Arrow errors all derive from these
        raise DataError(f"could not read {where}: {read_error(exc, path, quotable)}", field=field) from exc
    if frame.empty:
        raise DataError(f"{where} has no rows", field=field)
    return frame


def read_error(exc: BaseException, path: Path, quotable: bool) -> str:
    """Why a file could not be read, without the server's path; a parser's message can quote the
    file's text, so only its kind is given when the caller does not own the file."""
    if not quotable:
        return f"{type(exc).__name__} (details withheld: not your file)"
    return shorten(str(exc).replace(str(path), path.name), 300)  # a parser may quote a whole line


def _read_by_suffix(path: Path) -> pd.DataFrame:
    import pandas as pd

    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return pd.read_parquet(path)
    if suffix in (".json", ".jsonl"):
        return _read_json(path, lines=suffix == ".jsonl")
    if suffix == ".tsv":
        frame = pd.read_csv(path, **_TSV_OPTIONS)
    else:
        frame = pd.read_csv(path, encoding="utf-8-sig", keep_default_na=False, dtype=str)
    # Text formats have no types: read everything as text (so "007" stays a sentence), then let
    # the label column become numbers where it holds numbers, as pandas' own inference would.
    if LABEL in frame.columns:
        frame[LABEL] = _numbers_if_numeric(frame[LABEL])
    return frame


def _read_json(path: Path, *, lines: bool) -> pd.DataFrame:
    import pandas as pd

    # Like the `json` loader of datasets, .json may hold one array of records or JSON lines.
    options: dict[str, Any] = {"dtype": False, "convert_dates": False}
    if lines:
        return pd.read_json(path, lines=True, **options)
    try:
        return pd.read_json(path, **options)
    except ValueError:
        return pd.read_json(path, lines=True, **options)


def _numbers_if_numeric(values: pd.Series) -> pd.Series:
    import pandas as pd

    if values.str.strip().eq("").any():
        return values  # an empty label is reported by the label checks, with its row
    try:
        numbers = pd.to_numeric(values)
    except (ValueError, TypeError):
        return values
    return numbers.astype("int64" if pd.api.types.is_integer_dtype(numbers) else "float64")


def file_fingerprint(path: Path) -> str:
    """Path, size and modification time: changes whenever the file does, without reading it."""
    stat = path.stat()
    return f"{path}:{stat.st_size}:{stat.st_mtime_ns}"


# --- a job on its own files (no task_name) -------------------------------------------------------


def _own_file_splits(
    files: dict[str, Table], columns: ColumnMapping
) -> tuple[Split, dict[str, Split], Split | None, tuple[str, str | None], bool, list[str] | None]:
    import pandas as pd

    train = files.get("train_file")
    if train is None:
        raise DataError("a job without a task_name needs a train_file", field="train_file")
    text_keys = columns.text_keys(None) or _infer_text_keys(train)
    labels = _column(train, LABEL)
    _check_no_empty_labels(train, labels)
    is_regression = pd.api.types.is_float_dtype(labels)
    label_names: list[str] | None = None
    mapping: dict[Any, int] = {}
    if not is_regression:
        ordered = _sorted_unique(train, labels)
        mapping = {value: index for index, value in enumerate(ordered)}
        label_names = [str(value) for value in ordered]

    def rows(table: Table, *, labels_required: bool) -> Split:
        ids = _own_label_ids(table, mapping, is_regression, required=labels_required)
        return _split(table, text_keys, ids)

    train_rows = rows(train, labels_required=True)
    evals = {}
    if "validation_file" in files:
        evals["eval"] = rows(files["validation_file"], labels_required=True)
    test = rows(files["test_file"], labels_required=False) if "test_file" in files else None
    return train_rows, evals, test, text_keys, is_regression, label_names


def _model_label_splits(
    files: dict[str, Table], columns: ColumnMapping, labels: ModelLabels
) -> tuple[None, dict[str, Split], Split | None, tuple[str, str | None], bool, list[str] | None]:
    """An evaluation or prediction job's own validation_file and/or test_file, read with the model's
    labels (its config's id2label): a label is one of its names, else its id. Text columns as a
    training job's: the mapping's, else run_glue's rule on the first file."""
    first = files.get("validation_file") or files.get("test_file")
    if first is None:
        raise DataError(
            "an evaluation or prediction job without a task_name needs a validation_file (do_eval) or a "
            "test_file (do_predict)",
            field="validation_file",
        )
    text_keys = columns.text_keys(None) or _infer_text_keys(first)

    def rows(table: Table, *, labels_required: bool) -> Split:
        return _split(table, text_keys, _model_label_ids(table, labels, required=labels_required))

    evals = {}
    if "validation_file" in files:
        evals["eval"] = rows(files["validation_file"], labels_required=True)
    test = rows(files["test_file"], labels_required=False) if "test_file" in files else None
    names = list(labels.names) if labels.names is not None else None
    return None, evals, test, text_keys, labels.is_regression, names


def _model_label_ids(table: Table, labels: ModelLabels, *, required: bool) -> np.ndarray | None:
    """The file's labels as the model's ids (or scores for a regression model); None when a test file
    has none, or when the model's labels are unknown here (the worker, which has the model, checks)."""
    import numpy as np
    import pandas as pd

    if LABEL not in table.frame.columns:
        if required:
            _column(table, LABEL)  # the refusal, naming the columns there are
        return None
    values = table.frame[LABEL]
    if not required and values.astype(str).str.strip().eq("-1").all():
        return None  # a GLUE-style test file: -1 marks rows without a published label
    _check_no_empty_labels(table, values)
    if not labels.known:
        return None
    if labels.names is None:
        return _scores(table, values)
    # A label is one of the model's names, else its id ("0" or 0); names first (a model trained on
    # labels "1", "2", "5" names them so, and its label "2" is id 1).
    lookup = {str(i): i for i in range(len(labels.names))} | {name: i for i, name in enumerate(labels.names)}
    if pd.api.types.is_numeric_dtype(values):
        numbers = values.to_numpy(dtype=np.float64)
        whole = np.isfinite(numbers) & (numbers == np.round(numbers))
        keys = pd.Series([str(int(n)) if ok else str(n) for n, ok in zip(numbers, whole, strict=True)])
    else:
        keys = values.astype(str).str.strip().reset_index(drop=True)
    mapped = keys.map(lookup)
    valid = mapped.notna().to_numpy()
    if not valid.all():
        row = int(np.flatnonzero(~valid)[0])
        raise DataError(
            f"{table.where}: label {table.shown(values.iloc[row])} on row {table.row_number(row)} is not "
            f"one of the model's labels (its config's id2label: {labels.words()}); give the names or ids "
            "the model was trained with, or a task_name",
            field=table.field,
        )
    return mapped.to_numpy(dtype=np.int64)


def _infer_text_keys(table: Table) -> tuple[str, str | None]:
    # run_glue_no_trainer.py's rule, minus row-id columns (which run_glue would take for a sentence).
    names = [str(c) for c in table.frame.columns if c != LABEL and str(c).lower() not in ROW_ID_COLUMNS]
    if "sentence1" in names and "sentence2" in names:
        return "sentence1", "sentence2"
    if len(names) >= 2:
        return names[0], names[1]
    if names:
        return names[0], None
    raise DataError(f"{table.where} has no text column besides {LABEL!r}", field=table.field)


def _sorted_unique(table: Table, labels: pd.Series) -> list[Any]:
    try:
        return sorted(labels.unique().tolist())
    except TypeError as exc:
        raise DataError(
            f"{table.where} mixes label types (e.g. numbers and strings) in column {LABEL!r}",
            field=table.field,
        ) from exc


def _own_label_ids(
    table: Table, mapping: dict[Any, int], is_regression: bool, *, required: bool
) -> np.ndarray | None:
    import numpy as np

    if LABEL not in table.frame.columns:
        if required:
            _column(table, LABEL)  # the refusal, naming the columns there are
        return None
    labels = table.frame[LABEL]
    _check_no_empty_labels(table, labels)
    if is_regression:
        return _scores(table, labels)
    ids = labels.map(mapping)
    unseen = ids.isna()
    if unseen.any():
        row = int(np.flatnonzero(unseen.to_numpy())[0])
        known = f" (its labels: {', '.join(map(repr, mapping))})" if table.quotable else ""
        raise DataError(
            f"{table.where}: label {table.shown(labels.iloc[row])} on row {table.row_number(row)} does not "
            f"occur in the train_file{known}",
            field=table.field,
        )
    return ids.to_numpy(dtype=np.int64)


def _check_no_empty_labels(table: Table, labels: pd.Series) -> None:
    import numpy as np

    _check_scalar_labels(table, labels)
    empty = labels.isna() | labels.astype(str).str.strip().eq("")
    if empty.any():
        row = int(np.flatnonzero(empty.to_numpy())[0])
        raise DataError(f"{table.where}: empty label on row {table.row_number(row)}", field=table.field)


def _check_scalar_labels(table: Table, labels: pd.Series) -> None:
    """A label is a number or a string: a JSON object or list (unhashable) is refused naming the column."""
    import numpy as np

    if labels.dtype != object:
        return
    nested = labels.map(lambda value: isinstance(value, dict | list | tuple | set | np.ndarray))
    if nested.any():
        row = int(np.flatnonzero(nested.to_numpy())[0])
        kind = type(labels.iloc[row]).__name__
        raise DataError(
            f"{table.where}: the {LABEL!r} column holds a {kind} on row {table.row_number(row)}; "
            "a label is a number or a string",
            field=table.field,
        )


# --- a GLUE task ---------------------------------------------------------------------------------


def _task_splits(
    task: GlueTask,
    spec: JobSpec,
    files: dict[str, Table],
    settings: Settings,
    *,
    hub: HubReader | None,
    want_train: bool,
) -> tuple[Split | None, dict[str, Split], Split | None, list[str]]:
    needed = glue_splits_needed(spec, set(files) | ({"train_file"} if not want_train else set()))
    glue, unread = _glue_tables(task, settings, needed, hub=hub)
    train_table = files.get("train_file") or glue.get("train")
    if "validation_file" in files:
        eval_tables = {"eval": files["validation_file"]}
    else:
        eval_tables = {split: glue[split] for split, _ in task.eval_splits if split in glue}

    def rows(table: Table, *, labels_required: bool) -> Split:
        return _split(table, task.text_keys, _task_label_ids(table, task, labels_required))

    train = rows(train_table, labels_required=True) if want_train and train_table is not None else None
    evals = {split: rows(table, labels_required=True) for split, table in eval_tables.items()}
    test = rows(files["test_file"], labels_required=False) if "test_file" in files else None
    return train, evals, test, unread


def _task_label_ids(table: Table, task: GlueTask, required: bool) -> np.ndarray | None:
    """Label ids (or STS-B scores) for a task; names ("entailment") and ids ("0") are both accepted."""
    if LABEL not in table.frame.columns:
        if required:
            _column(table, LABEL)  # the refusal, naming the columns there are
        return None
    labels = table.frame[LABEL]
    if not required and labels.astype(str).str.strip().eq("-1").all():
        return None  # a GLUE test split: every label is -1, meaning "not published"
    _check_no_empty_labels(table, labels)
    if task.label_names is None:
        return _scores(table, labels)
    return _class_ids(table, labels, task.label_names)


def _class_ids(table: Table, labels: pd.Series, names: tuple[str, ...]) -> np.ndarray:
    import numpy as np
    import pandas as pd

    if pd.api.types.is_numeric_dtype(labels):
        values = labels.to_numpy(dtype=np.float64)
        ids = np.where(np.isfinite(values) & (values == np.round(values)), values, -1.0)
        valid = (ids >= 0) & (ids < len(names))
    else:
        lookup = {name: index for index, name in enumerate(names)} | {str(i): i for i in range(len(names))}
        mapped = labels.astype(str).str.strip().map(lookup)
        valid = mapped.notna().to_numpy()
        ids = mapped.fillna(-1).to_numpy(dtype=np.float64)
    if not valid.all():
        row = int(np.flatnonzero(~valid)[0])
        message = _bad_label_message(table, table.shown(labels.iloc[row]), row, names)
        if table.quotable:
            message += did_you_mean(str(labels.iloc[row]).strip(), names)
        raise DataError(message, field=table.field)
    return ids.astype(np.int64)


def _bad_label_message(table: Table, shown: str, row: int, names: tuple[str, ...]) -> str:
    expected = f"0..{len(names) - 1} or one of {', '.join(names)}"
    where = f"{table.where}: label {shown} on row {table.row_number(row)}"
    message = f"{where} does not fit the task (expected {expected})"
    if shown.strip("'") == "-1":
        message += "; -1 marks GLUE test rows, which have no published labels"
    return message


def _scores(table: Table, labels: pd.Series) -> np.ndarray:
    import numpy as np
    import pandas as pd

    scores = pd.to_numeric(labels, errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(scores)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DataError(
            f"{table.where}: label {table.shown(labels.iloc[row])} on row {table.row_number(row)} is not a "
            "number (a regression task needs numeric scores)",
            field=table.field,
        )
    return scores.astype(np.float32)


def _column(table: Table, name: str) -> pd.Series:
    if name not in table.frame.columns:
        written = table.written or table.frame.columns
        names = shorten(", ".join(map(str, written)), 300)  # a header can be 1 MiB
        columns = f" (its columns: {names}){_mapping_hint(table)}" if table.quotable else ""
        raise DataError(f"{table.where} has no {name!r} column{columns}", field=table.field)
    return table.frame[name]


# The rows a refusal's guess of the mapping looks at (their distinct values and lengths).
GUESS_ROWS = 200


def _mapping_hint(table: Table) -> str:
    """'; map yours with --text_column review --label_column sentiment (spec: …)': the mapping the
    file's columns most likely want, for one's own files (a GLUE file's columns are the reader's)."""
    if table.field not in (*SPEC_FILE_FIELDS, "file"):
        return ""
    columns = [str(c) for c in table.frame.columns]
    head = table.frame.head(GUESS_ROWS)
    samples = None if table.weights is not None else {str(c): head[c].tolist() for c in head.columns}
    hint = flags_hint(guess(columns, texts=table.texts_wanted, samples=samples), wanted=table.read_as)
    return f"; {hint}" if hint else ""


def _split(table: Table, text_keys: tuple[str, str | None], labels: np.ndarray | None) -> Split:
    import pandas as pd

    texts = pd.DataFrame({key: _texts(table, key) for key in text_keys if key is not None})
    if table.weights is not None:
        rows = int(table.weights.sum())
        return Split(texts, labels, table, rows, table.weights, rows)
    return Split(texts, labels, table, len(table.frame))


def _texts(table: Table, key: str) -> pd.Series:
    import numpy as np

    texts = _column(table, key)
    missing = texts.isna()
    if missing.any():
        row = int(np.flatnonzero(missing.to_numpy())[0])
        raise DataError(f"{table.where}: no {key!r} text on row {table.row_number(row)}", field=table.field)
    return texts.astype(str).reset_index(drop=True)


# --- the task's own splits: a local GLUE copy, else the Hub ----------------------------------------


@dataclass(frozen=True)
class GlueLayout:
    """Where a task lives in the original GLUE release, and its columns' names there."""

    folder: str
    columns: dict[str, str]  # column in the TSV -> the Hub's column name
    eval_files: tuple[tuple[str, str], ...] = (("eval", "dev.tsv"),)
    header: tuple[str, ...] | None = None  # column names of a train/dev file without a header row (CoLA)
    # Test splits (the Hub's split names) and their files; test files have a header and an id column.
    test_files: tuple[tuple[str, str], ...] = (("test", "test.tsv"),)
    test_id_column: str = "index"

    @property
    def test_splits(self) -> tuple[str, ...]:
        return tuple(split for split, _ in self.test_files)


_ENTAILMENT_COLUMNS = {"sentence1": "sentence1", "sentence2": "sentence2", "label": "label"}
GLUE_LAYOUTS: dict[str, GlueLayout] = {
    "cola": GlueLayout(
        "CoLA",
        {"sentence": "sentence", "label": "label"},
        header=("source", "label", "original_label", "sentence"),
    ),
    "sst2": GlueLayout("SST-2", {"sentence": "sentence", "label": "label"}),
    "mrpc": GlueLayout("MRPC", {"#1 String": "sentence1", "#2 String": "sentence2", "Quality": "label"}),
    "stsb": GlueLayout("STS-B", {"sentence1": "sentence1", "sentence2": "sentence2", "score": "label"}),
    "qqp": GlueLayout(
        "QQP",
        {"question1": "question1", "question2": "question2", "is_duplicate": "label"},
        test_id_column="id",
    ),
    "mnli": GlueLayout(
        "MNLI",
        {"sentence1": "premise", "sentence2": "hypothesis", "gold_label": "label"},
        eval_files=(("eval", "dev_matched.tsv"), ("eval_mismatched", "dev_mismatched.tsv")),
        test_files=(("test_matched", "test_matched.tsv"), ("test_mismatched", "test_mismatched.tsv")),
    ),
    "qnli": GlueLayout("QNLI", {"question": "question", "sentence": "sentence", "label": "label"}),
    "rte": GlueLayout("RTE", _ENTAILMENT_COLUMNS),
    "wnli": GlueLayout("WNLI", _ENTAILMENT_COLUMNS),
}
# GLUE's diagnostic set (AX), predicted by an MNLI model: the release's diagnostic/diagnostic.tsv,
# the Hub's "ax" configuration. Its columns are MNLI's (sentence1/sentence2 → premise/hypothesis).
DIAGNOSTIC_SPLIT = "diagnostic"
DIAGNOSTIC_FILE = Path("diagnostic") / "diagnostic.tsv"
DIAGNOSTIC_HUB_CONFIG = "ax"
DIAGNOSTIC_COLUMNS = {"sentence1": "premise", "sentence2": "hypothesis"}


def _hub_split_names(task: GlueTask) -> dict[str, str]:
    return dict((("train", "train"), *task.eval_splits))


def glue_path(path: Path) -> str:
    """A GLUE file as messages name it: under GLUEJOBS_GLUE_DIR, not the server's absolute path."""
    return f"GLUEJOBS_GLUE_DIR/{path.parent.name}/{path.name}"


def _local_glue_paths(task: GlueTask, glue_dir: Path, splits: list[str]) -> dict[str, Path]:
    layout = GLUE_LAYOUTS[task.name]
    files = dict((("train", "train.tsv"), *layout.eval_files))
    folder = glue_dir.resolve() / layout.folder
    return {split: folder / files[split] for split in splits}


def _glue_tables(
    task: GlueTask, settings: Settings, splits: list[str], *, hub: HubReader | None
) -> tuple[dict[str, Table], list[str]]:
    if not splits:
        return {}, []
    if settings.glue_dir is not None:
        return _local_glue_tables(task, settings.glue_dir, splits), []
    if hub is not None:
        return hub(task, splits), []
    names = _hub_split_names(task)
    return {}, [f"{split}: the Hub's {HUB_GLUE} {task.name} {names[split]!r} split" for split in splits]


def _local_glue_tables(task: GlueTask, glue_dir: Path, splits: list[str]) -> dict[str, Table]:
    layout = GLUE_LAYOUTS[task.name]
    paths = _local_glue_paths(task, glue_dir, splits)
    if not (glue_dir.resolve() / layout.folder).is_dir():
        expected = ", ".join(f"{layout.folder}/{path.name}" for path in paths.values())
        raise DataError(
            f"GLUE folder {layout.folder!r} for task {task.name!r} not found in GLUEJOBS_GLUE_DIR; "
            f"expected {expected} there"
        )
    return {split: _read_glue_tsv(path, layout) for split, path in paths.items()}


def _read_glue_tsv(path: Path, layout: GlueLayout) -> Table:
    where = f"GLUE file {layout.folder}/{path.name}"
    frame = _read_tsv_columns(path, where, layout.columns, header=layout.header)
    return Table(frame.rename(columns=layout.columns), where, file_fingerprint(path), path=path)


def _read_tsv_columns(
    path: Path,
    where: str,
    wanted: dict[str, str],
    *,
    header: tuple[str, ...] | None = None,
    field: str | None = None,
) -> pd.DataFrame:
    import pandas as pd

    if not path.is_file():
        raise DataError(f"{where} not found: expected it at {glue_path(path)}", field=field)
    options = {**_TSV_OPTIONS, "usecols": lambda column: column in wanted}
    if header is not None:
        options |= {"header": None, "names": list(header)}
    try:
        check_file(path, FileLimits.defaults())
        frame = pd.read_csv(path, **options)
    except OverLimit as exc:
        raise DataError(f"{where}: {exc.message}", field=field) from exc
    except (ValueError, OSError) as exc:
        raise DataError(f"could not read {where}: {read_error(exc, path, True)}", field=field) from exc
    missing = [column for column in wanted if column not in frame.columns]
    if missing:
        shown = ", ".join(map(repr, missing))
        raise DataError(f"{where} has no column {shown} in its header row", field=field)
    return frame


# --- GLUE's test splits (do_predict): ids and texts, no labels -------------------------------------


@dataclass
class PredictSplit:
    """Rows to predict for a GLUE submission file: the ids GLUE gave them, and their texts."""

    name: str  # the Hub's split name (test, test_matched, test_mismatched) or "diagnostic"
    ids: list[str]
    texts: pd.DataFrame  # in the task's text_keys order
    where: str


def glue_test_paths(task: GlueTask, glue_dir: Path) -> dict[str, Path]:
    """The local test files of a task; MNLI adds the diagnostic set when the copy has it."""
    layout = GLUE_LAYOUTS[task.name]
    folder = glue_dir.resolve() / layout.folder
    paths = {split: folder / name for split, name in layout.test_files}
    diagnostic = glue_dir.resolve() / DIAGNOSTIC_FILE
    if task.name == "mnli" and diagnostic.is_file():
        paths[DIAGNOSTIC_SPLIT] = diagnostic
    return paths


def read_local_test_splits(task: GlueTask, glue_dir: Path) -> dict[str, PredictSplit]:
    """GLUE's test files from a local copy: `index` (QQP: `id`) and the text columns, no labels."""
    layout = GLUE_LAYOUTS[task.name]
    text_columns = {column: name for column, name in layout.columns.items() if name != LABEL}
    splits: dict[str, PredictSplit] = {}
    for split, path in glue_test_paths(task, glue_dir).items():
        id_column = "index" if split == DIAGNOSTIC_SPLIT else layout.test_id_column
        columns = DIAGNOSTIC_COLUMNS if split == DIAGNOSTIC_SPLIT else text_columns
        shown = DIAGNOSTIC_FILE.as_posix() if split == DIAGNOSTIC_SPLIT else f"{layout.folder}/{path.name}"
        where = f"GLUE file {shown}"
        frame = _read_tsv_columns(path, where, {id_column: id_column, **columns}, field="do_predict")
        table = Table(frame.rename(columns=columns), where, file_fingerprint(path), "do_predict", path)
        splits[split] = predict_split(split, table, task, id_column)
    return splits


def predict_split(name: str, table: Table, task: GlueTask, id_column: str) -> PredictSplit:
    import numpy as np
    import pandas as pd

    ids = _column(table, id_column).astype(str).str.strip()
    if ids.eq("").any():
        row = int(np.flatnonzero(ids.eq("").to_numpy())[0])
        raise DataError(f"{table.where}: no {id_column!r} on row {table.row_number(row)}", field=table.field)
    texts = pd.DataFrame({key: _texts(table, key) for key in task.text_keys if key is not None})
    return PredictSplit(name, ids.tolist(), texts, table.where)


def digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()
