"""A model folder sent to POST /v1/models as a tar, unpacked and checked without torch.

The tar is read member by member and only what a model folder holds is unpacked: regular files
with the suffixes transformers reads (config and tokenizer JSON, vocabularies, sentencepiece
models, weights) and folders. Anything else refuses the whole upload (422 naming the member):
symbolic and hard links, devices, absolute paths or `..` (which could write outside the folder),
Python files (remote code is never run), unexpected kinds of file, too many members. An
uncompressed tar cannot unpack to more than it weighs, so the upload's size limit bounds the folder.

Then the folder must be loadable: a config.json whose `model_type` transformers knows
(shared/model_folders/model_types.py), no `auto_map` (code from the model's repository), a tokenizer, weights.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path, PurePosixPath
from typing import Any

from shared.core.errors import InvalidRequest
from shared.jobspec.registered_models import ManifestFile
from shared.model_folders.model_types import KNOWN_MODEL_TYPES

FIELD = "file"
MAX_MEMBERS = 1000
MAX_DEPTH = 4
# What transformers reads from a model folder (sentence-transformers' module folders add JSON files).
ALLOWED_SUFFIXES = (".json", ".txt", ".model", ".safetensors", ".bin", ".tiktoken", ".md")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model")
WEIGHT_FILES = (
    "model.safetensors",
    "pytorch_model.bin",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
)
# What the API keeps of a registered model for its checks and dry runs: config and tokenizer.
TOKENIZER_SUFFIXES = (".json", ".txt", ".model", ".tiktoken")


def unpack_model_tar(tar_path: Path, into: Path) -> list[ManifestFile]:
    """Unpack a model folder's tar into `into` (which must not exist) and return its files' manifest
    entries. InvalidRequest naming the member that may not be in a model folder."""
    try:
        # Uncompressed only: no decompression bomb. Closed by the `with` below.
        archive = tarfile.open(tar_path, mode="r:")  # noqa: SIM115
    except (tarfile.TarError, OSError):
        raise InvalidRequest(
            "the upload is not an (uncompressed) tar of a model folder (gluejobs models upload makes one)",
            field=FIELD,
        ) from None
    files: list[ManifestFile] = []
    into.mkdir(parents=True)
    with archive:
        for count, member in enumerate(archive, start=1):
            if count > MAX_MEMBERS:
                raise InvalidRequest(f"the folder holds more than {MAX_MEMBERS} entries", field=FIELD)
            relative = _member_path(member)
            if relative is None:
                continue
            if member.isdir():
                (into / relative).mkdir(parents=True, exist_ok=True)
                continue
            target = into / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            source = archive.extractfile(member)
            if source is None:
                raise InvalidRequest(f"{member.name!r} could not be read from the tar", field=FIELD)
            digest = hashlib.sha256()
            with source, target.open("xb") as out:
                while chunk := source.read(1024 * 1024):
                    digest.update(chunk)
                    out.write(chunk)
            files.append(ManifestFile(path=relative.as_posix(), bytes=member.size, sha256=digest.hexdigest()))
    if not files:
        raise InvalidRequest("the folder is empty", field=FIELD)
    return files


def _member_path(member: tarfile.TarInfo) -> PurePosixPath | None:
    """The member's path inside the folder (None for the folder itself); InvalidRequest for a member
    that may not be in a model folder."""
    name = member.name
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or "\\" in name or "\x00" in name:
        raise InvalidRequest(f"{name!r} leaves the model folder (absolute, or with '..')", field=FIELD)
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


def check_model_folder(folder: Path) -> str:
    """The folder's model_type when transformers can load it without remote code; InvalidRequest
    naming what is missing or refused."""
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
    return model_type


def _json_object(path: Path, *, required: bool) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise InvalidRequest(
                f"the folder has no {path.name}: not a transformers model folder", field=FIELD
            )
        return {}
    try:
        parsed = json.loads(path.read_text())
    except (OSError, ValueError):
        raise InvalidRequest(f"{path.name} is not valid JSON", field=FIELD) from None
    if not isinstance(parsed, dict):
        raise InvalidRequest(f"{path.name} is not a JSON object", field=FIELD)
    return parsed


def is_tokenizer_file(path: str) -> bool:
    """Whether the API keeps this file of a registered model for its checks (top level, not weights)."""
    return "/" not in path and path.endswith(TOKENIZER_SUFFIXES) and not path.endswith(".index.json")
