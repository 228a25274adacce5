"""Where `jobs.download` writes, and the only code that writes there. Every path the API names — in
its artifact listing, or as a member of a folder's tar stream — and every path asked for is
resolved (links already in the destination followed) and refused, naming it, when it leaves the
destination folder. A tar stream may hold regular files and folders only: a link, a device or a
FIFO is refused. Everything is checked before anything is written, and each file is written beside
its place under a fresh name and renamed into place once whole, so a refused entry or a failed
transfer leaves nothing behind.

The members of a tar stream are written here rather than by `tarfile.extractall(filter="data")`:
PEP 706's filter lets links that stay inside through, and it has had bypasses (CVE-2025-4517,
fixed in Python 3.11.13, later than the 3.11 this project supports); copying the regular files of
a checked list needs neither. A local process that swaps a folder for a link while a download runs
is outside this guard: the destination is the user's own.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote

import httpx

from gluejobs._core import DEFAULT_TIMEOUT_S, Call
from gluejobs._types import ApiError, Artifact
from shared.wire.job_folder import MERGED_DIR
from shared.wire.vocabulary import COLUMN_FIELDS

MERGED = MERGED_DIR  # the folder of a model with a LoRA adapter merged in (worker/training/outputs.py)
# What a merge on request copies from the LoRA job's spec: the task or the file and its columns (the
# labels' names and count); the merge job evaluates one row, the least a job without training does.
MERGE_KEEPS = ("task_name", "validation_file", *COLUMN_FIELDS, "max_length")
DOWNLOAD_KINDS = ("model", "predictions")  # what `download` fetches without a checkpoint or path
DOWNLOAD_TIMEOUT = httpx.Timeout(DEFAULT_TIMEOUT_S, read=300.0)
TAR_TYPE = "application/x-tar"
COPY_BYTES = 1 << 20
_MEMBER_KINDS = {
    tarfile.SYMTYPE: "symbolic link",
    tarfile.LNKTYPE: "hard link",
    tarfile.CHRTYPE: "character device",
    tarfile.BLKTYPE: "block device",
    tarfile.FIFOTYPE: "FIFO",
}

Receiver = Callable[[httpx.Headers], AbstractContextManager[BinaryIO]]


class Download:
    """One `jobs.download` call: what to fetch, where each answer lands."""

    def __init__(
        self, job_id: int, dest: str | os.PathLike[str], *, checkpoint: int | None, path: str | None
    ) -> None:
        self.job_id = job_id
        Path(dest).mkdir(parents=True, exist_ok=True)
        self.root = Path(dest).resolve()
        asked = [f"checkpoints/checkpoint-{checkpoint}"] if checkpoint is not None else [path] if path else []
        for item in asked:
            self.place(item, "the path asked for")
        self.requested = asked

    def choose(self, artifacts: Iterable[Artifact]) -> list[str]:
        """The final model's files (and predictions) of the listing, every one checked before the
        first is fetched."""
        paths = [a.path for a in artifacts if a.kind in DOWNLOAD_KINDS]
        if not paths:
            raise ApiError(404, "not_found", f"job {self.job_id} has no model files yet")
        for item in paths:
            self.place(item, f"the path job {self.job_id}'s artifact listing names")
        return paths

    def call(self, item: str) -> Call:
        return Call("GET", f"/v1/jobs/{self.job_id}/artifacts/{quote(item)}", timeout=DOWNLOAD_TIMEOUT)

    def receiver(self, item: str) -> Receiver:
        """Where the answer for `item` goes, given its headers (the client opens it once per try)."""
        return partial(self._receive, item)

    @contextmanager
    def _receive(self, item: str, headers: httpx.Headers) -> Iterator[BinaryIO]:
        if not headers.get("content-type", "").startswith(TAR_TYPE):
            with new_file(self.place(item, "the path asked for")) as handle:
                yield handle
            return
        # A folder comes as a tar stream: into an unnamed file (gone whatever happens), then unpacked.
        with tempfile.TemporaryFile(dir=self.root) as scratch:
            yield scratch
            scratch.seek(0)
            self._unpack(scratch, item)

    def place(self, name: str, source: str, *, may_be_root: bool = False) -> Path:
        """`name` under the destination, links resolved; refused when it leaves the destination
        (or names the destination itself, where a file is meant)."""
        target = None if "\0" in name or not name else (self.root / name).resolve()
        if (
            target is None
            or not target.is_relative_to(self.root)
            or (target == self.root and not may_be_root)
        ):
            raise ApiError(
                0,
                "unsafe_path",
                f"refused {source} {name!r}: it leads outside {self.root}; nothing was written for it",
                field="path",
            )
        return target

    def _unpack(self, scratch: BinaryIO, item: str) -> None:
        source = f"the tar stream of {item!r}: its member"
        try:
            with tarfile.open(fileobj=scratch, mode="r:") as archive:
                # Every member is checked before the first is written.
                members = [(m, self._member_place(m, source)) for m in archive]
                for member, target in members:
                    if member.isdir():
                        target.mkdir(parents=True, exist_ok=True)
                        continue
                    with archive.extractfile(member) as data, new_file(target) as handle:  # type: ignore[union-attr]
                        shutil.copyfileobj(data, handle, COPY_BYTES)
        except tarfile.TarError as exc:
            raise ApiError(
                0, "invalid_answer", f"{source.split(':')[0]} is not a readable tar: {exc}"
            ) from None

    def _member_place(self, member: tarfile.TarInfo, source: str) -> Path:
        if not (member.isreg() or member.isdir()):
            kind = _MEMBER_KINDS.get(member.type, f"special file (type {member.type!r})")
            link = f" to {member.linkname!r}" if member.linkname else ""
            raise ApiError(
                0,
                "unsafe_path",
                f"refused {source} {member.name!r} is a {kind}{link}, which a download does not create "
                f"in {self.root}; nothing of the stream was written",
                field="path",
            )
        return self.place(member.name, source, may_be_root=member.isdir())


@contextmanager
def new_file(final: Path) -> Iterator[BinaryIO]:
    """A file that becomes `final` once written whole: written under a fresh name beside it (created
    exclusively, so never through a link), renamed into place, removed on any failure."""
    final.parent.mkdir(parents=True, exist_ok=True)
    temp = final.parent / f".gluejobs-{secrets.token_hex(6)}.partial"
    descriptor = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            yield handle
        os.replace(temp, final)
    finally:
        temp.unlink(missing_ok=True)


def merge_spec(job_id: int, spec: dict[str, Any], checkpoint: int | None) -> dict[str, Any]:
    """The spec of the job that saves LoRA job `job_id`'s adapter (its final one, or its checkpoint at
    step `checkpoint`) merged into its base: an evaluation of one row with save_merged_model."""
    if not spec.get("apply_lora"):
        raise ApiError(
            422,
            "invalid_request",
            f"job {job_id} trained no LoRA adapter: its model is a full model already (download it as it is)",
            field="merged",
        )
    source = f"job:{job_id}" if checkpoint is None else f"job:{job_id}/checkpoint-{checkpoint}"
    kept = {name: spec[name] for name in MERGE_KEEPS if spec.get(name) is not None}
    return {
        **kept,
        "model_name_or_path": source,
        "do_train": False,
        "do_eval": True,
        "max_eval_samples": 1,
        "save_merged_model": True,
    }
