"""The checks an uploaded file passes as it lands (POST /v1/files), piece by piece.

The rules are shared/data/reading.py's, the ones a dry run and a worker apply: the format by the
file's name (csv, tsv, json, jsonl, parquet) read with the worker's options, the text columns (the
task's, or the first one or two besides `label`), labels present and non-empty (optional in a test
file), fitting the task when one is named (names like `entailment` or ids), and a column of labels
of one type. A file that cannot serve as training data is refused with 422 naming the problem and
its row.

Unlike a dry run, which reads a job's files whole, an upload is read a few MiB at a time (pandas'
chunked readers, parquet's row groups in slices, a JSON array element by element), after its shape
passed shared/data/limits.py (columns, bytes per cell and row, parquet row groups, checked before
any cell is decoded), so a 2 GiB upload does not take 2 GiB of memory, nor a 1 KB parquet file 5 GB:
what is kept across pieces is the row count and the label tally. The API runs these checks in a
child process with memory and CPU limits (shared/file_check_process.py).
Pieces change nothing that a whole read decides: text-format labels are tallied as written and
their type (ids, names or scores) is decided once, over every distinct value, as a whole read
decides it over the column.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.core.errors import InvalidRequest, Problem, quote
from shared.data.limits import (
    FileLimits,
    OverLimit,
    check_text_file,
    decoded_slices,
    json_records,
    parquet_row_groups,
)
from shared.data.quality_warnings import (
    DEFAULT_MAX_LENGTH,
    STRAY_ROWS_SHOWN,
    label_pairs,
    label_warnings,
    long_rows_warning,
    word_counts,
)

# The reading rule's own helpers: these checks must be exactly the dry run's.
from shared.data.reading import (
    _TSV_OPTIONS,
    LABEL,
    DataError,
    Table,
    _check_no_empty_labels,
    _column,
    _infer_text_keys,
    _numbers_if_numeric,
    _task_label_ids,
    _texts,
    mapped_table,
    read_error,
)
from shared.jobspec.column_mapping import ColumnMapping
from shared.jobspec.spec import DATA_FILE_SUFFIXES
from shared.jobspec.tasks import TASKS, GlueTask

# numpy and pandas are imported in the functions that read: the API imports this module at start for
# its names (PURPOSES, task_of, upload_warnings) and checks uploads in a child whose forkserver has
# them imported (service/files/check_warmup.py), so that its own start does not pay for them (~1 s).
if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

# A piece is about this much of the file (its rows counted from the first MiB's): pandas holds a
# piece as Python strings, several times its size on disk.
PIECE_BYTES = 2 * 1024 * 1024
MAX_PIECE_ROWS = 50_000
# Text files: a piece holds at most this many bytes of its longest rows (so rows far longer than the
# first MiB's do not make a piece of 50,000 megabyte rows).
MAX_PIECE_BYTES = 32 * 1024 * 1024
PURPOSES = ("train", "validation", "test")
# A label column with more distinct values than this is a column of scores, or no classification.
MAX_CLASSES = 10_000
MAX_COLUMN_NAME_CHARS = 256
FIELD = "file"


@dataclass(frozen=True)
class UploadReport:
    format: str  # the suffix without its dot
    rows: int
    columns: list[str]
    checks: dict[str, Any]  # text_columns; labels: classes, scores or none; label_counts / score_range


def task_of(name: str | None) -> GlueTask | None:
    """The task an upload's labels are checked against (names as the spec takes them: SST-2, sst2)."""
    if name is None or not name.strip():
        return None
    key = name.strip().lower().replace("-", "")
    if key not in TASKS:
        raise InvalidRequest(
            f"unknown task {quote(name)}; expected one of {', '.join(TASKS)}", field="task_name"
        )
    return TASKS[key]


def file_format(filename: str) -> str:
    suffix = Path(filename).suffix.lower()
    if suffix not in DATA_FILE_SUFFIXES:
        raise InvalidRequest(
            f"{quote(filename)} is not a data file: name it .csv, .tsv, .json, .jsonl or .parquet",
            field=FIELD,
        )
    return suffix.removeprefix(".")


