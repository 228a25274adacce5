"""What a user reads of a job's failure: its cause, without traceback frames or places on the worker.

A failed job's `error`, and the event that announces it, are read by whoever submitted the job;
the worker's machine is the operator's. The text a job's process reports, and the last lines of its
log quoted after it, are therefore rewritten before the job's row gets them:

- Traceback blocks go: the "Traceback (most recent call last):" line, its frames and source lines,
  and the lines that join chained exceptions. The exception's own last line stays: it is the cause.
- A path on this machine becomes what the user named: a file under GLUEJOBS_DATA_DIR, GLUE_DIR or
  MODELS_DIR its path relative to that folder (what the spec said), a file inside the job's folder
  its path in the job, the cached copy of an uploaded file that file's name, a registered model's
  cached folder the model's name, a Hugging Face cache folder its repository id, an object in the
  store (s3://bucket/prefix/key, or s3fs's bucket/prefix/key) its key, the S3 endpoint "the file
  store", and any other absolute path (site-packages, the home folder, a temporary folder) its last
  component.

Operators keep the full text: the job's log file holds the traceback as it was written, and the
worker's own log the cause as it was reported (worker/fleet/supervisor.py). Torch-free, like the runner.

The API applies the same rules to what a non-admin key reads of a job (service/user_views.py): the
job's log, and the paths of its result and reproducibility record. It lives here, not in worker/,
because service/ may not import worker/.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from shared.core.config import Settings
from shared.jobspec.spec import JobSpec

# What ends a path inside a sentence: quotes, brackets, separators. (A colon too: "file.py:12".)
_END = r"""\s'"`(),:;<>\[\]{}"""
_TAIL = rf"[^{_END}]*"
# An absolute path of two parts or more, not inside a word or a URL ("https://host/a/b"), and not
# one of the API's own paths (/v1/jobs/7/artifacts/…), which users are meant to read.
_ABSOLUTE = re.compile(rf"(?<![\w.:/~-])(?!/v1/)(?:~)?/(?:[^{_END}/]+/)+[^{_END}/]*")
# A Hugging Face cache folder: …/models--org--name/snapshots/<revision>[/file].
_HUB_CACHE = re.compile(
    rf"(?<![\w.:/~-])(?:~)?/(?:[^{_END}/]+/)*models--(?P<repo>[^{_END}/]+)/snapshots/[^{_END}/]+"
    rf"(?:/(?P<rest>{_TAIL}))?"
)
_TRACEBACK_START = "Traceback (most recent call last):"
_JOINTS = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)
_FRAME = re.compile(r'^\s*File "[^"]*", line \d+')


def drop_tracebacks(text: str) -> str:
    """`text` without its traceback blocks: each exception's last line is kept."""
    kept: list[str] = []
    in_traceback = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith(_TRACEBACK_START):
            in_traceback = True  # the header may follow a log line's prefix on the same line
            before = line[: line.rfind(_TRACEBACK_START)].rstrip()
            if before:
                kept.append(before)
            continue
        if stripped in _JOINTS or _FRAME.match(line):
            continue
        if in_traceback:
            if not stripped or line[:1].isspace():
                continue  # a frame's source line, its ^^^ markers, an exception group's box
            in_traceback = False
        if stripped or (kept and kept[-1].strip()):  # one blank line where a joint was, not three
            kept.append(line)
    return "\n".join(kept).strip("\n")


@dataclass(frozen=True)
class Places:
    """Folders on the worker's machine, each with what a user calls a path inside it."""

    folders: list[tuple[str, Callable[[str], str]]] = field(default_factory=list)

    def add(self, folder: Path | str | None, name: Callable[[str], str]) -> None:
        if folder is None:
            return
        spellings = (
            {folder}
            if isinstance(folder, str)
            else {str(p) for p in (folder, folder.resolve(), folder.absolute())}
        )
        for spelling in spellings:
            if spelling.rstrip("/") not in ("", "."):
                self.folders.append((spelling.rstrip("/"), name))

    def rewrite(self, text: str) -> str:
        """`text` with each place replaced by its user's name (the longest folder first: the job's
        folder sits inside the artifacts folder, the model cache inside the cache folder)."""
        text = _HUB_CACHE.sub(lambda m: _joined(m["repo"].replace("--", "/"), m["rest"]), text)
        for folder, name in sorted(self.folders, key=lambda item: -len(item[0])):
            pattern = re.compile(rf"(?<![\w.-]){re.escape(folder)}(?:/(?P<rest>{_TAIL}))?(?=[{_END}]|$)")
            text = pattern.sub(_renamer(name), text)
        return _ABSOLUTE.sub(lambda m: _last_part(m.group(0)), text)


def places_of(settings: Settings, job_dirs: Iterable[Path], spec: JobSpec | None) -> Places:
    """The places of one job's worker: its folders, and the names the job's spec gives its files."""
    places = Places()
    for job_dir in job_dirs:
        places.add(job_dir, lambda rest: rest or "the job's folder")
    uploaded = {record.sha256: record.filename for record in ((spec and spec.uploaded_files) or {}).values()}
    registered = spec.registered_model if spec is not None else None

    def cached(rest: str) -> str:
        kind, _, inside = rest.partition("/")
        if kind == "files":
            sha256 = Path(inside).name.split(".")[0]
            return uploaded.get(sha256, "an uploaded file")
        if kind == "models" and registered is not None:
            folder, _, file = inside.partition("/")
            if folder.split(".")[0] == registered.sha256:
                return _joined(registered.name, file)
        return _last_part(rest) or "the worker's cache"

    places.add(settings.cache_dir, cached)
    if settings.storage_url is not None:
        # The store by its key: s3fs's errors name "bucket/prefix/key" without the scheme.
        root = settings.storage_url.removeprefix("s3://").rstrip("/")
        for spelling in (settings.storage_url.rstrip("/"), root):
            places.add(spelling, lambda rest: rest or "the file store")
    endpoint = os.environ.get("AWS_ENDPOINT_URL")  # where the S3 client sends its requests
    if endpoint:
        places.add(endpoint.rstrip("/"), lambda rest: "the file store")
    for folder in (settings.data_dir, settings.glue_dir, settings.models_dir):
        places.add(folder, lambda rest: rest or "the folder")
    places.add(settings.artifacts_dir, lambda rest: _last_part(rest) or "the artifacts folder")
    return places


def for_users(text: str, places: Places) -> str:
    """A failure's text as its job's owner may read it."""
    return places.rewrite(drop_tracebacks(text))


def _joined(name: str, rest: str | None) -> str:
    return f"{name}/{rest}" if rest else name


def _renamer(name: Callable[[str], str]) -> Callable[[re.Match[str]], str]:
    def rename(found: re.Match[str]) -> str:
        rest = found["rest"] or ""
        trimmed = rest.rstrip(".")  # a sentence's full stop after a path is not part of its name
        return name(trimmed) + rest[len(trimmed) :]

    return rename


def _last_part(path: str) -> str:
    return next((part for part in reversed(path.split("/")) if part not in ("", ".")), "")
