"""GLUE task resolution, loading and tokenisation. DB-free, Accelerate-free.

`load_raw_data` turns a job spec into text columns plus a `label` column of ids (or float scores),
read from, in this order: the spec's own files under GLUEJOBS_DATA_DIR; a local GLUE copy in the
original release layout (GLUEJOBS_GLUE_DIR); the Hub's nyu-mll/glue. Every source ends up with the
Hub's column names, so one code path checks labels and texts. `tokenize_data` tokenises as
run_glue_no_trainer.py does and caches the result on disk, keyed by what determines it.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pandas as pd
import transformers
from datasets.fingerprint import Hasher
from transformers import PreTrainedTokenizerBase

from shared.config import Settings
from shared.errors import InvalidSpec, JobFailed
from shared.spec import JobSpec, resolve_under
from shared.tasks import TASKS, GlueTask

logger = logging.getLogger(__name__)

LABEL = "label"
LABELS = "labels"  # the column name the models' forward() takes
HUB_GLUE = "nyu-mll/glue"
# Bump when the way rows are read or tokenised changes, so older cache entries are not reused.
CACHE_FORMAT = 1
# Row ids, never text: the Hub's parquet exports carry `idx`, which run_glue would take for a sentence.
_ID_COLUMNS = frozenset({"idx", "id"})
_TSV_OPTIONS: dict[str, Any] = {
    # GLUE files hold unbalanced quotes (MRPC) and words like "null"/"NA" that are text, not missing values.
    "sep": "\t",
    "quoting": csv.QUOTE_NONE,
    "encoding": "utf-8-sig",
    "keep_default_na": False,
    "dtype": str,
    "engine": "c",
}


class DataError(JobFailed):
    """The job's data could not be loaded."""


@dataclass
class RawData:
    train: datasets.Dataset
    evals: dict[str, datasets.Dataset]  # gluejobs split name ("eval", "eval_mismatched") -> rows
    test: datasets.Dataset | None  # spec.test_file only; its `label` column is optional
    text_keys: tuple[str, str | None]
    is_regression: bool
    label_names: list[str] | None  # in id order (config.id2label); None for regression
    fingerprint: str  # identifies the source rows: files and their versions, or Hub fingerprints


@dataclass
class TokenizedData:
    train: datasets.Dataset
    evals: dict[str, datasets.Dataset]
    test: datasets.Dataset | None
    cache_hit: bool
    cache_key: str


@dataclass
class _Table:
    """Rows from one source, with the Hub's column names, before labels are checked."""

    frame: pd.DataFrame
    where: str  # names the source in error messages
    fingerprint: str
    field: str | None = None  # the spec field it came from, for DataError.field


@dataclass
class _Rows:
    """A split ready for the model: text columns and labels, plus the table it came from."""

    dataset: datasets.Dataset
    table: _Table


# ------------------------------------------------------------------------------------------------
# Loading
# ------------------------------------------------------------------------------------------------


def load_raw_data(spec: JobSpec, settings: Settings) -> RawData:
    """The job's train, eval and test rows, with text columns and a `label` column of ids or scores.

    With a task_name, the spec's files (when given) replace the task's train or eval splits; the
    rest come from GLUEJOBS_GLUE_DIR or the Hub. Eval splits are left out when the job never
    evaluates (eval_strategy "no") and no validation_file names them.
    """
    files = _read_spec_files(spec, settings)
    if spec.task_name is None:
        train, evals, test, text_keys, is_regression, label_names = _own_file_splits(files)
    else:
        task = TASKS[spec.task_name]
        train, evals, test = _task_splits(task, files, settings, want_evals=spec.evaluates)
        text_keys, is_regression = task.text_keys, task.is_regression
        label_names = list(task.label_names) if task.label_names else None
    train = _first_rows(train, spec.max_train_samples)
    evals = {name: _first_rows(rows, spec.max_eval_samples) for name, rows in evals.items()}
    fingerprint = _digest(
        {
            "task": spec.task_name,
            "max_train_samples": spec.max_train_samples,
            "max_eval_samples": spec.max_eval_samples,
            "sources": {name: table.fingerprint for name, table in _sources(files, evals, train).items()},
        }
    )
    return RawData(
        train=train.dataset,
        evals={name: rows.dataset for name, rows in evals.items()},
        test=test.dataset if test else None,
        text_keys=text_keys,
        is_regression=is_regression,
        label_names=label_names,
        fingerprint=fingerprint,
    )


