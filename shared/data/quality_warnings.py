"""What a data file holds that will train, but probably not as meant: the warnings an upload, a dry
run and a job carry (shared.core.errors.Problem, codes below).

- `label_near_duplicate`: two labels that differ only in case or spaces, or are near-identical
  spellings (`postive` beside `positive`: difflib's ratio at least NEAR_DUPLICATE_RATIO). Each trains
  as a class of its own.
  Among them the stray values (`label_pairs`): a label that differs from another only in case or
  spaces, or a rare one (at most 1/STRAY_RARITY of the other's rows) that is a near spelling or an
  abbreviation of a frequent one (`positive ` once beside 200 `pos`). An upload warns of them with
  their first rows; a job is refused on them (code `stray_label`, shared/admission/data_checks.py)
  unless its spec's keep_labels names them.
- `rare_class`: a class with fewer than RARE_CLASS_FRACTION of the labelled rows, or fewer than
  RARE_CLASS_ROWS rows in a file of at least RARE_CLASS_MIN_FILE_ROWS labelled rows.
- `label_imbalance`: the largest class over the smallest (rare classes left out: they have their
  own warning) above IMBALANCE_RATIO.
- `long_rows`: rows with more words than max_length has tokens. A word is at least one token, so
  each such row is truncated: the count is a lower bound, and costs one split per row (no tokenizer;
  a dry run measures a sample with the model's own tokenizer).

Pure functions of counts, so the upload's stored checks give the same warnings whenever they are
read (GET /v1/files/{id} shows what POST answered).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from shared.core.errors import Problem

# pandas is imported where used (word_counts): the API imports this module at start for the warnings
# of stored checks, which need no pandas, so that its start does not pay for pandas' import.
if TYPE_CHECKING:
    import pandas as pd

NEAR_DUPLICATE_RATIO = 0.85  # "postive"/"positive" 0.93; "entailment"/"not_entailment" 0.83 stay apart
RARE_CLASS_FRACTION = 0.01
RARE_CLASS_ROWS = 5
RARE_CLASS_MIN_FILE_ROWS = 50
IMBALANCE_RATIO = 10.0
# The job spec's default max_length (shared/jobspec/spec.py), which an upload's rows are measured against.
DEFAULT_MAX_LENGTH = 128
# [CLS] and [SEP] (two [SEP] for a pair): tokens a row has besides its words' (BERT's count; others
# add as many or fewer, so the bound holds).
SPECIAL_TOKENS = {1: 2, 2: 3}
MAX_LABEL_WARNINGS = 20  # a file with 10,000 classes does not get 10,000 warnings
# A near spelling or abbreviation of a label is a stray value when it has at most this share of its rows.
STRAY_RARITY = 10
MIN_ABBREVIATION_CHARS = 3  # "pos" for "positive"; "a" for "abc" says nothing
STRAY_ROWS_SHOWN = 5  # a stray label's first rows named in a message


def label_warnings(
    counts: Mapping[str, int], field: str, rows: Mapping[str, list[int]] | None = None
) -> list[Problem]:
    """Near-duplicate labels (with the first `rows` of a stray one), rare classes and imbalance in a
    classification file's label tally."""
    return [*near_duplicates(counts, field, rows), *class_warnings(counts, field)][:MAX_LABEL_WARNINGS]


def class_warnings(counts: Mapping[str, int], field: str) -> list[Problem]:
    """Rare classes and imbalance in a label tally."""
    warnings: list[Problem] = []
    total = sum(counts.values())
    if total == 0 or len(counts) < 2:
        return warnings
    rare = {name: n for name, n in counts.items() if n > 0 and is_rare(n, total)}
    for name, n in sorted(rare.items(), key=lambda item: item[1]):
        warnings.append(
            Problem(
                field,
                "rare_class",
                f"label {name!r} has {n} of {total} rows ({n / total:.1%}); a class this rare is hardly "
                "learned (and may be a mistake)",
            )
        )
    common = {name: n for name, n in counts.items() if n > 0 and name not in rare}
    if len(common) >= 2:
        largest = max(common, key=lambda name: common[name])
        smallest = min(common, key=lambda name: common[name])
        ratio = common[largest] / common[smallest]
        if ratio > IMBALANCE_RATIO:
            warnings.append(
                Problem(
                    field,
                    "label_imbalance",
                    f"labels are imbalanced: {largest!r} has {common[largest]} rows, {smallest!r} "
                    f"{common[smallest]} ({ratio:.1f} to 1, over {IMBALANCE_RATIO:g}); accuracy rewards "
                    "predicting the majority",
                )
            )
    return warnings[:MAX_LABEL_WARNINGS]


