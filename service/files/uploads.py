"""Receiving an upload: a multipart/form-data body streamed to a file on this machine's disk as it
arrives, hashed (sha256) on the way, never held whole in memory.

python-multipart (the parser Starlette's own form reading uses) is driven by hand rather than
through `request.form()`: Starlette spools each file to a temporary file of its own choosing and
hands it over only once the body has arrived, after which it would be read again to hash it and
copied again to where it belongs. Here each piece of the file part is written and hashed as the
parser sees it, and the upload's size limit is enforced on the bytes received (413 the moment it is
passed). Whatever happens before the upload is whole (a client that goes away, a malformed body, a
part too large) removes what was written: a cut-off upload leaves nothing.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request

from service.files.upload_values import refuse_unstorable_filename
from shared.core.errors import GluejobsError, InvalidRequest

FILE_FIELD = "file"
MAX_FIELD_BYTES = 1024  # the small form fields beside the file (purpose, task_name)
MAX_FIELDS = 8


class UploadTooLarge(GluejobsError):
    """The uploaded file is larger than the API accepts."""

    status_code = 413
    code = "request_too_large"


class UploadCutOff(GluejobsError):
    """The client went away before the upload was whole; nothing was kept."""

    status_code = 400
    code = "bad_request"


@dataclass
class Received:
    path: Path  # the file's bytes, on this machine
    filename: str
    bytes: int
    sha256: str
    fields: dict[str, str] = field(default_factory=dict)


class _Parts:
    """The parser's callbacks: the file part into `into`, every other field into memory (small)."""

    def __init__(self, into: Path, max_bytes: int) -> None:
        self.into = into
        self.max_bytes = max_bytes
        self.fields: dict[str, str] = {}
        self.filename: str | None = None
        self.size = 0
        self.digest = hashlib.sha256()
        self._header_name = b""
        self._header_value = b""
        self._headers: dict[bytes, bytes] = {}
        self._name: str | None = None
        self._value = bytearray()
        self._out: IO[bytes] | None = None
        self._file_parts = 0

    def callbacks(self) -> dict[str, object]:
        return {
            "on_part_begin": self._part_begin,
            "on_header_field": lambda data, start, end: self._add("_header_name", data[start:end]),
            "on_header_value": lambda data, start, end: self._add("_header_value", data[start:end]),
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
        }

    def _add(self, name: str, data: bytes) -> None:
        value = getattr(self, name) + data
        if len(value) > MAX_FIELD_BYTES:
            raise InvalidRequest("a multipart header is too long", field=FILE_FIELD)
        setattr(self, name, value)

    def _part_begin(self) -> None:
        self._headers, self._name, self._value = {}, None, bytearray()

    def _header_end(self) -> None:
        self._headers[self._header_name.strip().lower()] = self._header_value.strip()
        self._header_name, self._header_value = b"", b""

    def _headers_finished(self) -> None:
        _kind, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        name = options.get(b"name", b"").decode("utf-8", "replace")
        if not name:
            raise InvalidRequest("a multipart part has no name (Content-Disposition: form-data; name=…)")
        self._name = name
        if name == FILE_FIELD:
            self._file_parts += 1
            if self._file_parts > 1:
                raise InvalidRequest("send one file per upload", field=FILE_FIELD)
            raw = options.get(b"filename", b"").decode("utf-8", "replace")
            self.filename = Path(raw.replace("\\", "/")).name  # a name, never a path of the client's
            refuse_unstorable_filename(self.filename)  # before a byte of the file is written
            self._out = self.into.open("wb")
        elif len(self.fields) >= MAX_FIELDS:
            raise InvalidRequest(f"at most {MAX_FIELDS} form fields beside the file")

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        piece = data[start:end]
        if self._name == FILE_FIELD and self._out is not None:
            self.size += len(piece)
            if self.size > self.max_bytes:
                raise UploadTooLarge(
                    f"the file is larger than {self.max_bytes} bytes (GLUEJOBS_MAX_UPLOAD_BYTES)",
                    field=FILE_FIELD,
                )
            self._out.write(piece)
            self.digest.update(piece)
        else:
            self._value += piece
            if len(self._value) > MAX_FIELD_BYTES:
                raise InvalidRequest(f"form field {self._name!r} is longer than {MAX_FIELD_BYTES} bytes")

    def _part_end(self) -> None:
        if self._name == FILE_FIELD and self._out is not None:
            self._out.close()
            self._out = None
        elif self._name is not None:
            self.fields[self._name] = self._value.decode("utf-8", "replace")

    @property
    def writing(self) -> bool:
        """Whether the file part has begun and not ended."""
        return self._out is not None

    def close(self) -> None:
        if self._out is not None:
            self._out.close()


async def receive_upload(request: Request, *, folder: Path, max_bytes: int) -> Received:
    """The request's file part on disk in `folder` (a name of its own), hashed, with the other form
    fields. InvalidRequest for a body that is not one file in multipart/form-data; the file is gone
    again on any failure."""
    kind, options = parse_options_header(request.headers.get("content-type"))
    boundary = options.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise InvalidRequest(
            "send the file as multipart/form-data with a part named 'file' (curl -F file=@train.csv)",
            field=FILE_FIELD,
        )
    folder.mkdir(parents=True, exist_ok=True)
    into = folder / f"upload-{secrets.token_hex(8)}.partial"
    parts = _Parts(into, max_bytes)
    try:
        try:
            parser = MultipartParser(boundary, parts.callbacks())  # type: ignore[arg-type]
        except ValueError as exc:
            raise InvalidRequest(f"the multipart boundary is not valid: {exc}", field=FILE_FIELD) from None
        try:
            async for chunk in request.stream():
                parser.write(chunk)
            parser.finalize()
        except ClientDisconnect:
            raise UploadCutOff() from None
        except (GluejobsError, HTTPException):  # ours, and the request guard's 408 and 413
            raise
        except Exception as exc:  # python-multipart's MultipartParseError and kin: a malformed body
            raise InvalidRequest(f"the multipart body could not be read: {exc}", field=FILE_FIELD) from None
        if parts.filename is None:
            raise InvalidRequest("no file in the upload: send it as the part named 'file'", field=FILE_FIELD)
        if not parts.filename:
            raise InvalidRequest(
                "the uploaded file has no name (its name gives its format)", field=FILE_FIELD
            )
        if parts.writing:
            raise InvalidRequest("the multipart body ended in the middle of the file", field=FILE_FIELD)
    except BaseException:
        parts.close()
        into.unlink(missing_ok=True)
        raise
    return Received(into, parts.filename, parts.size, parts.digest.hexdigest(), parts.fields)
