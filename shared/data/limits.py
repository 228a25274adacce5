"""The shape a data file may have before the API decodes it: columns, bytes per cell and per row,
parquet row groups, text in all.

A data file's size on disk says little about what reading it costs: a 1 KB parquet file can hold a
100 KB string 50,000 times over (5 GB once decoded), a 14 MB CSV header a million columns, and one
quoted CSV cell can be the whole file, which pandas holds whole, several times over. So before any
reader builds cells, the file's shape is checked against GLUEJOBS_FILE_MAX_* with bounded memory:

- text files (csv, tsv, jsonl, JSON lines): a byte scan in 1 MiB blocks (numpy, no Python loop per
  byte) finds row and cell boundaries (for csv, quote-aware: a newline or comma inside quotes is
  neither); a row or cell that grows past its limit is refused as soon as the block holding the
  excess arrives, before the rest is read;
- a JSON array: parsed one element at a time (`json_records`), each at most a row's limit;
- parquet: the footer's size, then the row groups' sizes and column counts from the metadata, then
  per row group the string columns read as dictionaries (the dictionary once, plus 4 bytes per
  cell) to measure every cell's length before any string is materialised.

`OverLimit` names the limit and the setting that raises it; messages never quote the file.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

# numpy, like pyarrow, is imported where a file is scanned: the API imports this module at start for
# FileLimits, so that its start does not pay for numpy's import.
if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from shared.core.config import Settings

BLOCK = 1024 * 1024
# A parquet footer (the metadata) is read whole by pyarrow: about 100 bytes per column chunk.
MAX_FOOTER_BYTES = 16 * 1024 * 1024
# What Arrow keeps per cell of a row group besides its bytes (offsets, dictionary indices).
CELL_OVERHEAD = 8
_NEWLINE, _QUOTE = 10, 34


class OverLimit(Exception):
    """A data file is over one of the limits on its shape."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


@dataclass(frozen=True)
class FileLimits:
    max_columns: int
    max_cell_bytes: int
    max_row_bytes: int
    max_row_group_bytes: int
    max_text_bytes: int

    @classmethod
    def of(cls, settings: Settings) -> FileLimits:
        return cls(
            max_columns=settings.file_max_columns,
            max_cell_bytes=settings.file_max_cell_bytes,
            max_row_bytes=settings.file_max_row_bytes,
            max_row_group_bytes=settings.file_max_row_group_bytes,
            max_text_bytes=settings.file_max_text_bytes,
        )

    @classmethod
    def defaults(cls) -> FileLimits:
        """The settings' defaults (for a reader that is given no settings: a GLUE copy's files)."""
        from shared.core.config import Settings

        fields = Settings.model_fields
        return cls(
            max_columns=fields["file_max_columns"].default,
            max_cell_bytes=fields["file_max_cell_bytes"].default,
            max_row_bytes=fields["file_max_row_bytes"].default,
            max_row_group_bytes=fields["file_max_row_group_bytes"].default,
            max_text_bytes=fields["file_max_text_bytes"].default,
        )

    def over(self, what: str, limit: str, setting: str) -> OverLimit:
        return OverLimit(f"{what}: over the limit of {limit} (GLUEJOBS_{setting} raises it)")


# ------------------------------------------------------------------------------------------------
# Text files
# ------------------------------------------------------------------------------------------------


def check_text_file(path: Path, *, sep: str | None, quoted: bool, limits: FileLimits) -> int:
    """Rows, cells and columns of a text file within `limits` (`sep` None: one record per line); the
    longest row's bytes."""
    import numpy as np

    size = path.stat().st_size
    if size > limits.max_text_bytes:
        raise limits.over(
            f"the file holds {size} bytes", f"{limits.max_text_bytes} bytes", "FILE_MAX_TEXT_BYTES"
        )
    scan = _TextScan(limits, None if sep is None else ord(sep), quoted)
    with path.open("rb") as handle:
        offset = 0
        while block := handle.read(BLOCK):
            scan.block(np.frombuffer(block, dtype=np.uint8), offset)
            offset += len(block)
    scan.end(offset)
    return scan.longest_row


