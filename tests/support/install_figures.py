"""The install page's table (docs/operators/install.md): one line per machine, and that line's installed
size and time as tests/project/test_install.py measured them.

The table sits between two marks on the page. test_install.py runs each machine's line as written
and compares what it measured with the page (a size more than SIZE_TOLERANCE off fails, naming every
measured figure); `make install-figures` runs it with GLUEJOBS_INSTALL_FIGURES=write, which rewrites the
figure cells, and only those, from its measurements. Times are written, never compared: a timing goal
belongs in a benchmark, and this 2-core machine's load moves an install's time by half.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.support.kit import REPO

PAGE = REPO / "docs" / "operators" / "install.md"
BEGIN = "<!-- install-figures: begin -->"
END = "<!-- install-figures: end -->"
# How far a measured size may be from the page's before the page is out of date: dependencies' releases
# move sizes by a few percent; a new dependency or a CUDA torch by far more.
SIZE_TOLERANCE = 0.15
# The machines whose lines the install test runs, by the first cell of their row.
LAPTOP = "laptop (client, CLI)"
DEMO_MODEL = "laptop: the demo model"
API = "API box (no torch)"
WORKER_CPU = "worker, CPU"
MEASURED = (LAPTOP, DEMO_MODEL, API, WORKER_CPU)
# A size cell: "511 MB (403 MB with `--no-compile`)", "1.8 GB (1.4 GB with `--no-compile`)", "84 MB …".
AMOUNT = re.compile(r"(?P<number>\d+(?:\.\d+)?) (?P<unit>MB|GB)")
CODE = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class Row:
    machine: str
    line: str  # the command, as the page writes it
    size: str  # the cells as written
    time: str


@dataclass(frozen=True)
class Figures:
    """One install as measured: megabytes (10**6 bytes) of its site-packages, with the bytecode pip
    compiles by default (None when it ran with --no-compile) and without it, and its seconds (None when
    not measured: the worker's stack borrowed from the test venv)."""

    mb: float | None
    mb_without_bytecode: float
    seconds: float | None


def rows(text: str) -> dict[str, Row]:
    """The table's rows by machine: its first code span is the line."""
    start, end = text.index(BEGIN), text.index(END)
    found: dict[str, Row] = {}
    for line in text[start:end].splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("machine", "") or set(cells[0]) <= {"-"}:
            continue
        command = CODE.search(cells[1])
        if command is None:
            raise ValueError(f"install.md: the row for {cells[0]!r} has no command in backquotes")
        found[cells[0]] = Row(cells[0], command.group(1), cells[2], cells[3])
    return found


def megabytes(cell: str) -> list[float]:
    """The amounts a size cell names, in MB: the line's size, then (if given) without bytecode."""
    return [float(m["number"]) * (1000 if m["unit"] == "GB" else 1) for m in AMOUNT.finditer(cell)]


def size_text(mb: float) -> str:
    return f"{mb / 1000:.2f} GB" if mb >= 1000 else f"{mb:.0f} MB"


def time_text(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def size_cell(machine: str, figures: Figures) -> str:
    if machine == DEMO_MODEL:
        return f"{size_text(figures.mb_without_bytecode)} of files, nothing installed"
    assert figures.mb is not None, "the page's sizes are those of the line as written, with bytecode"
    return f"{size_text(figures.mb)} ({size_text(figures.mb_without_bytecode)} with `--no-compile`)"


def out_of_date(text: str, measured: dict[str, Figures]) -> list[str]:
    """Each measured size the page misstates by more than SIZE_TOLERANCE, said with both figures.
    An install measured with --no-compile is compared with the page's size without bytecode."""
    table = rows(text)
    problems: list[str] = []
    for machine, figures in measured.items():
        written = megabytes(table[machine].size)
        if machine == DEMO_MODEL:
            pairs = [(figures.mb_without_bytecode, written[0])]
        elif figures.mb is None:
            pairs = [(figures.mb_without_bytecode, written[-1])]
        else:
            pairs = [(figures.mb, written[0]), (figures.mb_without_bytecode, written[-1])]
        for got, said in pairs:
            if abs(got - said) > SIZE_TOLERANCE * said:
                problems.append(f"{machine}: the page says {size_text(said)}, measured {size_text(got)}")
    return problems


def with_figures(text: str, measured: dict[str, Figures]) -> str:
    """The page with each measured machine's figure cells written from `measured` (a time not measured
    keeps the page's); nothing else changes."""
    start, end = text.index(BEGIN), text.index(END)
    lines = text[start:end].splitlines(keepends=True)
    for index, line in enumerate(lines):
        cells = line.rstrip("\n").strip().strip("|").split("|")
        machine = cells[0].strip()
        if len(cells) != 4 or machine not in measured:
            continue
        figures = measured[machine]
        time = time_text(figures.seconds) if figures.seconds is not None else cells[3].strip()
        lines[index] = f"| {machine} | {cells[1].strip()} | {size_cell(machine, figures)} | {time} |\n"
    return text[:start] + "".join(lines) + text[end:]


def write_page(measured: dict[str, Figures], page: Path = PAGE) -> None:
    page.write_text(with_figures(page.read_text(), measured))
