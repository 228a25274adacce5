"""Loading and tokenising GLUE data: the real GLUE files of the kit, user files, and the cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pandas as pd
import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from shared.core.config import Settings
from shared.jobspec.spec import JobSpec
from shared.jobspec.tasks import TASKS
from worker.training.data import (
    GLUE_LAYOUTS,
    DataError,
    RawData,
    TokenizedData,
    _store_cache_entry,
    load_raw_data,
    tokenize_data,
    tokenizer_fingerprint,
)

REPO = Path(__file__).resolve().parents[2]


def job(**fields: Any) -> JobSpec:
    return JobSpec(model_name_or_path="minilm", **fields)


@pytest.fixture
def kit(glue_data: Path, tmp_path: Path) -> Settings:
    """The kit as both GLUEJOBS_GLUE_DIR and GLUEJOBS_DATA_DIR (for its hf/ parquet exports)."""
    return Settings(data_dir=glue_data, glue_dir=glue_data, cache_dir=tmp_path / "cache")


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    return folder


@pytest.fixture
def own_files(data_dir: Path, tmp_path: Path) -> Settings:
    """Settings for jobs on files written into a fresh GLUEJOBS_DATA_DIR, with no GLUE copy."""
    return Settings(data_dir=data_dir, cache_dir=tmp_path / "cache")


@pytest.fixture(scope="module")
def tokenizer(minilm_path: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(minilm_path)


def labels_of(rows: datasets.Dataset) -> np.ndarray:
    return np.asarray(rows.with_format("numpy")["label"][:])  # [:] reads the column at once, not row by row


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def write_frame(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(rows)
    if path.suffix in (".csv", ".tsv"):
        frame.to_csv(path, index=False, sep="," if path.suffix == ".csv" else "\t")
    elif path.suffix == ".parquet":
        frame.to_parquet(path, index=False)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    else:
        path.write_text(json.dumps(rows))
    return path


# ------------------------------------------------------------------------------------------------
# A local GLUE copy (the kit, in the original release layout)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("task_name", "train_rows", "dev_rows"),
    [("cola", 8551, 1043), ("sst2", 67349, 872), ("mrpc", 3668, 408), ("stsb", 5749, 1500)],
)
def test_local_glue_tasks_load_with_official_row_counts(
    kit: Settings, task_name: str, train_rows: int, dev_rows: int
) -> None:
    task = TASKS[task_name]

    raw = load_raw_data(job(task_name=task_name), kit)

    assert (len(raw.train), {name: len(rows) for name, rows in raw.evals.items()}) == (
        train_rows,
        {"eval": dev_rows},
    )
    text_columns = [key for key in task.text_keys if key is not None]
    assert raw.train.column_names == [*text_columns, "label"]
    assert raw.text_keys == task.text_keys
    assert raw.is_regression == task.is_regression
    assert raw.label_names == (list(task.label_names) if task.label_names else None)
    assert raw.test is None
    labels = labels_of(raw.train)
    if task.is_regression:
        assert labels.dtype == np.float32
        assert 0.0 <= labels.min() < labels.max() <= 5.0
    else:
        assert labels.dtype == np.int64
        assert set(labels.tolist()) == set(range(task.num_labels))


def test_mrpc_tsv_keeps_unbalanced_quotes_and_drops_the_byte_order_mark(kit: Settings) -> None:
    raw = load_raw_data(job(task_name="mrpc"), kit)

    first_dev = raw.evals["eval"][0]
    assert first_dev == {
        "sentence1": "He said the foodservice pie business doesn't fit the company's long-term growth "
        "strategy.",
        "sentence2": '"The foodservice pie business does not fit our long-term growth strategy.',
        "label": 1,
    }
    assert raw.train[0]["sentence1"].startswith('Amrozi accused his brother, whom he called "the witness"')


def test_cola_dev_without_final_newline_keeps_its_last_row(kit: Settings, glue_data: Path) -> None:
    assert not (glue_data / "CoLA" / "dev.tsv").read_bytes().endswith(b"\n")

    raw = load_raw_data(job(task_name="cola"), kit)

    assert raw.evals["eval"][-1] == {"sentence": "John talked to Bill about himself.", "label": 1}


def glue_copy(tmp_path: Path, glue_data: Path, files: dict[str, str]) -> Path:
    """A GLUE folder in tmp_path with kit files copied, maybe under other names: {target: source}."""
    root = tmp_path / "glue"
    for target, source in files.items():
        (root / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(glue_data / source, root / target)
    return root


def test_qnli_string_labels_agree_with_the_hub_export(glue_data: Path, tmp_path: Path) -> None:
    # The kit has no QNLI train.tsv (too large); its dev file stands in for one.
    root = glue_copy(tmp_path, glue_data, {"QNLI/train.tsv": "QNLI/dev.tsv", "QNLI/dev.tsv": "QNLI/dev.tsv"})
    settings = Settings(data_dir=glue_data, glue_dir=root, cache_dir=tmp_path / "cache")

    raw = load_raw_data(job(task_name="qnli"), settings)

    dev = raw.evals["eval"]
    assert len(dev) == 5463
    assert dev.column_names == ["question", "sentence", "label"]
    hub = pd.read_parquet(glue_data / "hf" / "qnli" / "validation.parquet")
    np.testing.assert_array_equal(labels_of(dev), hub["label"].to_numpy())
    assert dev[0]["question"] == hub["question"][0]


@pytest.mark.parametrize("task_name", ["cola", "mrpc", "stsb"])
def test_hub_parquet_exports_as_files_agree_with_the_glue_tsv(kit: Settings, task_name: str) -> None:
    from_tsv = load_raw_data(job(task_name=task_name), kit)

    from_parquet = load_raw_data(
        job(
            task_name=task_name,
            train_file=f"hf/{task_name}/train.parquet",
            validation_file=f"hf/{task_name}/validation.parquet",
        ),
        kit,
    )

    # The parquet files carry an `idx` column, which is not text and is dropped.
    assert from_parquet.train.column_names == from_tsv.train.column_names
    for parquet_rows, tsv_rows in [
        (from_parquet.train, from_tsv.train),
        *zip(from_parquet.evals.values(), from_tsv.evals.values(), strict=True),
    ]:
        np.testing.assert_array_equal(labels_of(parquet_rows), labels_of(tsv_rows))
    assert from_parquet.label_names == from_tsv.label_names
    assert from_parquet.fingerprint != from_tsv.fingerprint


def test_glue_layouts_name_the_tasks_eval_splits() -> None:
    assert set(GLUE_LAYOUTS) == set(TASKS)
    for name, layout in GLUE_LAYOUTS.items():
        assert [split for split, _ in layout.eval_files] == [split for split, _ in TASKS[name].eval_splits]
        assert set(layout.columns.values()) == {*filter(None, TASKS[name].text_keys), "label"}


# --- MNLI, from a small fixture in the GLUE layout ------------------------------------------------

MNLI_HEADER = [
    "index",
    "promptID",
    "pairID",
    "genre",
    *(f"sentence{n}_{kind}" for kind in ("binary_parse", "parse") for n in (1, 2)),
    "sentence1",
    "sentence2",
]
MNLI_LABELS = ("entailment", "neutral", "contradiction")


def write_mnli(root: Path, rows: int = 12) -> Path:
    """MNLI/train.tsv, dev_matched.tsv and dev_mismatched.tsv as the GLUE release has them."""
    for name, votes in (("train.tsv", 1), ("dev_matched.tsv", 5), ("dev_mismatched.tsv", 5)):
        vote_columns = [f"label{i}" for i in range(1, votes + 1)]
        lines = ["\t".join([*MNLI_HEADER, *vote_columns, "gold_label"])]
        for i in range(rows):
            label = MNLI_LABELS[i % 3]
            premise = f'{name} premise {i} with a "quote'
            hypothesis = f"hypothesis {i}"
            parse = f"( ( {premise} ) )"
            lines.append(
                "\t".join(
                    [str(i), str(100 + i), f"{100 + i}e", "fiction", *[parse] * 4, premise, hypothesis]
                    + [label] * (votes + 1)
                )
            )
        write(root / "MNLI" / name, "\n".join(lines) + "\n")
    return root


def test_mnli_reads_matched_and_mismatched_dev_files(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, glue_dir=write_mnli(tmp_path / "glue"), cache_dir=tmp_path / "c")

    raw = load_raw_data(job(task_name="mnli", max_eval_samples=5), settings)

    assert list(raw.evals) == ["eval", "eval_mismatched"]
    assert [len(rows) for rows in raw.evals.values()] == [5, 5]
    assert len(raw.train) == 12
    assert raw.train.column_names == ["premise", "hypothesis", "label"]
    assert raw.train[1] == {
        "premise": 'train.tsv premise 1 with a "quote',
        "hypothesis": "hypothesis 1",
        "label": 1,
    }
    assert labels_of(raw.train).tolist() == [0, 1, 2] * 4
    assert raw.evals["eval_mismatched"][0]["premise"].startswith("dev_mismatched.tsv")
    assert raw.label_names == ["entailment", "neutral", "contradiction"]


def test_mnli_splits_survive_the_cache(tmp_path: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    settings = Settings(data_dir=tmp_path, glue_dir=write_mnli(tmp_path / "glue"), cache_dir=tmp_path / "c")
    raw = load_raw_data(job(task_name="mnli"), settings)

    first = tokenize(raw, tokenizer, tmp_path)
    second = tokenize(raw, tokenizer, tmp_path)

    assert second.cache_hit
    assert list(second.evals) == ["eval", "eval_mismatched"]
    assert second.evals["eval_mismatched"][:] == first.evals["eval_mismatched"][:]
    assert second.evals["eval_mismatched"]["labels"][:] == [0, 1, 2] * 4


def test_first_rows_only_with_sample_limits(kit: Settings) -> None:
    full = load_raw_data(job(task_name="sst2"), kit)

    limited = load_raw_data(job(task_name="sst2", max_train_samples=50, max_eval_samples=20), kit)

    assert (len(limited.train), len(limited.evals["eval"])) == (50, 20)
    assert limited.train[:] == full.train[:50]
    assert limited.evals["eval"][:] == full.evals["eval"][:20]
    assert limited.fingerprint != full.fingerprint


def test_no_eval_rows_when_the_job_never_evaluates(kit: Settings) -> None:
    raw = load_raw_data(job(task_name="cola", eval_strategy="no"), kit)

    assert raw.evals == {}


def test_own_train_file_with_the_tasks_dev_split(kit: Settings) -> None:
    raw = load_raw_data(job(task_name="mrpc", train_file="hf/mrpc/train.parquet"), kit)

    assert len(raw.train) == 3668
    assert raw.evals["eval"][0]["sentence2"].startswith('"The foodservice')  # from MRPC/dev.tsv


# ------------------------------------------------------------------------------------------------
# Jobs on their own files (no task_name)
# ------------------------------------------------------------------------------------------------


def test_csv_with_string_labels(data_dir: Path, own_files: Settings) -> None:
    write(data_dir / "train.csv", 'sentence,label\nlovely,pos\n"awful, really",neg\n007,pos\nNA,neg\n')
    write(data_dir / "dev.csv", "sentence,label\ngreat,pos\nbad,neg\n")

    raw = load_raw_data(job(train_file="train.csv", validation_file="dev.csv"), own_files)

    assert raw.text_keys == ("sentence", None)
    assert raw.is_regression is False
    assert raw.label_names == ["neg", "pos"]
    assert raw.train[:] == {"sentence": ["lovely", "awful, really", "007", "NA"], "label": [1, 0, 1, 0]}
    assert labels_of(raw.evals["eval"]).tolist() == [1, 0]


def test_tsv_with_quotes_two_texts_and_an_id_column(data_dir: Path, own_files: Settings) -> None:
    write(
        data_dir / "pairs" / "train.tsv",
        'idx\tpremise\thypothesis\tlabel\n0\tHe said "hi\tsure\t2\n1\tx\ty\t0\n2\t"quoted"\tz\t1\n',
    )
    write(data_dir / "pairs" / "dev.tsv", "idx\tpremise\thypothesis\tlabel\n0\ta\tb\t2\n")

    raw = load_raw_data(job(train_file="pairs/train.tsv", validation_file="pairs/dev.tsv"), own_files)

    assert raw.text_keys == ("premise", "hypothesis")
    assert raw.label_names == ["0", "1", "2"]
    assert raw.train["premise"][:] == ['He said "hi', "x", '"quoted"']
    assert labels_of(raw.train).tolist() == [2, 0, 1]


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".json", ".jsonl", ".parquet"])
def test_float_labels_make_a_regression(data_dir: Path, own_files: Settings, suffix: str) -> None:
    rows = [
        {"id": i, "sentence2": f"b{i}", "sentence1": f"a{i}", "label": score}
        for i, score in enumerate([0.5, 4.25, 3.0])
    ]
    write_frame(data_dir / f"train{suffix}", rows)
    write_frame(data_dir / f"dev{suffix}", rows[:2])

    raw = load_raw_data(job(train_file=f"train{suffix}", validation_file=f"dev{suffix}"), own_files)

    assert raw.text_keys == ("sentence1", "sentence2")
    assert raw.is_regression is True
    assert raw.label_names is None
    labels = labels_of(raw.train)
    assert labels.dtype == np.float32
    assert labels.tolist() == [0.5, 4.25, 3.0]


def test_json_lines_with_integer_labels_and_an_unlabelled_test_file(
    data_dir: Path, own_files: Settings
) -> None:
    write_frame(data_dir / "train.jsonl", [{"text": "a", "label": 3}, {"text": "b", "label": 1}])
    write_frame(data_dir / "dev.json", [{"text": "c", "label": 1}])
    write_frame(data_dir / "test.csv", [{"text": "d"}, {"text": "e"}])

    raw = load_raw_data(
        job(train_file="train.jsonl", validation_file="dev.json", test_file="test.csv"), own_files
    )

    assert raw.label_names == ["1", "3"]
    assert labels_of(raw.train).tolist() == [1, 0]
    assert raw.test is not None
    assert raw.test.column_names == ["text"]


def test_validation_label_unseen_in_train_fails(data_dir: Path, own_files: Settings) -> None:
    write(data_dir / "train.csv", "sentence,label\na,pos\nb,neg\n")
    write(data_dir / "dev.csv", "sentence,label\nc,pos\nd,meh\n")

    with pytest.raises(DataError, match=r"validation_file 'dev.csv': label 'meh' on row 2 does not occur"):
        load_raw_data(job(train_file="train.csv", validation_file="dev.csv"), own_files)


def test_empty_label_fails(data_dir: Path, own_files: Settings) -> None:
    write(data_dir / "train.csv", "sentence,label\na,1\nb,\n")

    with pytest.raises(DataError, match=r"train_file 'train.csv': empty label on row 2"):
        load_raw_data(job(train_file="train.csv", eval_strategy="no"), own_files)


# ------------------------------------------------------------------------------------------------
# Errors that fail the job
# ------------------------------------------------------------------------------------------------


def test_missing_file_names_the_field_and_relative_path(own_files: Settings) -> None:
    with pytest.raises(
        DataError, match=r"validation_file 'sub/dev.csv' not found in GLUEJOBS_DATA_DIR"
    ) as info:
        load_raw_data(job(task_name="sst2", validation_file="sub/dev.csv"), own_files)

    assert info.value.field == "validation_file"


def test_path_leaving_the_data_dir_fails(data_dir: Path, own_files: Settings) -> None:
    write(data_dir.parent / "secret.csv", "sentence,label\na,1\n")

    with pytest.raises(DataError, match="leaves the data folder GLUEJOBS_DATA_DIR") as info:
        load_raw_data(job(train_file="../secret.csv", validation_file="../secret.csv"), own_files)

    assert info.value.field == "train_file"


@pytest.mark.parametrize(
    ("task_name", "label", "message"),
    [
        (
            "sst2",
            "7",
            r"label 7 on row 2 does not fit the task \(expected 0..1 or one of negative, positive\)",
        ),
        ("sst2", "-1", "label -1 on row 2 .*; -1 marks GLUE test rows"),
        ("qnli", "maybe", r"label 'maybe' on row 2 does not fit the task"),
        ("stsb", "high", r"label 'high' on row 2 is not a number"),
    ],
)
def test_labels_that_do_not_fit_the_task_fail(
    data_dir: Path, own_files: Settings, task_name: str, label: str, message: str
) -> None:
    columns = [key for key in TASKS[task_name].text_keys if key is not None]
    first_label = "0.5" if task_name == "stsb" else "0"
    rows = ["\t".join([*columns, "label"]), "\t".join([*columns, first_label]), "\t".join([*columns, label])]
    write(data_dir / "bad.tsv", "\n".join(rows) + "\n")

    with pytest.raises(DataError, match=rf"train_file 'bad.tsv': {message}") as info:
        load_raw_data(job(task_name=task_name, train_file="bad.tsv", validation_file="bad.tsv"), own_files)

    assert info.value.field == "train_file"


def test_unknown_label_string_in_a_glue_file_fails(glue_data: Path, tmp_path: Path) -> None:
    rte = "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\tc\td\tentailed\n"
    write(tmp_path / "glue" / "RTE" / "train.tsv", rte)
    write(tmp_path / "glue" / "RTE" / "dev.tsv", rte.replace("entailed", "not_entailment"))
    settings = Settings(data_dir=tmp_path, glue_dir=tmp_path / "glue", cache_dir=tmp_path / "c")

    with pytest.raises(DataError, match=r"GLUE file RTE/train.tsv: label 'entailed' on row 2"):
        load_raw_data(job(task_name="rte"), settings)


def test_missing_glue_folder_says_what_was_expected_where(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, glue_dir=tmp_path, cache_dir=tmp_path / "c")

    with pytest.raises(DataError, match=r"GLUE folder 'CoLA' .* expected CoLA/train.tsv, CoLA/dev.tsv"):
        load_raw_data(job(task_name="cola"), settings)


def test_missing_glue_file_says_where_it_was_expected(kit: Settings, glue_data: Path) -> None:
    # Where, under the setting's name: a message never shows the server's absolute paths.
    with pytest.raises(
        DataError,
        match=r"GLUE file QNLI/train.tsv not found: expected it at GLUEJOBS_GLUE_DIR/QNLI/train.tsv$",
    ):
        load_raw_data(job(task_name="qnli"), kit)


def test_unreachable_hub_fails_with_a_hint(
    own_files: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # datasets reads these at import time: set both the environment and its config, so it fails at once.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")

    with pytest.raises(
        DataError, match=r"could not load GLUE task 'wnli' from the Hugging Face Hub .*GLUEJOBS_GLUE_DIR"
    ):
        load_raw_data(job(task_name="wnli"), own_files)


# ------------------------------------------------------------------------------------------------
# Tokenisation and its cache
# ------------------------------------------------------------------------------------------------


def tokenize(
    raw: RawData, tokenizer: PreTrainedTokenizerBase, cache_dir: Path, **options: Any
) -> TokenizedData:
    return tokenize_data(
        raw,
        tokenizer,
        max_length=options.get("max_length", 32),
        pad_to_max_length=options.get("pad", False),
        cache_dir=cache_dir,
    )


@pytest.fixture
def small_mrpc(kit: Settings) -> RawData:
    return load_raw_data(job(task_name="mrpc", max_train_samples=64, max_eval_samples=32), kit)


def test_tokenised_columns_and_dtypes(
    small_mrpc: RawData, tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    data = tokenize(small_mrpc, tokenizer, tmp_path, max_length=32)

    for rows in (data.train, data.evals["eval"]):
        assert set(rows.column_names) == {"input_ids", "token_type_ids", "attention_mask", "labels"}
        assert rows.features["labels"].dtype == "int64"
    lengths = {len(ids) for ids in data.train["input_ids"]}
    assert max(lengths) == 32 and len(lengths) > 1  # truncated, not padded
    assert data.train["labels"][:] == small_mrpc.train["label"][:]
    assert data.test is None


def test_padding_to_max_length_and_regression_labels(
    kit: Settings, tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    raw = load_raw_data(job(task_name="stsb", max_train_samples=40, max_eval_samples=20), kit)

    data = tokenize(raw, tokenizer, tmp_path, max_length=48, pad=True)

    assert {len(ids) for ids in data.train["input_ids"]} == {48}
    assert data.train.features["labels"].dtype == "float32"
    assert data.evals["eval"]["labels"][:3] == pytest.approx([5.0, 4.75, 5.0])


def test_test_split_keeps_labels_only_when_it_has_them(
    data_dir: Path, own_files: Settings, tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    write(data_dir / "train.csv", "sentence,label\ngood,1\nbad,0\n")
    write(data_dir / "test.csv", "sentence\nfine\n")
    raw = load_raw_data(job(train_file="train.csv", test_file="test.csv", eval_strategy="no"), own_files)

    data = tokenize(raw, tokenizer, tmp_path)

    assert data.test is not None
    assert set(data.test.column_names) == {"input_ids", "token_type_ids", "attention_mask"}
    assert data.evals == {}


def test_glue_test_rows_labelled_minus_one_count_as_unlabelled(data_dir: Path, own_files: Settings) -> None:
    write(data_dir / "train.tsv", "sentence\tlabel\ngood\t1\nbad\t0\n")
    write(data_dir / "test.tsv", "sentence\tlabel\nfine\t-1\nmeh\t-1\n")

    raw = load_raw_data(
        job(task_name="sst2", train_file="train.tsv", validation_file="train.tsv", test_file="test.tsv"),
        own_files,
    )

    assert raw.test is not None
    assert raw.test.column_names == ["sentence"]


def test_second_tokenisation_is_a_cache_hit_with_identical_rows(
    small_mrpc: RawData, tokenizer: PreTrainedTokenizerBase, kit: Settings, tmp_path: Path
) -> None:
    first = tokenize(small_mrpc, tokenizer, tmp_path)
    again = load_raw_data(job(task_name="mrpc", max_train_samples=64, max_eval_samples=32), kit)

    second = tokenize(again, tokenizer, tmp_path)

    assert (first.cache_hit, second.cache_hit) == (False, True)
    assert second.cache_key == first.cache_key
    assert second.train[:] == first.train[:]
    assert second.evals["eval"][:] == first.evals["eval"][:]
    assert second.train.features == first.train.features


def test_a_different_max_length_or_data_is_a_cache_miss(
    small_mrpc: RawData, tokenizer: PreTrainedTokenizerBase, kit: Settings, tmp_path: Path
) -> None:
    first = tokenize(small_mrpc, tokenizer, tmp_path, max_length=32)

    longer = tokenize(small_mrpc, tokenizer, tmp_path, max_length=64)
    fewer_rows = load_raw_data(job(task_name="mrpc", max_train_samples=63, max_eval_samples=32), kit)
    other_rows = tokenize(fewer_rows, tokenizer, tmp_path, max_length=32)

    assert not longer.cache_hit and not other_rows.cache_hit
    assert len({first.cache_key, longer.cache_key, other_rows.cache_key}) == 3


def test_a_changed_file_is_a_cache_miss(
    data_dir: Path, own_files: Settings, tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    spec = job(train_file="train.csv", eval_strategy="no")
    write(data_dir / "train.csv", "sentence,label\ngood,1\nbad,0\n")
    first = tokenize(load_raw_data(spec, own_files), tokenizer, tmp_path)

    write(data_dir / "train.csv", "sentence,label\ngreat,1\nbad,0\n")
    second = tokenize(load_raw_data(spec, own_files), tokenizer, tmp_path)

    assert not second.cache_hit
    assert second.train["input_ids"][0] != first.train["input_ids"][0]


def test_a_damaged_cache_entry_is_replaced(
    small_mrpc: RawData, tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    first = tokenize(small_mrpc, tokenizer, tmp_path)
    rows = first.train[:]
    entry = tmp_path / "tokenized" / first.cache_key
    for arrow_file in (entry / "train").glob("*.arrow"):
        # A new, truncated file (not truncated in place: `first` still has the old one memory-mapped).
        damaged = arrow_file.read_bytes()[:100]
        arrow_file.unlink()
        arrow_file.write_bytes(damaged)

    second = tokenize(small_mrpc, tokenizer, tmp_path)
    third = tokenize(small_mrpc, tokenizer, tmp_path)

    assert (second.cache_hit, third.cache_hit) == (False, True)
    assert third.train[:] == rows
    assert sorted(p.name for p in entry.parent.iterdir()) == [first.cache_key]  # nothing left behind


def test_an_entry_another_worker_stored_first_is_kept(
    small_mrpc: RawData, tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    first = tokenize(small_mrpc, tokenizer, tmp_path)
    entry = tmp_path / "tokenized" / first.cache_key
    winner = entry.stat().st_mtime_ns

    # A worker that tokenised at the same time stores afterwards: its rename fails and it drops its copy.
    assert _store_cache_entry(datasets.DatasetDict({"train": first.train}), entry) is True
    assert entry.stat().st_mtime_ns == winner
    assert sorted(p.name for p in entry.parent.iterdir()) == [first.cache_key]


def test_a_cache_that_cannot_be_written_costs_time_not_the_job(
    small_mrpc: RawData, tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    write(tmp_path / "tokenized", "a file where the cache folder should be")

    data = tokenize(small_mrpc, tokenizer, tmp_path)

    assert not data.cache_hit
    assert len(data.train) == 64


def test_tokenizer_fingerprint_is_the_same_in_another_process(
    tokenizer: PreTrainedTokenizerBase, minilm_path: Path
) -> None:
    script = (
        "import sys; from transformers import AutoTokenizer; "
        "from worker.training.data import tokenizer_fingerprint; "
        "print(tokenizer_fingerprint(AutoTokenizer.from_pretrained(sys.argv[1])))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    other = subprocess.run(
        [sys.executable, "-c", script, str(minilm_path)], capture_output=True, text=True, env=env, check=True
    ).stdout.strip()

    tokenizer("a sentence to change any lazy state", "and a pair", truncation=True, max_length=8)
    assert other == tokenizer_fingerprint(tokenizer)
