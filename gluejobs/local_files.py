"""A data path that names a file on the user's machine, not in the API's data folder.

`gluejobs submit --train_file ./mine.csv` sends the path as it is: the API reads data files from its
own data folder (GLUEJOBS_DATA_DIR on its machine), never from the caller's. When the API refuses
such a path and the file exists here, the error says so and how to make the file available. This
one place is what an upload (a file sent with the job) would replace.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from gluejobs.client import ApiError

PATH_FIELDS = ("train_file", "validation_file", "test_file")


@contextmanager
def with_local_file_hint(spec: Mapping[str, Any]) -> Iterator[None]:
    """Re-raise the API's refusal of a data path with the way out, when the path is a local file."""
    try:
        yield
    except ApiError as exc:
        field = (exc.field or "").removeprefix("spec.")
        value = spec.get(field) if field in PATH_FIELDS else None
        if not isinstance(value, str) or not os.path.isfile(os.path.expanduser(value)):
            raise
        raise ApiError(
            exc.status_code, exc.code, f"{exc.message}. {local_file_hint(field, value)}", exc.field
        ) from exc


def local_file_hint(field: str, value: str) -> str:
    name = os.path.basename(value)
    return (
        f"{value!r} is a file on this machine, and the API reads data files from its own data folder: "
        f"copy it into GLUEJOBS_DATA_DIR on the API's machine (with API keys, into its "
        f"owners/<sha256 of your key>/ folder) and give its path relative to that folder "
        f"(--{field} {name})"
    )