def _sources(files: dict[str, _Table], evals: dict[str, _Rows], train: _Rows) -> dict[str, _Table]:
    sources = {"train": train.table, **{name: rows.table for name, rows in evals.items()}}
    if "test_file" in files:
        sources["test"] = files["test_file"]
    return sources


def _first_rows(rows: _Rows, limit: int | None) -> _Rows:
    # run_glue.py's max_train_samples / max_eval_samples: the first N rows, not a random sample.
    if limit is None or limit >= len(rows.dataset):
        return rows
    return _Rows(rows.dataset.select(range(limit)), rows.table)


# --- the spec's own files ------------------------------------------------------------------------


def _read_spec_files(spec: JobSpec, settings: Settings) -> dict[str, _Table]:
    tables: dict[str, _Table] = {}
    for field in ("train_file", "validation_file", "test_file"):
        value = getattr(spec, field)
        if value is not None:
            tables[field] = _read_data_file(settings.data_dir, value, field=field)
    return tables


def _read_data_file(data_dir: Path, value: str, *, field: str) -> _Table:
    # The stored spec was checked by the API, but a worker must not trust the database with paths.
    try:
        path = resolve_under(data_dir, value, field=field)
    except InvalidSpec as exc:
        raise DataError(exc.message, field=field) from exc
    shown = path.relative_to(data_dir.resolve()).as_posix()
    where = f"{field} {shown!r}"
    if not path.is_file():
        raise DataError(f"{where} not found in GLUEJOBS_DATA_DIR ({data_dir})", field=field)
    frame = _read_frame(path, where, field=field)
    return _Table(frame, where, _file_fingerprint(path), field)


def _read_frame(path: Path, where: str, *, field: str | None) -> pd.DataFrame:
    try:
        frame = _read_by_suffix(path)
    except (ValueError, OSError) as exc:  # parser, decoding and Arrow errors all derive from these
        raise DataError(f"could not read {where}: {exc}", field=field) from exc
    if frame.empty:
        raise DataError(f"{where} has no rows", field=field)
    return frame


def _read_by_suffix(path: Path) -> pd.DataFrame:
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
    # Like the `json` loader of datasets, .json may hold one array of records or JSON lines.
    options: dict[str, Any] = {"dtype": False, "convert_dates": False}
    if lines:
        return pd.read_json(path, lines=True, **options)
    try:
        return pd.read_json(path, **options)
    except ValueError:
        return pd.read_json(path, lines=True, **options)


def _numbers_if_numeric(values: pd.Series) -> pd.Series:
    if values.str.strip().eq("").any():
        return values  # an empty label is reported by the label checks, with its row
    try:
        numbers = pd.to_numeric(values)
    except (ValueError, TypeError):
        return values
    return numbers.astype("int64" if pd.api.types.is_integer_dtype(numbers) else "float64")


def _file_fingerprint(path: Path) -> str:
    stat = path.stat()
    return f"{path}:{stat.st_size}:{stat.st_mtime_ns}"


# --- a job on its own files (no task_name) -------------------------------------------------------


def _own_file_splits(
    files: dict[str, _Table],
) -> tuple[_Rows, dict[str, _Rows], _Rows | None, tuple[str, str | None], bool, list[str] | None]:
    train = files.get("train_file")
    if train is None:
        raise DataError("a job without a task_name needs a train_file", field="train_file")
    text_keys = _infer_text_keys(train)
    labels = _column(train, LABEL)
    _check_no_empty_labels(train, labels)
    is_regression = pd.api.types.is_float_dtype(labels)
    label_names: list[str] | None = None
    mapping: dict[Any, int] = {}
    if not is_regression:
        ordered = _sorted_unique(train, labels)
        mapping = {value: index for index, value in enumerate(ordered)}
        label_names = [str(value) for value in ordered]

    def rows(table: _Table, *, labels_required: bool) -> _Rows:
        ids = _own_label_ids(table, mapping, is_regression, required=labels_required)
        return _Rows(_to_dataset(table, text_keys, ids), table)

    train_rows = rows(train, labels_required=True)
    evals = {}
    if "validation_file" in files:
        evals["eval"] = rows(files["validation_file"], labels_required=True)
    test = rows(files["test_file"], labels_required=False) if "test_file" in files else None
    return train_rows, evals, test, text_keys, is_regression, label_names


