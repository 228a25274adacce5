"""What an upload's check found, standing in for the file's rows when a job names it.

An uploaded file was read whole once, as it landed (service/files/upload_checks.py), and its row keeps
what that read found: rows, columns, text columns, and its labels' tally (classes and their counts,
or a score range). A submission, sweep, rerun or dry run that names the file checks the job against
that tally instead of reading the file again: `tally_frame` turns it into one row per distinct label,
each weighed by its count, which the reading rule's label checks (shared/data/reading.py) then check
as they check any file's rows, so a label that does not fit the task is refused in the same words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# numpy and pandas are imported where used (tally_frame): the API imports this module at start for
# StoredUpload, so that its start does not pay for their import.
if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

LABEL = "label"


@dataclass(frozen=True)
class StoredUpload:
    """An uploaded file's row, as far as its checks go."""

    rows: int
    columns: list[str]
    checks: dict[str, Any]


def tally_frame(stored: StoredUpload) -> tuple[pd.DataFrame, np.ndarray]:
    """One row per distinct label (text columns empty), and how many of the file's rows each stands for."""
    import numpy as np
    import pandas as pd

    kind = stored.checks.get("labels")
    labels: pd.Series | None = None
    if kind == "classes":
        counts = stored.checks.get("label_counts") or {}
        labels = _as_written(list(counts))
        weights = np.array(list(counts.values()), dtype=np.int64)
    elif kind == "scores":
        # min and max stand for themselves, the mean for every row: the report's range and mean hold.
        scores = stored.checks["score_range"]
        labels = pd.Series([scores["min"], scores["max"], scores["mean"]], dtype="float64")
        weights = np.array([0, 0, stored.rows], dtype=np.int64)
    else:
        weights = np.array([stored.rows], dtype=np.int64)
    size = len(weights)
    # The labels under the column the upload's check tallied (its label_column,
    # shared/jobspec/column_mapping.py).
    tallied = (stored.checks.get("columns") or {}).get("label_column") or LABEL
    frame = pd.DataFrame({str(column): [""] * size for column in stored.columns if column != tallied})
    if labels is not None:
        frame[tallied] = labels.to_numpy()
    return frame, weights


def _as_written(values: list[str]) -> pd.Series:
    """Labels as the tally keeps them (text), numbers again where they all are (as a file's read)."""
    import pandas as pd

    text = pd.Series(values, dtype=object)
    numbers = pd.to_numeric(text, errors="coerce")
    if len(values) and numbers.notna().all():
        integral = bool((numbers == numbers.round()).all())
        return numbers.astype("int64" if integral else "float64")
    return text
