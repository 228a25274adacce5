"""GLUE task loading for training, and tokenisation. DB-free, Accelerate-free.

Reading files and checking labels is shared/data/reading.py's (the API runs the same checks at
submission); this module turns its rows into `datasets` splits, reads the Hub's GLUE when there is
no local copy, and tokenises as run_glue_no_trainer.py does, caching the result on disk, keyed by
what determines it.
"""

from __future__ import annotations

import hashlib
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
import pyarrow.compute
import torch
import transformers
from datasets.fingerprint import Hasher
from transformers import PreTrainedTokenizerBase

from shared.core.config import Settings
from shared.data.reading import (
    GLUE_LAYOUTS,
    HUB_GLUE,
    LABEL,
    DataError,
    Split,
    Table,
    digest,
    model_labels,
    read_job_data,
    reads_model_labels,
)
from shared.jobspec.spec import JobSpec
from shared.jobspec.tasks import GlueTask
from shared.model_folders.model_size import read_config

__all__ = ["GLUE_LAYOUTS", "DataError", "RawData", "TokenizedData", "load_raw_data", "tokenize_data"]

logger = logging.getLogger(__name__)

LABELS = "labels"  # the column name the models' forward() takes
# Bump when the way rows are read or tokenised changes, so older cache entries are not reused.
CACHE_FORMAT = 1


@dataclass
class RawData:
    train: datasets.Dataset | None  # None for a job that does not train (do_train false)
    evals: dict[str, datasets.Dataset]  # gluejobs split name ("eval", "eval_mismatched") -> rows
    test: datasets.Dataset | None  # spec.test_file only; its `label` column is optional
    text_keys: tuple[str, str | None]
    is_regression: bool
    label_names: list[str] | None  # in id order (config.id2label); None for regression
    fingerprint: str  # identifies the source rows: files and their versions, or Hub fingerprints


@dataclass
class TokenizedData:
    train: datasets.Dataset | None
    evals: dict[str, datasets.Dataset]
    test: datasets.Dataset | None
    cache_hit: bool
    cache_key: str


# ------------------------------------------------------------------------------------------------
# Loading
# ------------------------------------------------------------------------------------------------


def load_raw_data(spec: JobSpec, settings: Settings, *, model_folder: str | None = None) -> RawData:
    """The job's train, eval and test rows as `datasets` splits (see shared.data.reading.read_job_data).
    An evaluation or prediction job without a task_name or train_file reads its labels by its model's
    config (`model_folder`'s config.json: id2label, num_labels 1 a regression)."""
    labels = None
    if reads_model_labels(spec):
        config = read_config(Path(model_folder) / "config.json") if model_folder is not None else None
        labels = model_labels(config)
        if not labels.known:
            raise DataError(
                "the model has no readable config.json to take its labels from (id2label): give a task_name",
                field="model_name_or_path",
            )
    data = read_job_data(spec, settings, hub=hub_glue_tables, labels=labels)
    assert data.train is not None or not spec.trains, "a worker reads every split (it has the Hub)"
    return RawData(
        train=to_dataset(data.train) if data.train is not None else None,
        evals={name: to_dataset(rows) for name, rows in data.evals.items()},
        test=to_dataset(data.test) if data.test else None,
        text_keys=data.text_keys,
        is_regression=data.is_regression,
        label_names=data.label_names,
        fingerprint=data.fingerprint,
    )


def to_dataset(rows: Split) -> datasets.Dataset:
    columns: dict[str, Any] = {str(name): values for name, values in rows.texts.items()}
    if rows.labels is not None:
        columns[LABEL] = rows.labels
    return datasets.Dataset.from_pandas(pd.DataFrame(columns), preserve_index=False)


