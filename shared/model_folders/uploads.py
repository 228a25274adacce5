"""A model folder sent to POST /v1/models as a tar, unpacked and checked without torch.

The tar is read member by member and only what a model folder holds is unpacked: regular files
with the suffixes transformers reads (config and tokenizer JSON, vocabularies, sentencepiece
models, weights) and folders. Anything else refuses the whole upload (422 naming the member):
symbolic and hard links, devices, absolute paths or `..` (which could write outside the folder),
Python files (remote code is never run), unexpected kinds of file, too many members, names that are
not UTF-8, too long, given twice, or both a file's and a folder's.

A tar CAN unpack to far more than it weighs (a GNU or PAX sparse member of 4 GiB is a few hundred
bytes of map), so every header is read first and the members' declared sizes (a sparse member's real
size, which tarfile reports as its `size`) are summed and compared with GLUEJOBS_MAX_MODEL_BYTES
before a byte is written (413); the files the API reads whole (config.json, tokenizer files) have
caps of their own. tarfile takes a header cut short, or garbage where a header belongs, for the end of
the archive: a whole archive ends with its zeroed end-of-archive block, so one without it is refused
as cut short or malformed (422), as is one whose data ends early.

Then the folder must be loadable: a config.json whose `model_type` transformers knows
(shared/model_folders/model_types.py), no `auto_map` (code from the model's repository), a tokenizer,
weights, and a declared shape within GLUEJOBS_MAX_MODEL_PARAMETERS (shared/model_folders/model_size.py).
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path, PurePosixPath
from typing import Any

from shared.core.errors import GluejobsError, InvalidRequest
from shared.jobspec.registered_models import ManifestFile
from shared.model_folders.model_size import MAX_CONFIG_BYTES, check_model_size
from shared.model_folders.model_types import KNOWN_MODEL_TYPES

FIELD = "file"
MAX_MEMBERS = 1000
MAX_DEPTH = 4
# A member's path, and one part of it (what file systems hold: 255 bytes a name).
MAX_NAME_CHARS = 200
MAX_PART_BYTES = 255
# Tokenizer files are read whole by the dry run's tokenizer: XLM-R's tokenizer.json, among the
# largest, is 17 MB.
MAX_TOKENIZER_BYTES = 64 * 1024 * 1024
BLOCK = tarfile.BLOCKSIZE
# A GNU long name or link and a PAX header are read whole into memory and parsed by tarfile before any
# check here sees their member: a 200 MB long name or PAX record of a 200 MB upload made the API hold
# 800 MB and kept /healthz from another client waiting 1.4-4.9 s (issue 32's re-test). A name is at
# most MAX_NAME_CHARS and a real folder's PAX header a few hundred bytes (GNU's 0.0 sparse map of a
# fragmented file some KB), so 1 MiB refuses no folder a tool writes.
MAX_HEADER_BYTES = 1024 * 1024
# What transformers reads from a model folder (sentence-transformers' module folders add JSON files).
ALLOWED_SUFFIXES = (".json", ".txt", ".model", ".safetensors", ".bin", ".tiktoken", ".md")
WEIGHT_SUFFIXES = (".safetensors", ".bin")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model")
WEIGHT_FILES = (
    "model.safetensors",
    "pytorch_model.bin",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
)
# What the API keeps of a registered model for its checks and dry runs: config and tokenizer.
TOKENIZER_SUFFIXES = (".json", ".txt", ".model", ".tiktoken")


class ModelTooLarge(GluejobsError):
    """The model folder unpacks to more than the API accepts (GLUEJOBS_MAX_MODEL_BYTES)."""

    status_code = 413
    code = "request_too_large"


class _BoundedTarInfo(tarfile.TarInfo):
    """tarfile's member header, refusing a long name, long link or PAX header past MAX_HEADER_BYTES
    before tarfile reads it (its _proc_* hooks are how TarFile(tarinfo=...) customises parsing)."""

    def _proc_gnulong(self, archive: tarfile.TarFile) -> tarfile.TarInfo:
        _check_header_size(self)
        return super()._proc_gnulong(archive)  # type: ignore[misc]

    def _proc_pax(self, archive: tarfile.TarFile) -> tarfile.TarInfo:
        _check_header_size(self)
        return super()._proc_pax(archive)  # type: ignore[misc]


def _check_header_size(header: tarfile.TarInfo) -> None:
    if header.size > MAX_HEADER_BYTES:
        raise InvalidRequest(
            f"the tar is malformed: a member's long name or PAX header declares {header.size} bytes, "
            f"more than the {MAX_HEADER_BYTES} a model folder's member needs",
            field=FIELD,
        )


def unpack_model_tar(tar_path: Path, into: Path, *, max_bytes: int) -> list[ManifestFile]:
    """Unpack a model folder's tar into `into` (which must not exist) and return its files' manifest
    entries. InvalidRequest naming the member that may not be in a model folder, or the archive's
    fault; ModelTooLarge when its members together declare more than `max_bytes`. Nothing is
    written before every header has been read and checked."""
    try:
        # Uncompressed only: no decompression bomb. Closed by the `with` below.
        archive = tarfile.open(tar_path, mode="r:", tarinfo=_BoundedTarInfo)  # noqa: SIM115
    except (tarfile.TarError, OSError, ValueError):  # ValueError: the first member's pax numbers
        raise InvalidRequest(
            "the upload is not an (uncompressed) tar of a model folder (gluejobs models upload makes one)",
            field=FIELD,
        ) from None
    with archive:
        members = _checked_members(archive, tar_path, max_bytes)
        files: list[ManifestFile] = []
        into.mkdir(parents=True)
        for member, relative in members:
            if member.isdir():
                (into / relative).mkdir(parents=True, exist_ok=True)
                continue
            target = into / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            files.append(_unpack_file(archive, member, relative, target))
    if not files:
        raise InvalidRequest("the folder is empty", field=FIELD)
    return files


def _unpack_file(
    archive: tarfile.TarFile, member: tarfile.TarInfo, relative: PurePosixPath, target: Path
) -> ManifestFile:
    digest = hashlib.sha256()
    try:
        source = archive.extractfile(member)
        if source is None:
            raise InvalidRequest(f"{relative.as_posix()!r} could not be read from the tar", field=FIELD)
        with source, target.open("xb") as out:
            while chunk := source.read(1024 * 1024):
                digest.update(chunk)
                out.write(chunk)
    except (tarfile.TarError, EOFError):  # tarfile's "unexpected end of data"
        raise InvalidRequest(
            f"the tar ends in the middle of {relative.as_posix()!r}: it is cut short", field=FIELD
        ) from None
    return ManifestFile(path=relative.as_posix(), bytes=member.size, sha256=digest.hexdigest())


def _checked_members(
    archive: tarfile.TarFile, tar_path: Path, max_bytes: int
) -> list[tuple[tarfile.TarInfo, PurePosixPath]]:
    """Every member to unpack with its path in the folder, after reading every header: each name
    checked, none twice, no path both a file and a folder, the declared sizes within the caps."""
    members: list[tuple[tarfile.TarInfo, PurePosixPath]] = []
    files: set[PurePosixPath] = set()
    folders: set[PurePosixPath] = set()
    total = 0
    try:
        for count, member in enumerate(archive, start=1):
            if count > MAX_MEMBERS:
                raise InvalidRequest(f"the folder holds more than {MAX_MEMBERS} entries", field=FIELD)
            _check_layout(member)
            relative = _member_path(member)
            if relative is None:
                continue
            name = relative.as_posix()
            if relative in files:
                twice = "both a file and a folder" if member.isdir() else "in the tar twice"
                raise InvalidRequest(f"{name!r} is {twice}", field=FIELD)
            for parent in relative.parents:
                if parent in files:
                    raise InvalidRequest(f"{parent.as_posix()!r} is both a file and a folder", field=FIELD)
                folders.add(parent)
            if member.isdir():
                folders.add(relative)
            elif relative in folders:
                raise InvalidRequest(f"{name!r} is both a file and a folder", field=FIELD)
            else:
                files.add(relative)
                _check_size(relative, member.size)
                total += member.size
                if total > max_bytes:
                    raise ModelTooLarge(
                        f"the folder unpacks to more than {max_bytes} bytes (GLUEJOBS_MAX_MODEL_BYTES)",
                        field=FIELD,
                    )
            members.append((member, relative))
        ended = archive.offset
    # tarfile reads a pax record's number or a sparse map with int() and lets its ValueError through.
    except (tarfile.TarError, EOFError, ValueError):
        raise InvalidRequest(
            "the tar is cut short or malformed: a member's header could not be read", field=FIELD
        ) from None
    with tar_path.open("rb") as raw:
        raw.seek(ended)
        if raw.read(BLOCK) != bytes(BLOCK):
            raise InvalidRequest(
                "the tar is cut short or malformed: it does not end where its last member does",
                field=FIELD,
            )
    return members


def _check_layout(member: tarfile.TarInfo) -> None:
    """A member's sizes as tarfile read them, before it reads on: a negative size (base-256 or a pax
    record) sends its next read backwards (an OSError, a 500) and would lower the sum the folder's cap
    is held to; a sparse map's pieces must lie inside the member's size, or the size counted is not
    what would be written."""
    pieces: list[tuple[int, int]] = getattr(member, "sparse", None) or []  # typeshed leaves it out
    if member.size < 0 or any(
        offset < 0 or length < 0 or offset + length > member.size for offset, length in pieces
    ):
        raise InvalidRequest(
            "the tar is cut short or malformed: a member's header declares a size it cannot have",
            field=FIELD,
        )


def _check_size(relative: PurePosixPath, size: int) -> None:
    """The caps of the files the API reads whole."""
    if relative.name == "config.json" and size > MAX_CONFIG_BYTES:
        raise InvalidRequest(
            f"{relative.as_posix()!r} is larger than {MAX_CONFIG_BYTES} bytes, the most a config may be",
            field=FIELD,
        )
    if not relative.name.endswith(WEIGHT_SUFFIXES) and size > MAX_TOKENIZER_BYTES:
        raise InvalidRequest(
            f"{relative.as_posix()!r} is larger than {MAX_TOKENIZER_BYTES} bytes, the most a model's "
            "config or tokenizer file may be",
            field=FIELD,
        )


def _member_path(member: tarfile.TarInfo) -> PurePosixPath | None:
    """The member's path inside the folder (None for the folder itself); InvalidRequest for a member
    that may not be in a model folder."""
    name = member.name
    try:
        # tarfile decodes names with surrogateescape: bytes that are not UTF-8 come back as
        # surrogates, which neither a database row nor a JSON answer can hold.
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest(f"a member's name is not UTF-8 text: {name!a}", field=FIELD) from None
    if len(name) > MAX_NAME_CHARS:
        raise InvalidRequest(
            f"a member's name is longer than {MAX_NAME_CHARS} characters: {name[:40]!r}...", field=FIELD
        )
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise InvalidRequest(f"a member's name holds a control character: {name!a}", field=FIELD)
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or "\\" in name:
        raise InvalidRequest(f"{name!r} leaves the model folder (absolute, or with '..')", field=FIELD)
    if any(len(part.encode()) > MAX_PART_BYTES for part in path.parts):
        raise InvalidRequest(
            f"a member's name has a part longer than {MAX_PART_BYTES} bytes: {name[:40]!r}...", field=FIELD
        )
    parts = [part for part in path.parts if part != "."]
    if not parts:
        return None
    relative = PurePosixPath(*parts)
    if member.issym() or member.islnk():
        raise InvalidRequest(
            f"{relative.as_posix()!r} is a link: a model folder holds its files themselves", field=FIELD
        )
    if member.isdir():
        if len(parts) >= MAX_DEPTH:
            raise InvalidRequest(f"{relative.as_posix()!r} is nested too deep", field=FIELD)
        return relative
    if not member.isfile():
        raise InvalidRequest(f"{relative.as_posix()!r} is not a regular file", field=FIELD)
    if len(parts) > MAX_DEPTH:
        raise InvalidRequest(f"{relative.as_posix()!r} is nested too deep", field=FIELD)
    if relative.suffix == ".py":
        raise InvalidRequest(
            f"{relative.as_posix()!r} is Python code: gluejobs never runs a model's own code", field=FIELD
        )
    if not relative.name.endswith(ALLOWED_SUFFIXES) or relative.name.startswith("."):
        raise InvalidRequest(
            f"{relative.as_posix()!r} is not a file a model folder holds (expected "
            f"{', '.join(ALLOWED_SUFFIXES)} files)",
            field=FIELD,
        )
    return relative


def check_model_folder(folder: Path, *, max_parameters: int) -> str:
    """The folder's model_type when transformers can load it without remote code and its declared
    shape is within `max_parameters` (GLUEJOBS_MAX_MODEL_PARAMETERS); InvalidRequest naming what is
    missing or refused."""
    config = _json_object(folder / "config.json", required=True)
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise InvalidRequest("config.json has no model_type", field=FIELD)
    if model_type not in KNOWN_MODEL_TYPES:
        raise InvalidRequest(
            f"config.json's model_type {model_type!r} is not one transformers knows", field=FIELD
        )
    for name in ("config.json", "tokenizer_config.json"):
        if "auto_map" in _json_object(folder / name, required=False):
            raise InvalidRequest(
                f"{name} has an auto_map: the model needs its own code, which gluejobs never runs",
                field=FIELD,
            )
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise InvalidRequest(
            f"the folder has no tokenizer (one of {', '.join(TOKENIZER_FILES)})", field=FIELD
        )
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise InvalidRequest(f"the folder has no weights (one of {', '.join(WEIGHT_FILES)})", field=FIELD)
    check_model_size(config, max_parameters, field=FIELD)
    return model_type


def _json_object(path: Path, *, required: bool) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise InvalidRequest(
                f"the folder has no {path.name}: not a transformers model folder", field=FIELD
            )
        return {}
    try:
        with path.open("rb") as f:  # capped at unpacking too: a caller may hand any folder
            parsed = json.loads(f.read(MAX_TOKENIZER_BYTES + 1))
    except (OSError, ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        raise InvalidRequest(f"{path.name} is not valid JSON", field=FIELD) from None
    if not isinstance(parsed, dict):
        raise InvalidRequest(f"{path.name} is not a JSON object", field=FIELD)
    return parsed


def is_tokenizer_file(path: str) -> bool:
    """Whether the API keeps this file of a registered model for its checks (top level, not weights)."""
    return "/" not in path and path.endswith(TOKENIZER_SUFFIXES) and not path.endswith(".index.json")