def _infer_text_keys(table: _Table) -> tuple[str, str | None]:
    # run_glue_no_trainer.py's rule, minus row-id columns.
    names = [str(c) for c in table.frame.columns if c != LABEL and str(c).lower() not in _ID_COLUMNS]
    if "sentence1" in names and "sentence2" in names:
        return "sentence1", "sentence2"
    if len(names) >= 2:
        return names[0], names[1]
    if names:
        return names[0], None
    raise DataError(f"{table.where} has no text column besides {LABEL!r}", field=table.field)


def _sorted_unique(table: _Table, labels: pd.Series) -> list[Any]:
    try:
        return sorted(labels.unique().tolist())
    except TypeError as exc:
        raise DataError(
            f"{table.where} mixes label types (e.g. numbers and strings) in column {LABEL!r}",
            field=table.field,
        ) from exc


def _own_label_ids(
    table: _Table, mapping: dict[Any, int], is_regression: bool, *, required: bool
) -> np.ndarray | None:
    if LABEL not in table.frame.columns:
        if required:
            raise DataError(f"{table.where} has no {LABEL!r} column", field=table.field)
        return None
    labels = table.frame[LABEL]
    _check_no_empty_labels(table, labels)
    if is_regression:
        return _scores(table, labels)
    ids = labels.map(mapping)
    unseen = ids.isna()
    if unseen.any():
        row = int(np.flatnonzero(unseen.to_numpy())[0])
        raise DataError(
            f"{table.where}: label {_shown(labels.iloc[row])} on row {row + 1} does not occur in the "
            f"train_file (its labels: {', '.join(map(repr, mapping))})",
            field=table.field,
        )
    return ids.to_numpy(dtype=np.int64)


def _check_no_empty_labels(table: _Table, labels: pd.Series) -> None:
    empty = labels.isna() | labels.astype(str).str.strip().eq("")
    if empty.any():
        row = int(np.flatnonzero(empty.to_numpy())[0])
        raise DataError(f"{table.where}: empty label on row {row + 1}", field=table.field)


# --- a GLUE task ---------------------------------------------------------------------------------


def _task_splits(
    task: GlueTask, files: dict[str, _Table], settings: Settings, *, want_evals: bool
) -> tuple[_Rows, dict[str, _Rows], _Rows | None]:
    needed = []
    if "train_file" not in files:
        needed.append("train")
    if "validation_file" not in files and want_evals:
        needed.extend(split for split, _ in task.eval_splits)
    glue = _glue_tables(task, settings, needed) if needed else {}
    train_table = files.get("train_file") or glue["train"]
    if "validation_file" in files:
        eval_tables = {"eval": files["validation_file"]}
    else:
        eval_tables = {split: glue[split] for split, _ in task.eval_splits if split in glue}

    def rows(table: _Table, *, labels_required: bool) -> _Rows:
        return _Rows(_to_dataset(table, task.text_keys, _task_label_ids(table, task, labels_required)), table)

    train = rows(train_table, labels_required=True)
    evals = {split: rows(table, labels_required=True) for split, table in eval_tables.items()}
    test = rows(files["test_file"], labels_required=False) if "test_file" in files else None
    return train, evals, test


def _task_label_ids(table: _Table, task: GlueTask, required: bool) -> np.ndarray | None:
    """Label ids (or STS-B scores) for a task; names ("entailment") and ids ("0") are both accepted."""
    if LABEL not in table.frame.columns:
        if required:
            raise DataError(f"{table.where} has no {LABEL!r} column", field=table.field)
        return None
    labels = table.frame[LABEL]
    if not required and labels.astype(str).str.strip().eq("-1").all():
        return None  # a GLUE test split: every label is -1, meaning "not published"
    _check_no_empty_labels(table, labels)
    if task.label_names is None:
        return _scores(table, labels)
    return _class_ids(table, labels, task.label_names)


def _class_ids(table: _Table, labels: pd.Series, names: tuple[str, ...]) -> np.ndarray:
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
        raise DataError(_bad_label_message(table, _shown(labels.iloc[row]), row, names), field=table.field)
    return ids.astype(np.int64)