def check_upload(
    path: Path,
    *,
    filename: str,
    purpose: str,
    task: GlueTask | None,
    limits: FileLimits,
    mapping: ColumnMapping | None = None,
) -> UploadReport:
    """Read the file at `path` (uploaded as `filename`) piece by piece and check it; InvalidRequest
    naming the problem when it cannot serve as `purpose` data or is over one of `limits`. `mapping`
    names its text and label columns (shared/jobspec/column_mapping.py), as a job's spec does; the tally
    counts the labels of its label column, and the report keeps the mapping under `columns`."""
    import pandas as pd

    mapping = mapping or ColumnMapping()
    check_mapping(mapping, task)
    if purpose not in PURPOSES:
        raise InvalidRequest(
            f"purpose is one of {', '.join(PURPOSES)}, not {quote(purpose)}", field="purpose"
        )
    suffix = f".{file_format(filename)}"
    where = f"file {filename!r}"
    tally = _Labels(task)
    rows, columns, long_rows = 0, list[str](), 0
    task_keys = task.text_keys if task else None
    text_keys = mapping.text_keys(task_keys)
    try:
        for frame in _pieces(path, suffix, limits):
            if not len(frame):
                continue
            if rows == 0:
                columns = _column_names(frame, where)
            table = Table(frame, where, "", FIELD, path, True, first_row=rows)
            table = mapped_table(table, mapping, task_keys, labels_required=purpose != "test")
            if text_keys is None:
                text_keys = _infer_text_keys(table)
            texts = {key: _texts(table, key) for key in text_keys if key is not None}
            long_rows += int((word_counts(pd.DataFrame(texts)) > DEFAULT_MAX_LENGTH).sum())
            tally.add(table, labels_required=purpose != "test")
            rows += len(frame)
    except DataError as exc:  # every problem it found (each mapped column the file lacks), as the file's
        found = [Problem(FIELD, InvalidRequest.code, p.message) for p in exc.problems]
        raise InvalidRequest(problems=found) from exc
    except OverLimit as exc:
        raise InvalidRequest(f"{where}: {exc.message}", field=FIELD) from exc
    except (ValueError, OSError) as exc:  # parser, decoding and Arrow errors derive from these
        reason = read_error(exc, path, True).replace(path.name, filename)
        raise InvalidRequest(f"could not read {where}: {reason}", field=FIELD) from exc
    if rows == 0:
        raise InvalidRequest(f"{where} has no rows", field=FIELD)
    assert text_keys is not None
    as_written = {new: old for old, new in mapping.renames(task_keys).items()}
    checks: dict[str, Any] = {
        "text_columns": [as_written.get(key, key) for key in text_keys if key is not None],
        **tally.summary(where),
        "long_rows": {"max_length": DEFAULT_MAX_LENGTH, "rows": long_rows},
    }
    if mapping.as_dict():
        checks["columns"] = mapping.as_dict()
    return UploadReport(suffix.removeprefix("."), rows, columns, checks)


def check_mapping(mapping: ColumnMapping, task: GlueTask | None) -> None:
    """422 naming the form field for a mapping that cannot work whatever the file holds."""
    problem = mapping.problem(pair_task=None if task is None else task.text_keys[1] is not None)
    if problem is not None:
        raise InvalidRequest(problem[1], field=problem[0])


def upload_warnings(checks: dict[str, Any], rows: int) -> list[Problem]:
    """What an upload's checks found that will train but probably not as meant
    (shared/data/quality_warnings.py): a function of the stored checks, so the upload's answer and every later
    read give the same."""
    warnings = label_warnings(checks.get("label_counts") or {}, FIELD, checks.get("label_rows"))
    long = checks.get("long_rows") or {}
    found = long_rows_warning(int(long.get("rows") or 0), rows, int(long.get("max_length") or 0), FIELD)
    return warnings + ([found] if found is not None else [])


def _column_names(frame: pd.DataFrame, where: str) -> list[str]:
    """The columns as the file's row keeps them (and every listing of files shows them): bounded."""
    columns = [str(c) for c in frame.columns]
    for name in columns:
        if len(name) > MAX_COLUMN_NAME_CHARS:
            raise InvalidRequest(
                f"{where}: a column name ({quote(name)}) is longer than {MAX_COLUMN_NAME_CHARS} "
                "characters (a fixed limit)",
                field=FIELD,
            )
    return columns


def first_rows(path: Path, rows: int, limits: FileLimits) -> pd.DataFrame:
    """The first `rows` rows of an uploaded file that passed these checks (a dry run's sample of its
    texts): read a piece at a time up to them, not the file."""
    import pandas as pd

    pieces, read = [], 0
    for frame in _pieces(path, path.suffix.lower(), limits, scan=False):
        pieces.append(frame)
        read += len(frame)
        if read >= rows:
            break
    return pd.concat(pieces, ignore_index=True).iloc[:rows] if pieces else pd.DataFrame()


