"""How the `gluejobs` command prints: errors as one line, `--json` as one document, key/value blocks
aligned, every moment in one format, and a closed pipe (`gluejobs ls | head`) as the reader's wish
rather than a traceback."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Collection, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from gluejobs.client import ApiError


def error_line(command: str, exc: Exception) -> str:
    """`gluejobs <command>: <field>: <message>`: the one shape of every error the command prints,
    whether the CLI found it before sending anything or the API answered it."""
    if isinstance(exc, ApiError):
        field, message = exc.field, exc.message
    else:
        field, message = getattr(exc, "field", None), str(exc)
    if field and not message.startswith(f"{field}: "):
        message = f"{field}: {message}"
    return f"gluejobs {command}: {message}"


def error_lines(command: str, exc: Exception) -> list[str]:
    """What the command prints for an error: its one line, or, when the API found several problems,
    a line saying how many and then each problem on a line of its own (`field: message`), with the
    count of those the answer did not list and the warnings it answered beside them."""
    problems = exc.problems if isinstance(exc, ApiError) else []
    warnings = exc.warnings if isinstance(exc, ApiError) else []
    omitted = exc.problems_omitted if isinstance(exc, ApiError) else 0
    if len(problems) + omitted <= 1:
        lines = [error_line(command, exc)]
    else:
        lines = [f"gluejobs {command}: {len(problems) + omitted} problems"]
        lines += [f"  {problem.line()}" for problem in problems]
        if omitted:
            lines.append(f"  … and {omitted} more not listed")
    return lines + [f"warning: {warning.line()}" for warning in warnings]


def print_error(command: str, exc: Exception) -> None:
    """The error lines, on stderr: every problem the API found, one a line."""
    for line in error_lines(command, exc):
        print(line, file=sys.stderr)


def print_json(value: Any) -> None:
    """`--json`: one JSON document (a list for several items), so `| jq` and json.loads read it whole."""
    print(json.dumps(value, indent=2))


def print_warnings(warnings: Iterable[str], *, indent: str = "") -> None:
    """What the API accepted with a word of warning, on stderr (stdout stays the answer)."""
    for warning in warnings:
        print(f"{indent}warning: {warning}", file=sys.stderr)


def aligned(pairs: Iterable[tuple[str, Any]], *, indent: str = "  ") -> list[str]:
    """`key   value` lines with the values in one column."""
    rows = [(key, text(value)) for key, value in pairs]
    width = max((len(key) for key, _ in rows), default=0)
    return [f"{indent}{key:<{width}}  {value}" for key, value in rows]


def table(columns: Sequence[str], rows: Iterable[Sequence[str]], *, right: Collection[str] = ()) -> list[str]:
    """Rows under their headers in fixed columns, one line a row. Written here rather than with rich's
    Table, which re-flows cells at the terminal's width: a cell wrapped onto a second line no longer
    sits under its header, and `cut`/`awk` cannot read it."""
    cells = [list(columns), *(list(row) for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = []
    for row in cells:
        parts = [
            value.rjust(width) if name in right else value.ljust(width)
            for name, value, width in zip(columns, row, widths, strict=True)
        ]
        lines.append("  ".join(parts).rstrip())
    return lines


def text(value: Any) -> str:
    """A value as a person reads it: text as it is, anything else as JSON (true, null, [1, 2])."""
    return value if isinstance(value, str) else json.dumps(value)


def human_bytes(count: float) -> str:
    """1536 → "1.5 KiB"."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def when(moment: datetime | None) -> str:
    """Every moment the command prints, in one format: ISO 8601 in UTC to the second
    (2026-03-01T14:05:09Z). The same on every machine and in every time zone, the instant the API's
    JSON gives, sortable as text, and one word for `awk` and `cut`; "-" when there is none."""
    if moment is None:
        return "-"
    if moment.tzinfo is None:  # the API's moments are UTC; one without an offset is read as such
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def closed_pipe() -> int:
    """The reader closed our stdout (`| head` has its lines): stop quietly. Python flushes stdout once
    more at exit, which would fail again, so stdout points at /dev/null from here on."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0