def _bad_label_message(table: _Table, shown: str, row: int, names: tuple[str, ...]) -> str:
    expected = f"0..{len(names) - 1} or one of {', '.join(names)}"
    message = f"{table.where}: label {shown} on row {row + 1} does not fit the task (expected {expected})"
    if shown.strip("'") == "-1":
        message += "; -1 marks GLUE test rows, which have no published labels"
    return message


def _shown(value: Any) -> str:
    """A label as the user wrote it: 7 or 'maybe', not np.int64(7)."""
    return repr(value.item() if isinstance(value, np.generic) else value)


def _scores(table: _Table, labels: pd.Series) -> np.ndarray:
    scores = pd.to_numeric(labels, errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(scores)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DataError(
            f"{table.where}: label {_shown(labels.iloc[row])} on row {row + 1} is not a number (a regression "
            "task needs numeric scores)",
            field=table.field,
        )
    return scores.astype(np.float32)


def _column(table: _Table, name: str) -> pd.Series:
    if name not in table.frame.columns:
        columns = ", ".join(map(str, table.frame.columns))
        raise DataError(f"{table.where} has no {name!r} column (its columns: {columns})", field=table.field)
    return table.frame[name]


def _to_dataset(
    table: _Table, text_keys: tuple[str, str | None], labels: np.ndarray | None
) -> datasets.Dataset:
    columns: dict[str, Any] = {key: _texts(table, key) for key in text_keys if key is not None}
    if labels is not None:
        columns[LABEL] = labels
    return datasets.Dataset.from_pandas(pd.DataFrame(columns), preserve_index=False)


def _texts(table: _Table, key: str) -> pd.Series:
    texts = _column(table, key)
    missing = texts.isna()
    if missing.any():
        row = int(np.flatnonzero(missing.to_numpy())[0])
        raise DataError(f"{table.where}: no {key!r} text on row {row + 1}", field=table.field)
    return texts.astype(str).reset_index(drop=True)


# --- the task's own splits: a local GLUE copy, else the Hub ----------------------------------------


@dataclass(frozen=True)
class _GlueLayout:
    """Where a task lives in the original GLUE release, and its columns' names there."""

    folder: str
    columns: dict[str, str]  # column in the TSV -> the Hub's column name
    eval_files: tuple[tuple[str, str], ...] = (("eval", "dev.tsv"),)
    header: tuple[str, ...] | None = None  # column names of a file without a header row (CoLA)


_ENTAILMENT_COLUMNS = {"sentence1": "sentence1", "sentence2": "sentence2", "label": "label"}
GLUE_LAYOUTS: dict[str, _GlueLayout] = {
    "cola": _GlueLayout(
        "CoLA",
        {"sentence": "sentence", "label": "label"},
        header=("source", "label", "original_label", "sentence"),
    ),
    "sst2": _GlueLayout("SST-2", {"sentence": "sentence", "label": "label"}),
    "mrpc": _GlueLayout("MRPC", {"#1 String": "sentence1", "#2 String": "sentence2", "Quality": "label"}),
    "stsb": _GlueLayout("STS-B", {"sentence1": "sentence1", "sentence2": "sentence2", "score": "label"}),
    "qqp": _GlueLayout("QQP", {"question1": "question1", "question2": "question2", "is_duplicate": "label"}),
    "mnli": _GlueLayout(
        "MNLI",
        {"sentence1": "premise", "sentence2": "hypothesis", "gold_label": "label"},
        eval_files=(("eval", "dev_matched.tsv"), ("eval_mismatched", "dev_mismatched.tsv")),
    ),
    "qnli": _GlueLayout("QNLI", {"question": "question", "sentence": "sentence", "label": "label"}),
    "rte": _GlueLayout("RTE", _ENTAILMENT_COLUMNS),
    "wnli": _GlueLayout("WNLI", _ENTAILMENT_COLUMNS),
}


def _glue_tables(task: GlueTask, settings: Settings, splits: list[str]) -> dict[str, _Table]:
    if settings.glue_dir is not None:
        return _local_glue_tables(task, settings.glue_dir, splits)
    return _hub_glue_tables(task, splits)


def _local_glue_tables(task: GlueTask, glue_dir: Path, splits: list[str]) -> dict[str, _Table]:
    layout = GLUE_LAYOUTS[task.name]
    folder = glue_dir.resolve() / layout.folder
    files = dict((("train", "train.tsv"), *layout.eval_files))
    if not folder.is_dir():
        expected = ", ".join(f"{layout.folder}/{files[split]}" for split in splits)
        raise DataError(
            f"GLUE folder {layout.folder!r} for task {task.name!r} not found in GLUEJOBS_GLUE_DIR "
            f"({glue_dir}); expected {expected} there"
        )
    return {split: _read_glue_tsv(folder / files[split], layout) for split in splits}


def _read_glue_tsv(path: Path, layout: _GlueLayout) -> _Table:
    where = f"GLUE file {layout.folder}/{path.name}"
    if not path.is_file():
        raise DataError(f"{where} not found: expected it at {path} (under GLUEJOBS_GLUE_DIR)")
    wanted = layout.columns
    options = {**_TSV_OPTIONS, "usecols": lambda column: column in wanted}
    if layout.header is not None:
        options |= {"header": None, "names": list(layout.header)}
    try:
        frame = pd.read_csv(path, **options)
    except (ValueError, OSError) as exc:
        raise DataError(f"could not read {where}: {exc}") from exc
    missing = [column for column in wanted if column not in frame.columns]
    if missing:
        raise DataError(f"{where} has no column {', '.join(map(repr, missing))} in its header row")
    return _Table(frame.rename(columns=wanted), where, _file_fingerprint(path))


def _hub_glue_tables(task: GlueTask, splits: list[str]) -> dict[str, _Table]:
    hub_splits = dict((("train", "train"), *task.eval_splits))
    try:
        loaded = datasets.load_dataset(HUB_GLUE, task.name)
    except Exception as exc:  # network, authentication, missing cache: all mean "not available here"
        raise DataError(
            f"could not load GLUE task {task.name!r} from the Hugging Face Hub ({exc}); "
            "set GLUEJOBS_GLUE_DIR to a local GLUE copy"
        ) from exc
    tables: dict[str, _Table] = {}
    for split in splits:
        dataset = loaded[hub_splits[split]]
        where = f"the Hub's {HUB_GLUE} {task.name} {hub_splits[split]!r} split"
        tables[split] = _Table(dataset.to_pandas(), where, f"hub:{dataset._fingerprint}")
    return tables


# ------------------------------------------------------------------------------------------------
# Tokenisation and its cache
# ------------------------------------------------------------------------------------------------


def tokenize_data(
    raw: RawData,
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_length: int,
    pad_to_max_length: bool,
    cache_dir: Path,
) -> TokenizedData:
    """Tokenised splits with only the tokenizer's outputs and `labels`, from the cache when possible."""
    key = cache_key(raw, tokenizer, max_length=max_length, pad_to_max_length=pad_to_max_length)
    entry = cache_dir / "tokenized" / key
    expected_rows = _split_rows(raw)
    cached = _load_cache_entry(entry, expected_rows)
    if cached is not None:
        logger.info("tokenised data found in the cache (%s)", entry)
        return _tokenized_data(cached, cache_hit=True, cache_key=key)
    splits = _tokenize_splits(raw, tokenizer, max_length=max_length, pad_to_max_length=pad_to_max_length)
    stored = _store_cache_entry(splits, entry)
    # Reading back what was stored gives memory-mapped splits, exactly as a later cache hit will see them.
    reloaded = _load_cache_entry(entry, expected_rows) if stored else None
    return _tokenized_data(reloaded if reloaded is not None else splits, cache_hit=False, cache_key=key)


def cache_key(
    raw: RawData, tokenizer: PreTrainedTokenizerBase, *, max_length: int, pad_to_max_length: bool
) -> str:
    """What the tokenised rows depend on: the source rows, how labels read, and the tokenizer."""
    return _digest(
        {
            "format": CACHE_FORMAT,
            "source": raw.fingerprint,
            "rows": _split_rows(raw),
            "text_keys": list(raw.text_keys),
            "label_names": raw.label_names,
            "is_regression": raw.is_regression,
            "max_length": max_length,
            "pad_to_max_length": pad_to_max_length,
            "tokenizer": tokenizer_fingerprint(tokenizer),
        }
    )


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    # datasets' Hasher pickles the tokenizer (vocabulary, normaliser, special tokens, init kwargs);
    # the result is the same in every process (tests check this), unlike Python's hash().
    kind = f"{type(tokenizer).__module__}.{type(tokenizer).__qualname__}"
    return f"{kind}:{transformers.__version__}:{Hasher.hash(tokenizer)}"


def _split_rows(raw: RawData) -> dict[str, int]:
    splits = {"train": raw.train, **raw.evals}
    if raw.test is not None:
        splits["test"] = raw.test
    return {name: len(rows) for name, rows in splits.items()}


def _tokenize_splits(
    raw: RawData, tokenizer: PreTrainedTokenizerBase, *, max_length: int, pad_to_max_length: bool
) -> datasets.DatasetDict:
    text_keys = raw.text_keys
    label_type = datasets.Value("float32" if raw.is_regression else "int64")

    def preprocess(examples: dict[str, list[Any]]) -> dict[str, Any]:
        first, second = text_keys
        texts = (examples[first],) if second is None else (examples[first], examples[second])
        result = dict(
            tokenizer(
                *texts,
                padding="max_length" if pad_to_max_length else False,
                max_length=max_length,
                truncation=True,
            )
        )
        if LABEL in examples:
            result[LABELS] = examples[LABEL]
        return result

    def tokenize(rows: datasets.Dataset) -> datasets.Dataset:
        tokenized = rows.map(
            preprocess,
            batched=True,
            remove_columns=rows.column_names,
            load_from_cache_file=False,
            desc="Running tokenizer on dataset",
        )
        return tokenized.cast_column(LABELS, label_type) if LABELS in tokenized.column_names else tokenized

    splits = {"train": raw.train, **raw.evals}
    if raw.test is not None:
        splits["test"] = raw.test
    return datasets.DatasetDict({name: tokenize(rows) for name, rows in splits.items()})


def _tokenized_data(splits: datasets.DatasetDict, *, cache_hit: bool, cache_key: str) -> TokenizedData:
    return TokenizedData(
        train=splits["train"],
        evals={name: rows for name, rows in splits.items() if name not in ("train", "test")},
        test=splits.get("test"),
        cache_hit=cache_hit,
        cache_key=cache_key,
    )


def _load_cache_entry(entry: Path, expected_rows: dict[str, int]) -> datasets.DatasetDict | None:
    if not entry.is_dir():
        return None
    try:
        splits = datasets.load_from_disk(str(entry))
        if not isinstance(splits, datasets.DatasetDict):
            raise ValueError(f"a {type(splits).__name__}, not a DatasetDict")
        found = {name: len(rows) for name, rows in splits.items()}
        if found != expected_rows:
            raise ValueError(f"rows per split {found}, expected {expected_rows}")
    except Exception as exc:  # whatever a damaged folder raises, the job tokenises again instead
        logger.warning("ignoring the damaged tokenised-data cache entry %s: %s", entry, exc)
        _discard(entry)
        return None
    return splits


def _store_cache_entry(splits: datasets.DatasetDict, entry: Path) -> bool:
    """Write `entry` atomically: save into a private folder, then rename it into place.

    Two workers tokenising the same data both save; the second rename fails on the now non-empty
    folder and that worker drops its copy. Readers never see a half-written entry.
    """
    partial = entry.with_name(f".{entry.name}.{uuid.uuid4().hex}.partial")
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        splits.save_to_disk(str(partial))
        os.rename(partial, entry)
    except Exception as exc:  # a full disk or a read-only cache must not fail the job; it only costs time
        shutil.rmtree(partial, ignore_errors=True)
        if entry.is_dir():
            logger.info("another process cached the same tokenised data first (%s)", entry)
            return True
        logger.warning("could not cache tokenised data at %s: %s", entry, exc)
        return False
    logger.info("tokenised data cached at %s", entry)
    return True


def _discard(entry: Path) -> None:
    # Rename first, so a concurrent writer can put a good entry in place while the bad one is deleted.
    doomed = entry.with_name(f".{entry.name}.{uuid.uuid4().hex}.discarded")
    try:
        os.rename(entry, doomed)
    except OSError:
        return  # someone else removed or replaced it already
    shutil.rmtree(doomed, ignore_errors=True)


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()