def is_rare(rows: int, total: int) -> bool:
    if rows < RARE_CLASS_FRACTION * total:
        return True
    return total >= RARE_CLASS_MIN_FILE_ROWS and rows < RARE_CLASS_ROWS


def near_duplicates(
    counts: Mapping[str, int], field: str, rows: Mapping[str, list[int]] | None = None
) -> list[Problem]:
    """Pairs of labels that are one class spelled two ways, the rarer named first (with its first
    `rows` where an upload recorded them). Numbers (ids, scores) are never compared: 1 and 11 are
    different classes."""
    warnings = []
    for rarer, other, how, stray in label_pairs(counts):
        where = f", {rarer!r} on {rows_words(rows[rarer], counts[rarer])}" if rows and rarer in rows else ""
        fix = (
            ": a job on this file is refused unless its keep_labels names it"
            if stray
            else ": fix the file if they are one"
        )
        warnings.append(
            Problem(
                field,
                "label_near_duplicate",
                f"label {rarer!r} ({counts[rarer]} rows) {how} {other!r} ({counts[other]} rows){where}; "
                f"each trains as a class of its own{fix}",
            )
        )
    return warnings


SAME_BUT_CASE = "differs only in case or spaces from"
MISSPELLED = "looks like a misspelling of"
ABBREVIATED = "looks like an abbreviation of (or abbreviated by)"


def label_pairs(counts: Mapping[str, int]) -> list[tuple[str, str, str, bool]]:
    """(rarer, other, how they are alike, whether the rarer is a stray value) for each pair of labels
    that look like one class spelled two ways: the same but for case or spaces (always a stray), a
    near spelling (difflib's ratio at least NEAR_DUPLICATE_RATIO), or one the other's abbreviation;
    the last two are strays when the rarer has at most 1/STRAY_RARITY of the other's rows."""
    names = [name for name in counts if not _is_number(name)][: MAX_LABEL_WARNINGS * 10]
    pairs = []
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            a, b = (" ".join(name.split()).casefold() for name in (first, second))
            short, long = sorted((a, b), key=len)
            ratio = difflib.SequenceMatcher(None, first.casefold(), second.casefold()).ratio()
            if a == b:
                how = SAME_BUT_CASE
            elif ratio >= NEAR_DUPLICATE_RATIO:
                how = MISSPELLED
            elif len(short) >= MIN_ABBREVIATION_CHARS and long.startswith(short):
                how = ABBREVIATED
            else:
                continue
            rarer, other = sorted((first, second), key=lambda name: (counts[name], name))
            stray = how == SAME_BUT_CASE or counts[rarer] * STRAY_RARITY <= counts[other]
            if how == ABBREVIATED and not stray:
                continue  # "pos" and "positive" both frequent: two classes, named as the file chose
            pairs.append((rarer, other, how, stray))
    return pairs


def rows_words(rows: list[int], count: int) -> str:
    """'row 213', 'rows 3, 17 and 40', 'rows 3, 17, 40, 51, 60 and 12 more'."""
    shown = [str(row) for row in rows[:STRAY_ROWS_SHOWN]]
    more = count - len(shown)
    if more > 0:
        return f"rows {', '.join(shown)} and {more} more"
    if len(shown) == 1:
        return f"row {shown[0]}"
    return f"rows {', '.join(shown[:-1])} and {shown[-1]}"


def word_counts(texts: pd.DataFrame) -> pd.Series:
    """Whitespace-separated words per row over the text columns, plus the special tokens a row
    gets: a lower bound on its tokens."""
    import pandas as pd

    words = pd.Series(0, index=texts.index, dtype="int64")
    for name in texts.columns:
        # str.split in a comprehension: twice as fast as pandas' str.count(regex), three times str.split
        counted = [len(text.split()) for text in texts[name].astype(str).tolist()]
        words = words + pd.Series(counted, index=texts.index, dtype="int64")
    return words + SPECIAL_TOKENS.get(len(texts.columns), 3)


def long_rows_warning(rows: int, total: int, max_length: int, field: str) -> Problem | None:
    if rows == 0:
        return None
    return Problem(
        field,
        "long_rows",
        f"at least {rows} of {total} rows have more words than max_length {max_length} has tokens: they "
        "will be truncated (raise max_length, or shorten them)",
    )


def _is_number(name: str) -> bool:
    try:
        float(name)
    except ValueError:
        return False
    return True