class _TextScan:
    """Row and cell boundaries across blocks. Quotes toggle "inside a quoted cell" (csv's rule for
    well-formed quoting, where an escaped quote is doubled); a stray quote in an unquoted cell can only
    make a row look longer than pandas reads it, never shorter."""

    def __init__(self, limits: FileLimits, sep: int | None, quoted: bool) -> None:
        self.limits, self.sep, self.quoted = limits, sep, quoted
        self.row_start = 0  # file offsets
        self.cell_start = 0
        self.rows = 0  # rows ended so far (the header is row 0)
        self.header_separators = 0
        self.inside = 0  # 1 while inside quotes
        self.longest_row = 0

    def block(self, data: np.ndarray, offset: int) -> None:
        import numpy as np

        rows = np.flatnonzero(data == _NEWLINE)
        cells = np.flatnonzero(data == self.sep) if self.sep is not None else rows[:0]
        if self.quoted:
            quotes = np.flatnonzero(data == _QUOTE)
            if len(quotes):
                rows = rows[((np.searchsorted(quotes, rows) + self.inside) & 1) == 0]
                cells = cells[((np.searchsorted(quotes, cells) + self.inside) & 1) == 0]
                self.inside = (self.inside + len(quotes)) & 1
        rows, cells = rows + offset, cells + offset
        if self.rows == 0:  # the header: its columns
            first = rows[0] if len(rows) else offset + len(data)
            self.header_separators += int(np.count_nonzero(cells < first))
            if self.sep is not None and self.header_separators + 1 > self.limits.max_columns:
                raise self.limits.over(
                    f"the header row has more than {self.limits.max_columns} columns",
                    f"{self.limits.max_columns} columns",
                    "FILE_MAX_COLUMNS",
                )
        if self.sep is not None:
            bounds = np.union1d(rows, cells)
            self._lengths(bounds, self.cell_start, offset + len(data), rows, cell=True)
            if len(bounds):
                self.cell_start = int(bounds[-1]) + 1
        self._lengths(rows, self.row_start, offset + len(data), rows, cell=False)
        if len(rows):
            self.row_start = int(rows[-1]) + 1
            self.rows += len(rows)

    def end(self, size: int) -> None:
        import numpy as np

        end = np.array([size], dtype=np.int64)
        if self.sep is not None:
            self._lengths(end, self.cell_start, size, end, cell=True)
        self._lengths(end, self.row_start, size, end, cell=False)

    def _lengths(self, ends: np.ndarray, start: int, block_end: int, rows: np.ndarray, *, cell: bool) -> None:
        """Refuse when a span between consecutive `ends` (the first from `start`), or the open one from
        the last end to `block_end`, is over the limit."""
        import numpy as np

        limit = self.limits.max_cell_bytes if cell else self.limits.max_row_bytes
        starts = np.concatenate(([start], ends + 1))
        lengths = np.concatenate((ends, [block_end])) - starts
        if not cell:
            self.longest_row = max(self.longest_row, int(lengths.max()))
        over = np.flatnonzero(lengths > limit)
        if not len(over):
            return
        at = int(starts[over[0]])
        row = self.rows + int(np.searchsorted(rows, at, side="right"))
        where = "the header row" if row == 0 else f"row {row}"
        if cell:
            raise self.limits.over(
                f"a cell in {where} is longer than {limit} bytes",
                f"{limit} bytes per cell",
                "FILE_MAX_CELL_BYTES",
            )
        raise self.limits.over(
            f"{where} is longer than {limit} bytes", f"{limit} bytes per row", "FILE_MAX_ROW_BYTES"
        )


# ------------------------------------------------------------------------------------------------
# JSON arrays
# ------------------------------------------------------------------------------------------------


def json_records(path: Path, limits: FileLimits) -> Iterator[tuple[Any, int]]:
    """The elements of the JSON array in `path`, one at a time with their length in characters, each
    at most a row's limit: memory is a block plus one element, whatever the array's length."""
    size = path.stat().st_size
    if size > limits.max_text_bytes:
        raise limits.over(
            f"the file holds {size} bytes", f"{limits.max_text_bytes} bytes", "FILE_MAX_TEXT_BYTES"
        )
    decoder = json.JSONDecoder()
    with path.open("rb") as handle:
        reader = _Chunks(handle)
        reader.skip_space(bom=True)
        if reader.take(1) != "[":
            raise ValueError("Expected a JSON array")
        reader.skip_space()
        if reader.peek() == "]":
            return
        index = 0
        while True:
            yield reader.element(decoder, limits, index)
            index += 1
            reader.skip_space()
            separator = reader.take(1)
            if separator == "]":
                reader.skip_space()
                if reader.peek():
                    raise ValueError("Trailing data after the JSON array")
                return
            if separator != ",":
                raise ValueError(f"Expected ',' or ']' after element {index} of the JSON array")
            reader.skip_space()


