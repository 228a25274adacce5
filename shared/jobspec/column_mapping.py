"""Which columns of one's own data file hold the texts and the labels: the spec's `text_column`,
`text_pair_column` and `label_column` (and the same fields of an upload, POST /v1/files).

The convention mirrored is AutoTrain's text classification parameters (`--text-column`,
`--target-column`: the spec takes `target_column` as another name for label_column), with a pair
column for sentence-pair tasks; without a mapping, run_glue.py's own rule holds (a `label` column,
`sentence1`/`sentence2` or the first one or two other columns as texts; a task's files its own column
names). A mapping is the spec's, so it applies to every file of the job (train, validation and test,
as AutoTrain's applies to its train and valid splits), and reruns, sweeps and searches carry it.

Mapped columns are renamed as a file is read, before any check: the label column becomes `label`;
with a task, the text columns become the task's (`sentence`, or `question1`/`question2` …); a job on
its own files keeps its text columns' names. The rest of the reading rule (shared/data/reading.py)
then checks the file as it checks one with GLUE's names. Pandas-free, so the spec imports it.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.core.errors import quote
from shared.jobspec.suggest import did_you_mean

# The mapping's field names are the client's words too (gluejobs/_files.py): their home is the wire module.
from shared.wire.vocabulary import COLUMN_FIELDS as COLUMN_FIELDS

LABEL = "label"
MAX_COLUMN_NAME_CHARS = 256  # as an upload's column names (service/files/upload_checks.py)
# Names that say "these are labels", for the guess a refusal offers (AutoTrain's `target`, the Hub's
# datasets' `label`/`labels`, GLUE's own `gold_label`, `is_duplicate`, `Quality`, `score`).
LABEL_LIKE = (
    "label",
    "labels",
    "target",
    "targets",
    "class",
    "category",
    "sentiment",
    "polarity",
    "gold_label",
    "is_duplicate",
    "quality",
    "score",
    "rating",
    "stars",
    "y",
    "intent",
    "tag",
)
# Row ids, never text, both when a file's texts are found by run_glue's rule (shared/data/reading.py)
# and in the mapping guessed for a refusal: the Hub's parquet exports carry `idx`, GLUE's own TSV files
# `index` (QNLI's, MNLI's, STS-B's; their test files too, QQP's `id`), pandas' reset_index() `index`.
ROW_ID_COLUMNS = frozenset({"idx", "id", "index"})


@dataclass(frozen=True)
class ColumnMapping:
    """The columns a job's (or an upload's) files keep their texts and labels in; None: by name."""

    text_column: str | None = None
    text_pair_column: str | None = None
    label_column: str | None = None

    @classmethod
    def of(cls, source: Any) -> ColumnMapping:
        """The mapping of a spec (or any object or dict with these fields)."""
        if isinstance(source, Mapping):
            return cls(*(source.get(name) or None for name in COLUMN_FIELDS))
        return cls(*(getattr(source, name, None) for name in COLUMN_FIELDS))

    def as_dict(self) -> dict[str, str]:
        """The fields that are given, as a spec writes them."""
        return {name: value for name in COLUMN_FIELDS if (value := getattr(self, name)) is not None}

    @property
    def label(self) -> str:
        """The column the labels are read from."""
        return self.label_column or LABEL

    def problem(self, *, pair_task: bool | None) -> tuple[str, str] | None:
        """(field, message) for a mapping that cannot work, whatever the file: the pair column
        without the first, two roles on one column, a pair column for a one-sentence task
        (`pair_task` False; None: no task)."""
        if self.text_pair_column is not None and self.text_column is None:
            return "text_pair_column", "text_pair_column names the second text: give text_column too"
        named = [(name, value) for name, value in self.as_dict().items()]
        for index, (name, value) in enumerate(named):
            for other, other_value in named[index + 1 :]:
                if value == other_value:
                    return other, (
                        f"{name} and {other} both name column {quote(value)}: a column holds either "
                        "texts or labels, and one text"
                    )
        if self.label_column not in (None, LABEL):
            for name in ("text_column", "text_pair_column"):
                if getattr(self, name) == LABEL:
                    return name, (
                        f"{name} {LABEL!r}: the labels of label_column {quote(self.label_column)} are "
                        f"read as {LABEL!r}; rename that text column in the file"
                    )
        if pair_task is False and self.text_pair_column is not None:
            return "text_pair_column", "this task takes one text per row: text_pair_column has no use"
        return None

    def missing(self, columns: Sequence[str], *, labels_required: bool) -> list[tuple[str, str]]:
        """(field, column) of every mapped column a file lacks, in the fields' order: all of them, so
        that one answer names each mistyped column (a label column may be missing from a file whose
        labels are optional: a test file)."""
        found = []
        for name in COLUMN_FIELDS:
            value = getattr(self, name)
            if value is None or value in columns:
                continue
            if name == "label_column" and not labels_required:
                continue
            found.append((name, value))
        return found

    def text_keys(self, task_keys: tuple[str, str | None] | None) -> tuple[str, str | None] | None:
        """The text columns after renaming: the task's, or the mapped ones of one's own data; None
        when nothing maps them (the reading rule infers them)."""
        if task_keys is not None:
            return task_keys
        if self.text_column is None:
            return None
        return self.text_column, self.text_pair_column

    def renames(self, task_keys: tuple[str, str | None] | None) -> dict[str, str]:
        """{file's column: the name it is read under}."""
        renames: dict[str, str] = {}
        if self.label_column is not None and self.label_column != LABEL:
            renames[self.label_column] = LABEL
        if task_keys is not None:
            for mapped, key in zip((self.text_column, self.text_pair_column), task_keys, strict=True):
                if mapped is not None and key is not None and mapped != key:
                    renames[mapped] = key
        return renames

    def apply(self, frame: Any, task_keys: tuple[str, str | None] | None) -> Any:
        """The frame with its mapped columns under the names they are read by. A column already under
        such a name that the mapping does not name is dropped (the mapped one stands for it)."""
        renames = {old: new for old, new in self.renames(task_keys).items() if old in frame.columns}
        if not renames:
            return frame
        replaced = [c for c in frame.columns if c in renames.values() and c not in renames]
        return frame.drop(columns=replaced).rename(columns=renames)


def missing_message(field: str, column: str, columns: Sequence[str], *, quotable: bool) -> str:
    """The words for a mapping that names a column the file lacks."""
    if not quotable:
        return f"has no column {quote(column)} ({field})"
    shown = ", ".join(map(str, columns))
    return f"has no column {quote(column)} ({field}; its columns: {shown}){did_you_mean(column, columns)}"


def guess(
    columns: Sequence[str], *, texts: int, samples: Mapping[str, Sequence[Any]] | None = None
) -> ColumnMapping:
    """The mapping a file's columns most likely want: the label column by its name (LABEL_LIKE), else
    the one with the fewest distinct, shortest values; then up to `texts` text columns, the longest
    values first (in the file's order when nothing was read). Row-id columns are neither."""
    names = [str(c) for c in columns if str(c).lower() not in ROW_ID_COLUMNS]
    if len(names) < 2:
        return ColumnMapping()
    by_name = [n for n in names if n.lower() in LABEL_LIKE]
    by_name.sort(key=lambda n: LABEL_LIKE.index(n.lower()))
    stats = {n: _shape(samples.get(n, ())) for n in names} if samples else {}
    if by_name:
        label = by_name[0]
    elif stats:
        label = min(names, key=lambda n: (stats[n][0], stats[n][1]))
    else:
        label = names[-1]  # a label column most often comes last (review,sentiment; text,label)
    rest = [n for n in names if n != label]
    if stats:
        rest.sort(key=lambda n: -stats[n][1])
        rest = [n for n in names if n in rest[:texts]]  # the chosen ones, in the file's order
    chosen = rest[:texts]
    return ColumnMapping(chosen[0], chosen[1] if len(chosen) > 1 else None, label)


def _shape(values: Sequence[Any]) -> tuple[int, float]:
    """(distinct values, mean length) of a column's first values."""
    shown = [str(v) for v in values]
    return len(set(shown)), (sum(map(len, shown)) / len(shown) if shown else 0.0)


def flags_hint(mapping: ColumnMapping, *, wanted: Mapping[str, str]) -> str:
    """'map yours with --text_column review --label_column sentiment (spec: "text_column": "review",
    "label_column": "sentiment")' for the fields of `mapping` whose column is not already under the
    name it is read by (`wanted`: {field: name the reading rule looks for})."""
    given = {name: value for name, value in mapping.as_dict().items() if wanted.get(name) != value}
    if not given:
        return ""
    flags = " ".join(f"--{name} {_shell_word(value)}" for name, value in given.items())
    spec = ", ".join(f"{_json(name)}: {_json(value)}" for name, value in given.items())
    return f"map yours with {flags} (spec: {spec})"


def _shell_word(value: str) -> str:
    return shlex.quote(value)


def _json(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)
