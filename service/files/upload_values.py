"""What an upload's name and its checks' report may hold before anything of it is stored.

An upload's filename, column names and labels are written to the database (the file's row, its
`columns` and `checks` JSON). The same values that the app-wide check refuses in JSON bodies
(service/edge/input_checks.py: a NUL, a lone surrogate, a non-finite number) are refused here too, with
the filename's length, so that SQLite and Postgres refuse the same uploads the same way (422 naming
the field), and before the bytes reach the store, which then holds nothing no row describes.
"""

from __future__ import annotations

from service.edge.input_checks import find_unstorable
from service.files.upload_checks import UploadReport
from shared.core.errors import InvalidRequest

MAX_FILENAME_CHARS = 255  # the files table's filename column


def refuse_unstorable_filename(filename: str) -> None:
    """422 (field `file.filename`) for a name the files table cannot hold."""
    if len(filename) > MAX_FILENAME_CHARS:
        raise InvalidRequest(
            f"the file's name is longer than {MAX_FILENAME_CHARS} characters", field="file.filename"
        )
    found = find_unstorable(filename)
    if found is not None:
        raise InvalidRequest(f"the file's name {found[1]}", field="file.filename")


def refuse_unstorable_report(report: UploadReport) -> None:
    """422 (field `file.columns` or `file.labels`) for a column name or a label no database stores
    faithfully. The message names where, never the value: it is the file's content."""
    for field, value in (("file.columns", report.columns), ("file.labels", report.checks)):
        found = find_unstorable(value)
        if found is not None:
            where, problem = found
            what = "a column's name" if field == "file.columns" else f"a label ({where or 'labels'})"
            raise InvalidRequest(f"{what} {problem}", field=field)