class _Chunks:
    """A text buffer over a binary file, refilled in blocks (utf-8); `pos` is where reading is."""

    def __init__(self, handle: Any) -> None:
        import codecs

        self.handle = handle
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.text = ""
        self.pos = 0
        self.eof = False

    def _fill(self) -> bool:
        if self.eof:
            return False
        block = self.handle.read(BLOCK)
        self.eof = not block
        self.text = self.text[self.pos :] + self.decoder.decode(block, final=self.eof)
        self.pos = 0
        return bool(block)

    def peek(self) -> str:
        while self.pos >= len(self.text) and self._fill():
            pass
        return self.text[self.pos : self.pos + 1]

    def take(self, n: int) -> str:
        head = self.peek()[:n]
        self.pos += len(head)
        return head

    def skip_space(self, *, bom: bool = False) -> None:
        space = _SPACE_OR_BOM if bom else _SPACE
        while True:
            self.pos += len(space.match(self.text, self.pos).group())  # type: ignore[union-attr]
            if self.pos < len(self.text) or not self._fill():
                return

    def element(self, decoder: json.JSONDecoder, limits: FileLimits, index: int) -> tuple[Any, int]:
        while True:
            try:
                value, end = decoder.raw_decode(self.text, self.pos)
            except json.JSONDecodeError:
                if len(self.text) - self.pos > limits.max_row_bytes:
                    raise _long_element(limits, index) from None
                if not self._fill():
                    raise
                continue
            if end >= len(self.text) and not self.eof and self._fill():
                continue  # a number may go on in the next block
            length = end - self.pos
            if length > limits.max_row_bytes:
                raise _long_element(limits, index)
            self.pos = end
            return value, length


_SPACE = re.compile(r"[ \t\r\n]*")
_SPACE_OR_BOM = re.compile(r"[\ufeff \t\r\n]*")


def _long_element(limits: FileLimits, index: int) -> OverLimit:
    limit = limits.max_row_bytes
    return limits.over(
        f"element {index + 1} of the JSON array is longer than {limit} bytes",
        f"{limit} bytes per row",
        "FILE_MAX_ROW_BYTES",
    )


# ------------------------------------------------------------------------------------------------
# Parquet
# ------------------------------------------------------------------------------------------------


def parquet_row_groups(path: Path, limits: FileLimits) -> Iterator[pa.Table]:
    """The row groups of a parquet file, each checked from the metadata and then cell by cell before
    it is handed out; string columns come as dictionary arrays (decode them piece by piece:
    `decoded_slices`)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    _check_footer(path)
    strings = check_parquet_metadata(path, limits)
    parquet = pq.ParquetFile(path, read_dictionary=strings)
    total = 0
    first = 0
    for group in range(parquet.metadata.num_row_groups):
        table = parquet.read_row_group(group)
        row_bytes = np.zeros(table.num_rows, dtype=np.int64)
        for name in strings:
            lengths = _cell_lengths(table.column(name), pa, pc)
            if len(lengths) and lengths.max() > limits.max_cell_bytes:
                row = first + int(np.argmax(lengths > limits.max_cell_bytes)) + 1
                raise limits.over(
                    f"a cell of column {_name(name)} on row {row} is longer than "
                    f"{limits.max_cell_bytes} bytes",
                    f"{limits.max_cell_bytes} bytes per cell",
                    "FILE_MAX_CELL_BYTES",
                )
            row_bytes += lengths
        if len(row_bytes) and row_bytes.max() > limits.max_row_bytes:
            row = first + int(np.argmax(row_bytes > limits.max_row_bytes)) + 1
            raise limits.over(
                f"row {row} is longer than {limits.max_row_bytes} bytes",
                f"{limits.max_row_bytes} bytes per row",
                "FILE_MAX_ROW_BYTES",
            )
        total += int(row_bytes.sum())
        if total > limits.max_text_bytes:
            raise limits.over(
                f"the file's strings come to more than {limits.max_text_bytes} bytes once decoded",
                f"{limits.max_text_bytes} bytes",
                "FILE_MAX_TEXT_BYTES",
            )
        yield table
        first += table.num_rows


def decoded_slices(table: pa.Table, piece_bytes: int) -> Iterator[pa.Table]:
    """`table` in slices of about `piece_bytes` of strings each, dictionary columns decoded."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    row_bytes = np.zeros(table.num_rows, dtype=np.int64)
    for column in table.columns:
        if _is_text(column.type, pa):
            row_bytes += _cell_lengths(column, pa, pc)
    ends = np.cumsum(row_bytes)
    start = 0
    while start < table.num_rows:
        before = int(ends[start - 1]) if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, before + piece_bytes, side="right")))
        stop = min(stop, table.num_rows)
        piece = table.slice(start, stop - start)
        columns = [
            column.cast(column.type.value_type) if pa.types.is_dictionary(column.type) else column
            for column in piece.columns
        ]
        yield pa.table(columns, names=piece.column_names)
        start = stop


