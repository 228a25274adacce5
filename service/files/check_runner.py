"""An upload's checks run in a child process with memory and CPU limits, a few at a time.

The checks themselves are bounded (shared/data/limits.py refuses a hostile shape before decoding
it), but they run parsers written in C over bytes a stranger chose: a parser bug or a shape the
limits did not foresee must cost that upload a 422, not the API. So each check runs in a child
process (service/bounded_child.py) forked from a forkserver that has pandas and pyarrow imported and
warmed already (service/files/check_warmup.py: 0.15-0.2 s per upload, not the seconds of a fresh
interpreter), under
- RLIMIT_AS: GLUEJOBS_FILE_CHECK_MEMORY_BYTES beyond what the child had when it started (pandas
  and pyarrow raise MemoryError past it, which answers 422 naming the setting);
- RLIMIT_CPU: GLUEJOBS_FILE_CHECK_CPU_S (the kernel ends the child; 422 naming the setting).
At most GLUEJOBS_MAX_FILE_CHECKS run at once; more uploads get 429 with Retry-After. The API process
only waits on a pipe, so its memory does not grow with the file, whatever the file holds.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from service.bounded_child import ChildFailed, ChildLimits, run_bounded
from service.dry_run.slots import DryRunSlots
from service.files.upload_checks import FIELD, UploadReport, check_mapping, check_upload, task_of
from shared.core.config import Settings
from shared.core.errors import GluejobsError, InvalidRequest, Problem
from shared.data.limits import FileLimits
from shared.jobspec.column_mapping import ColumnMapping

logger = logging.getLogger(__name__)

# A child that has neither answered nor been ended by its CPU limit this long after it was due is
# stuck (waiting, not computing): it is killed.
GRACE_S = 30


class FileChecks:
    def __init__(self, settings: Settings) -> None:
        self.limits = FileLimits.of(settings)
        self.memory_bytes = settings.file_check_memory_bytes
        self.cpu_s = settings.file_check_cpu_s
        self.slots = DryRunSlots(settings.max_file_checks, "uploads are already being checked")

    def check(
        self,
        path: Path,
        *,
        filename: str,
        purpose: str,
        task_name: str | None,
        mapping: ColumnMapping | None = None,
    ) -> UploadReport:
        """service.files.upload_checks.check_upload in a limited child process; TooBusy (429) when every slot
        is taken, InvalidRequest (422) for a refused file or a check past its limits."""
        task = task_of(task_name)  # refused here, in the API's words, before any process starts
        mapping = mapping or ColumnMapping()
        check_mapping(mapping, task)
        with self.slots.slot():
            return self._run(
                path, filename=filename, purpose=purpose, task=task.name if task else None, mapping=mapping
            )

    def _run(
        self, path: Path, *, filename: str, purpose: str, task: str | None, mapping: ColumnMapping
    ) -> UploadReport:
        limits = ChildLimits(memory_bytes=self.memory_bytes, cpu_s=self.cpu_s, wall_s=self.cpu_s + GRACE_S)
        try:
            kind, value = run_bounded(
                _check_in_child,
                (path, filename, purpose, task, self.limits, mapping),
                limits,
                name="gluejobs-file-check",
                prepare=_system_memory_pool,
            )
        except ChildFailed as failed:
            raise self._failed(filename, failed) from None
        if kind == "refused":
            raise InvalidRequest(problems=value)
        assert isinstance(value, UploadReport)
        return value

    def _failed(self, filename: str, failed: ChildFailed) -> InvalidRequest:
        if failed.kind == "memory":
            return InvalidRequest(
                f"file {filename!r}: checking it needed more than {self.memory_bytes} bytes of memory "
                "(GLUEJOBS_FILE_CHECK_MEMORY_BYTES raises it)",
                field=FIELD,
            )
        if failed.kind in ("cpu", "deadline"):
            return InvalidRequest(
                f"file {filename!r}: checking it took more than {self.cpu_s} s of CPU "
                "(GLUEJOBS_FILE_CHECK_CPU_S raises it)",
                field=FIELD,
            )
        if failed.kind == "crashed":
            logger.error("the check of an upload ended with %s", failed.detail)
            return InvalidRequest(
                f"file {filename!r} could not be checked: its reader ended with {failed.detail}", field=FIELD
            )
        logger.error("the check of an upload failed: %s", failed.detail)  # the exception's type, no contents
        return InvalidRequest(f"file {filename!r} could not be checked ({failed.detail})", field=FIELD)


def _system_memory_pool() -> None:
    import pyarrow

    # Arrow's own allocators reserve address space by the gigabyte up front, which RLIMIT_AS refuses
    # at the first allocation: the C library's malloc takes what it needs.
    pyarrow.set_memory_pool(pyarrow.system_memory_pool())


def _check_in_child(
    path: Path, filename: str, purpose: str, task_name: str | None, limits: FileLimits, mapping: ColumnMapping
) -> tuple[str, Any]:
    """In the child: ("ok", the report) or ("refused", every problem found: a file lacking two mapped
    columns is refused naming both)."""
    try:
        report = check_upload(
            path, filename=filename, purpose=purpose, task=task_of(task_name), limits=limits, mapping=mapping
        )
    except GluejobsError as exc:
        return "refused", [Problem(p.field or FIELD, p.code, p.message) for p in exc.problems]
    return "ok", report