def _pieces(path: Path, suffix: str, limits: FileLimits, *, scan: bool = True) -> Iterator[pd.DataFrame]:
    """The file a piece at a time; `scan=False` skips the text scan of the whole file's shape, for a
    file that passed it when it was uploaded."""
    import pandas as pd

    if suffix == ".parquet":
        for group in parquet_row_groups(path, limits):
            for piece in decoded_slices(group, PIECE_BYTES):
                yield piece.to_pandas()
        return
    if suffix == ".json" and _starts_an_array(path):
        yield from _json_array_pieces(path, limits)
        return
    sep = {".csv": ",", ".tsv": "\t"}.get(suffix)
    longest = (
        check_text_file(path, sep=sep, quoted=suffix == ".csv", limits=limits)
        if scan
        else limits.max_row_bytes
    )
    rows = min(_rows_per_piece(_bytes_per_line(path)), max(1, MAX_PIECE_BYTES // max(1, longest)))
    if suffix == ".tsv":
        yield from pd.read_csv(path, **_TSV_OPTIONS, chunksize=rows)
    elif suffix == ".csv":
        yield from pd.read_csv(path, encoding="utf-8-sig", keep_default_na=False, dtype=str, chunksize=rows)
    else:  # .jsonl, and .json holding JSON lines (as the `json` loader of datasets takes it)
        for frame in pd.read_json(path, lines=True, chunksize=rows, dtype=False, convert_dates=False):
            _check_json_cells(frame, limits)
            yield frame


def _json_array_pieces(path: Path, limits: FileLimits) -> Iterator[pd.DataFrame]:
    records: list[Any] = []
    size = 0
    for record, length in json_records(path, limits):
        records.append(record)
        size += length
        if size >= PIECE_BYTES or len(records) >= MAX_PIECE_ROWS:
            yield _json_frame(records, limits)
            records, size = [], 0
    if records:
        yield _json_frame(records, limits)


def _json_frame(records: list[Any], limits: FileLimits) -> pd.DataFrame:
    import pandas as pd

    frame = pd.DataFrame(records)
    _check_json_cells(frame, limits)
    return frame


def _check_json_cells(frame: pd.DataFrame, limits: FileLimits) -> None:
    """JSON has no cells to scan before parsing: a record's strings are measured once parsed (the
    record itself is at most a row's limit)."""
    import pandas as pd

    for name in frame.columns:
        column = frame[name]
        if column.dtype != object and not pd.api.types.is_string_dtype(column):
            continue
        lengths = column.map(lambda value: len(value) if isinstance(value, str) else 0)
        if len(lengths) and lengths.max() > limits.max_cell_bytes:
            raise limits.over(
                f"a cell of column {quote(str(name))} is longer than {limits.max_cell_bytes} bytes",
                f"{limits.max_cell_bytes} bytes per cell",
                "FILE_MAX_CELL_BYTES",
            )


def _bytes_per_line(path: Path) -> float:
    with path.open("rb") as handle:
        head = handle.read(1024 * 1024)
    return len(head) / max(1, head.count(b"\n"))


def _rows_per_piece(bytes_per_row: float) -> int:
    return max(1, min(MAX_PIECE_ROWS, int(PIECE_BYTES / max(1.0, bytes_per_row))))


def _starts_an_array(path: Path) -> bool:
    with path.open("rb") as handle:
        head = handle.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    return head.startswith(b"[")


@dataclass
class _Labels:
    """The label column across pieces: the task's ids or scores, or a tally of the values as written."""

    task: GlueTask | None
    counts: Counter[Any] = field(default_factory=Counter)
    # The first rows (numbered as the file's) of each value, for a stray value's refusal: a job on the
    # upload reads its tally, not its rows (shared/admission/data_checks.py).
    first_rows: dict[Any, list[int]] = field(default_factory=dict)
    ids: np.ndarray | None = None  # a task's classes: rows per id
    scores: list[float] = field(default_factory=lambda: [math.inf, -math.inf, 0.0, 0.0])  # min max sum n
    labelled: int = 0
    missing: int = 0

    def add(self, table: Table, *, labels_required: bool) -> None:
        import numpy as np
        import pandas as pd

        if self.task is not None:
            ids = _task_label_ids(table, self.task, labels_required)
            if ids is None:
                self.missing += len(table.frame)
            elif self.task.label_names is None:
                self._scores(ids.astype(np.float64))
            else:
                tally = np.bincount(ids, minlength=len(self.task.label_names))
                self.ids = tally if self.ids is None else self.ids + tally
            return
        if LABEL not in table.frame.columns:
            if labels_required:
                _column(table, LABEL)  # the refusal, naming the columns there are
            self.missing += len(table.frame)
            return
        labels = table.frame[LABEL]
        _check_no_empty_labels(table, labels)
        self.labelled += len(labels)
        if len(self.counts) <= MAX_CLASSES:
            self.counts.update(labels.tolist())
            self._note_rows(table, labels)
        else:  # past any classification: only scores can be this many
            numbers = pd.to_numeric(labels, errors="coerce").to_numpy(dtype=np.float64)
            if not np.isfinite(numbers).all():
                raise self._neither(table.where)
            self._scores(numbers)

    def _note_rows(self, table: Table, labels: pd.Series) -> None:
        import numpy as np
        import pandas as pd

        # One pass over the piece: each value's first few rows (the values already noted in full skip).
        rows = pd.DataFrame({"value": labels.to_numpy(), "row": np.arange(len(labels))})
        for value, row in rows.groupby("value", sort=False).head(STRAY_ROWS_SHOWN).itertuples(index=False):
            noted = self.first_rows.setdefault(value, [])
            if len(noted) < STRAY_ROWS_SHOWN:
                noted.append(int(table.row_number(int(row))))

    def _scores(self, values: np.ndarray) -> None:
        low, high, total, n = self.scores
        self.scores = [min(low, values.min()), max(high, values.max()), total + values.sum(), n + len(values)]

    def summary(self, where: str) -> dict[str, Any]:
        if self.task is None and self.counts:
            return self._own_labels(where)
        if self.task is not None and self.task.label_names is not None and self.ids is not None:
            counts = {name: int(n) for name, n in zip(self.task.label_names, self.ids, strict=True)}
            return {"labels": "classes", "label_counts": counts}
        if self.scores[3]:
            low, high, total, n = map(float, self.scores)
            return {"labels": "scores", "score_range": {"min": low, "max": high, "mean": round(total / n, 4)}}
        return {"labels": "none"}

    def _own_labels(self, where: str) -> dict[str, Any]:
        """A job on its own files: ids or names are classes, numbers with a fraction are scores (the
        reading rule's `_numbers_if_numeric`, decided over every distinct value)."""
        import numpy as np
        import pandas as pd

        values = list(self.counts)
        text = all(isinstance(value, str) for value in values)
        column = _numbers_if_numeric(pd.Series(values, dtype=str)) if text else pd.Series(values)
        if pd.api.types.is_float_dtype(column) or len(values) > MAX_CLASSES:
            if not pd.api.types.is_numeric_dtype(column):
                raise self._neither(where)
            weights = np.array([self.counts[value] for value in values], dtype=np.float64)
            numbers = column.to_numpy(dtype=np.float64)
            low, high, total, n = self.scores
            self.scores = [
                min(low, numbers.min()),
                max(high, numbers.max()),
                total + float((numbers * weights).sum()),
                n + float(weights.sum()),
            ]
            self.counts = Counter()
            return self.summary(where)
        merged: Counter[Any] = Counter()
        for value, number in zip(values, column.tolist(), strict=True):
            merged[number] += self.counts[value]
        try:
            ordered = sorted(merged)
        except TypeError:
            raise InvalidRequest(
                f"{where} mixes label types (e.g. numbers and strings) in column {LABEL!r}", field=FIELD
            ) from None
        counts = {str(name): merged[name] for name in ordered}
        strays = {rarer for rarer, _other, _how, stray in label_pairs(counts) if stray}
        rows = {str(value): noted for value, noted in self.first_rows.items() if str(value) in strays}
        return {"labels": "classes", "label_counts": counts, **({"label_rows": rows} if rows else {})}

    @staticmethod
    def _neither(where: str) -> InvalidRequest:
        return InvalidRequest(
            f"{where} has more than {MAX_CLASSES} distinct labels that are not all numbers: neither "
            "classes nor scores",
            field=FIELD,
        )