def check_parquet_metadata(path: Path, limits: FileLimits) -> list[str]:
    """Columns and row groups within `limits`, from the footer alone; the file's string columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    _check_footer(path)
    metadata = pq.ParquetFile(path).metadata
    if metadata.num_columns > limits.max_columns:
        raise limits.over(
            f"the file has {metadata.num_columns} columns",
            f"{limits.max_columns} columns",
            "FILE_MAX_COLUMNS",
        )
    for group in range(metadata.num_row_groups):
        info = metadata.row_group(group)
        size = sum(info.column(j).total_uncompressed_size for j in range(info.num_columns))
        size += info.num_rows * info.num_columns * CELL_OVERHEAD
        if size > limits.max_row_group_bytes:
            raise limits.over(
                f"row group {group + 1} takes {size} bytes once read",
                f"{limits.max_row_group_bytes} bytes per row group",
                "FILE_MAX_ROW_GROUP_BYTES",
            )
    schema = pq.ParquetFile(path).schema_arrow
    return [field.name for field in schema if _is_text(field.type, pa)]


def check_file(path: Path, limits: FileLimits) -> None:
    """A data file's shape within `limits`, by its suffix, before a reader decodes it whole."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        check_parquet_file(path, limits)
    elif suffix == ".json" and _starts_an_array(path):
        for _record in json_records(path, limits):
            pass
    else:
        sep = {".csv": ",", ".tsv": "\t"}.get(suffix)
        check_text_file(path, sep=sep, quoted=suffix == ".csv", limits=limits)


def _starts_an_array(path: Path) -> bool:
    with path.open("rb") as handle:
        head = handle.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    return head.startswith(b"[")


def check_parquet_file(path: Path, limits: FileLimits) -> None:
    """The whole parquet file within `limits` (for a reader that decodes it at once afterwards)."""
    for _table in parquet_row_groups(path, limits):
        pass


def _check_footer(path: Path) -> None:
    with path.open("rb") as handle:
        handle.seek(0, 2)
        size = handle.tell()
        if size < 12:
            return  # too short to be parquet: pyarrow says so
        handle.seek(size - 8)
        (footer,) = struct.unpack("<i", handle.read(4))
    if footer > MAX_FOOTER_BYTES:
        raise OverLimit(
            f"the file's parquet metadata takes {footer} bytes: over the limit of {MAX_FOOTER_BYTES} bytes "
            "(fixed: about 100 bytes per column of each row group)"
        )


def _is_text(kind: pa.DataType, pa: Any) -> bool:
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return bool(
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    )


def _cell_lengths(column: pa.ChunkedArray, pa: Any, pc: Any) -> np.ndarray:
    """Each cell's length in bytes (0 for a null), without decoding a dictionary column's cells."""
    import numpy as np

    parts = []
    for chunk in column.chunks:
        if pa.types.is_dictionary(chunk.type):
            lengths = pc.binary_length(chunk.dictionary).take(chunk.indices)
        else:
            lengths = pc.binary_length(chunk)
        parts.append(lengths.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _name(name: str) -> str:
    from shared.core.errors import quote

    return quote(name)
