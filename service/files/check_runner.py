"""An upload's checks run in a child process with memory and CPU limits, a few at a time.

The checks themselves are bounded (shared/data/limits.py refuses a hostile shape before decoding
it), but they run parsers written in C over bytes a stranger chose: a parser bug or a shape the
limits did not foresee must cost that upload a 422, not the API. So each check runs in a child
process forked from a forkserver that has pandas and pyarrow imported and warmed already
(service/files/check_warmup.py: 0.15-0.2 s per upload, not the seconds of a fresh interpreter), under
- RLIMIT_AS: GLUEJOBS_FILE_CHECK_MEMORY_BYTES beyond what the child had when it started (pandas
  and pyarrow raise MemoryError past it, which answers 422 naming the setting);
- RLIMIT_CPU: GLUEJOBS_FILE_CHECK_CPU_S (the kernel ends the child; 422 naming the setting).
At most GLUEJOBS_MAX_FILE_CHECKS run at once; more uploads get 429 with Retry-After. The API process
only waits on a pipe, so its memory does not grow with the file, whatever the file holds.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import resource
import signal
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from service.dry_run.slots import DryRunSlots
from service.files.upload_checks import FIELD, UploadReport, check_mapping, check_upload, task_of
from shared.core.config import Settings
from shared.core.errors import GluejobsError, InvalidRequest
from shared.data.limits import FileLimits
from shared.jobspec.column_mapping import ColumnMapping

logger = logging.getLogger(__name__)

# A child that has neither answered nor been ended by its CPU limit this long after it was due is
# stuck (waiting, not computing): it is killed.
GRACE_S = 30
# Imported once in the forkserver, so each child starts with its readers loaded.
PRELOAD = ["service.files.check_runner", "service.files.check_warmup"]


class FileChecks:
    def __init__(self, settings: Settings) -> None:
        self.limits = FileLimits.of(settings)
        self.memory_bytes = settings.file_check_memory_bytes
        self.cpu_s = settings.file_check_cpu_s
        self.slots = DryRunSlots(settings.max_file_checks, "uploads are already being checked")
        methods = multiprocessing.get_all_start_methods()
        self._context: Any = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        if "forkserver" in methods:
            self._context.set_forkserver_preload(PRELOAD)

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
        receive, send = self._context.Pipe(duplex=False)
        limits = (self.memory_bytes, self.cpu_s)
        child = self._context.Process(
            target=_check_in_child,
            args=(send, path, filename, purpose, task, self.limits, limits, mapping),
            name="gluejobs-file-check",
            daemon=True,
        )
        child.start()
        send.close()
        try:
            answer = receive.recv() if receive.poll(self.cpu_s + GRACE_S) else None
        except EOFError:  # ended without an answer: killed by its CPU limit, or crashed
            answer = None
        finally:
            receive.close()
            if answer is None and child.is_alive():
                child.kill()
            child.join()
        if answer is None:
            raise self._ended(filename, child.exitcode)
        kind, value = answer
        if kind == "ok":
            assert isinstance(value, UploadReport)
            return value
        if kind == "refused":
            message, field = value
            raise InvalidRequest(message, field=field)
        if kind == "memory":
            raise InvalidRequest(
                f"file {filename!r}: checking it needed more than {self.memory_bytes} bytes of memory "
                "(GLUEJOBS_FILE_CHECK_MEMORY_BYTES raises it)",
                field=FIELD,
            )
        logger.error("the check of an upload failed: %s", value)  # the exception's type, no contents
        raise InvalidRequest(f"file {filename!r} could not be checked ({value})", field=FIELD)

    def _ended(self, filename: str, exitcode: int | None) -> InvalidRequest:
        if exitcode in (-signal.SIGXCPU, -signal.SIGKILL, None):
            return InvalidRequest(
                f"file {filename!r}: checking it took more than {self.cpu_s} s of CPU "
                "(GLUEJOBS_FILE_CHECK_CPU_S raises it)",
                field=FIELD,
            )
        logger.error("the check of an upload ended with exit code %s", exitcode)
        return InvalidRequest(
            f"file {filename!r} could not be checked: its reader ended with exit code {exitcode}", field=FIELD
        )


def _check_in_child(
    send: Connection,
    path: Path,
    filename: str,
    purpose: str,
    task_name: str | None,
    limits: FileLimits,
    caps: tuple[int, int],
    mapping: ColumnMapping,
) -> None:
    # A collection would touch every object inherited from the forkserver, copying its pages: a
    # short-lived child does without one.
    gc.disable()
    memory_bytes, cpu_s = caps
    import pyarrow

    # Arrow's own allocators reserve address space by the gigabyte up front, which the limit below
    # refuses at the first allocation: the C library's malloc takes what it needs.
    pyarrow.set_memory_pool(pyarrow.system_memory_pool())
    resource.setrlimit(resource.RLIMIT_AS, (_address_space() + memory_bytes, resource.RLIM_INFINITY))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 5))
    answer: tuple[str, Any]
    try:
        report = check_upload(
            path, filename=filename, purpose=purpose, task=task_of(task_name), limits=limits, mapping=mapping
        )
        answer = ("ok", report)
    except GluejobsError as exc:
        answer = ("refused", (exc.message, exc.field or FIELD))
    except MemoryError:  # pyarrow's ArrowMemoryError is one too
        answer = ("memory", None)
    except Exception as exc:  # a reader's bug: its type only, the message may quote the file
        answer = ("error", type(exc).__name__)
    send.send(answer)
    send.close()


def _address_space() -> int:
    """This process's virtual memory size now (bytes)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0