def hub_glue_tables(task: GlueTask, splits: list[str]) -> dict[str, Table]:
    """The task's splits from the Hub's nyu-mll/glue (the worker's HubReader)."""
    hub_splits = dict((("train", "train"), *task.eval_splits))
    loaded = load_hub_glue(task.name)
    tables: dict[str, Table] = {}
    for split in splits:
        dataset = loaded[hub_splits[split]]
        where = f"the Hub's {HUB_GLUE} {task.name} {hub_splits[split]!r} split"
        tables[split] = Table(dataset.to_pandas(), where, f"hub:{dataset._fingerprint}")
    return tables


def load_hub_glue(config: str) -> datasets.DatasetDict:
    try:
        return datasets.load_dataset(HUB_GLUE, config)
    except Exception as exc:  # network, authentication, missing cache: all mean "not available here"
        raise DataError(
            f"could not load GLUE task {config!r} from the Hugging Face Hub ({exc}); "
            "set GLUEJOBS_GLUE_DIR to a local GLUE copy"
        ) from exc


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
    key = cache_key(
        raw,
        tokenizer,
        max_length=max_length,
        pad_to_max_length=pad_to_max_length,
        fingerprint_dir=cache_dir / "tokenizer-fingerprints",
    )
    entry = cache_dir / "tokenized" / key
    expected_rows = _split_rows(raw)
    cached = _load_cache_entry(entry, expected_rows)
    if cached is not None:
        logger.info("tokenised data found in the cache (%s)", entry)
        return _tokenized_data(cached, cache_hit=True, cache_key=key)
    splits = _tokenize_splits(
        raw, tokenizer, max_length=max_length, pad_to_max_length=pad_to_max_length, cache_key=key
    )
    stored = _store_cache_entry(splits, entry)
    # Reading back what was stored gives memory-mapped splits, exactly as a later cache hit will see them.
    reloaded = _load_cache_entry(entry, expected_rows) if stored else None
    return _tokenized_data(reloaded if reloaded is not None else splits, cache_hit=False, cache_key=key)


def cache_key(
    raw: RawData,
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_length: int,
    pad_to_max_length: bool,
    fingerprint_dir: Path | None = None,
) -> str:
    """What the tokenised rows depend on: the source rows, how labels read, and the tokenizer."""
    return digest(
        {
            "format": CACHE_FORMAT,
            "source": raw.fingerprint,
            "rows": _split_rows(raw),
            "text_keys": list(raw.text_keys),
            "label_names": raw.label_names,
            "is_regression": raw.is_regression,
            "max_length": max_length,
            "pad_to_max_length": pad_to_max_length,
            "tokenizer": tokenizer_fingerprint(tokenizer, memo_dir=fingerprint_dir),
        }
    )


# Files of a model folder that a tokenizer is never loaded from (and that are too big to hash per job).
_WEIGHT_SUFFIXES = frozenset(
    {".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".onnx", ".ckpt", ".gguf"}
)


# Fingerprints computed in this process, by the digest of their tokenizer's class, version and files.
_FINGERPRINTS: dict[str, str] = {}


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase, *, memo_dir: Path | None = None) -> str:
    # datasets' Hasher pickles the tokenizer (vocabulary, normaliser, special tokens, init kwargs);
    # the result is the same in every process (tests check this), unlike Python's hash().
    kind = f"{type(tokenizer).__module__}.{type(tokenizer).__qualname__}"
    # Pickling a tokenizer costs about half a second per job; a tokenizer loaded from a local folder
    # is fully determined by its class, the library version and the folder's files, so its
    # fingerprint is kept in `memo_dir` under the digest of those (and in this process's memory, for
    # a process that trains more than once: the in-process tests).
    source = _tokenizer_source(tokenizer)
    memo_key = digest([kind, transformers.__version__, source]) if source else None
    memo = memo_dir / f"{memo_key}.txt" if memo_dir and memo_key else None
    if memo is not None and memo.is_file():
        return memo.read_text()
    fingerprint = _FINGERPRINTS.get(memo_key) if memo_key else None  # a process that tokenises again
    if fingerprint is None:
        fingerprint = f"{kind}:{transformers.__version__}:{Hasher.hash(tokenizer)}"
        if memo_key is not None:
            _FINGERPRINTS[memo_key] = fingerprint
    if memo is not None:
        memo.parent.mkdir(parents=True, exist_ok=True)
        partial = memo.with_name(f"{memo.name}.{uuid.uuid4().hex}")
        partial.write_text(fingerprint)
        os.replace(partial, memo)  # whole or absent, whoever writes it
    return fingerprint


def _tokenizer_source(tokenizer: PreTrainedTokenizerBase) -> dict[str, str] | None:
    """The sha256 of every file of the local folder the tokenizer came from but its weights (the
    tokenizer's own files and the config.json AutoTokenizer reads); None when it was not loaded from
    a local folder."""
    folder = Path(tokenizer.name_or_path)
    if not tokenizer.name_or_path or not folder.is_dir():
        return None
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix not in _WEIGHT_SUFFIXES)
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def _raw_splits(raw: RawData) -> dict[str, datasets.Dataset]:
    splits = {"train": raw.train} if raw.train is not None else {}
    splits.update(raw.evals)
    if raw.test is not None:
        splits["test"] = raw.test
    return splits


def _split_rows(raw: RawData) -> dict[str, int]:
    return {name: len(rows) for name, rows in _raw_splits(raw).items()}


def _tokenize_splits(
    raw: RawData,
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_length: int,
    pad_to_max_length: bool,
    cache_key: str,
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

    def tokenize(name: str, rows: datasets.Dataset) -> datasets.Dataset:
        # The result's fingerprint is named, from the cache key (which already covers the rows, the
        # labels, the lengths and the tokenizer) and the split: left to itself, datasets hashes the
        # function, pickling the tokenizer it closes over for every split (0.3-0.5 s each, 1-1.5 s
        # of every job's start measured on a 2-core machine), to compute what the key says already.
        tokenized = rows.map(
            preprocess,
            batched=True,
            remove_columns=rows.column_names,
            load_from_cache_file=False,
            new_fingerprint=digest([cache_key, name]),
            desc="Running tokenizer on dataset",
        )
        return tokenized.cast_column(LABELS, label_type) if LABELS in tokenized.column_names else tokenized

    return datasets.DatasetDict({name: tokenize(name, rows) for name, rows in _raw_splits(raw).items()})


def _tokenized_data(splits: datasets.DatasetDict, *, cache_hit: bool, cache_key: str) -> TokenizedData:
    return TokenizedData(
        train=splits.get("train"),
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


# ------------------------------------------------------------------------------------------------
# Sorted evaluation: batches of similar lengths, results put back in row order
# ------------------------------------------------------------------------------------------------


def row_lengths(dataset: datasets.Dataset) -> np.ndarray:
    """Each row's token count, read from the Arrow column (no row is decoded)."""
    lengths = pyarrow.compute.list_value_length(dataset.data.column("input_ids")).to_numpy()
    indices = dataset._indices  # a `select`ed dataset maps its rows onto the table's
    if indices is not None:
        lengths = lengths[indices.column(0).to_numpy()]
    return np.asarray(lengths, dtype=np.int64)


def longest_first(dataset: datasets.Dataset) -> tuple[datasets.Dataset, np.ndarray]:
    """The rows from the longest to the shortest (ties in row order), and `order`: the sorted rows'
    original indices, which `in_row_order` uses to put results back. Longest first, so that the
    batch that needs the most memory runs first and a too-large batch size fails at once."""
    order = np.argsort(-row_lengths(dataset), kind="stable")
    return dataset.select(order), order


def in_row_order(values: torch.Tensor, order: np.ndarray) -> torch.Tensor:
    """Results computed on `dataset.select(order)`, back in the dataset's own row order."""
    if len(values) != len(order):
        raise ValueError(f"{len(values)} results for {len(order)} rows")
    restored = torch.empty_like(values)
    restored[torch.from_numpy(order)] = values
    return restored
