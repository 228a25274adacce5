"""Run one function in a child process under memory, CPU and wall-clock limits: the one place where the
API runs code whose cost a stranger chose (an upload's parsers, a registered model's tokenizer).

The child is forked from a forkserver that has the callers' modules imported already (PRELOAD below:
0.15-0.2 s a child, not the seconds of a fresh interpreter), then limited by
- RLIMIT_AS: `memory_bytes` beyond what the child had when it started (allocations past it fail:
  MemoryError in Python, a failed allocation in a native library);
- RLIMIT_CPU: `cpu_s` seconds of CPU over all its threads (the kernel ends it with SIGXCPU);
- a wall-clock deadline, `wall_s`, kept by the parent: a child that neither answered nor ended by
  then (stuck waiting, or starved of CPU) is killed.
The API process only waits on a pipe, so neither its memory nor its threads are touched by what the
child does; a Rust panic (pyo3's PanicException derives from BaseException, so `except Exception`
misses it) or a crash ends only the child. What went wrong comes back as ChildFailed, for the caller
to say in its own words.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import resource
import signal
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Literal, cast

logger = logging.getLogger(__name__)

# Imported once in the forkserver, so each child starts with its libraries loaded. multiprocessing has
# one forkserver a process: every caller's modules are listed here, before the first child starts.
# Each child also runs the program's main script again as `__mp_main__` (multiprocessing's spawn
# preparation; `python -m service` is spared, a `__main__` module is skipped; Python 3.11's forkserver
# ignores "__main__" in the preload list): a program that starts children keeps its script's top level
# light (`gluejobs serve`'s script imports the CLI: ~0.25 s a child).
PRELOAD = [
    "service.bounded_child",
    "service.files.check_runner",
    "service.files.check_warmup",
    "service.dry_run.tokenizer_child",
]

Failure = Literal["memory", "cpu", "deadline", "panic", "error", "crashed"]


@dataclass(frozen=True)
class ChildLimits:
    memory_bytes: int
    cpu_s: int
    wall_s: float


class ChildFailed(Exception):
    """The child ran past a limit or failed. `kind`: which; `detail`: an exception's type (and, for a
    panic, its message's first line), or the exit code of a child that crashed."""

    def __init__(self, kind: Failure, detail: str = "") -> None:
        super().__init__(kind, detail)
        self.kind = kind
        self.detail = detail


_context: Any = None


def _get_context() -> Any:
    global _context
    if _context is None:
        methods = multiprocessing.get_all_start_methods()
        _context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        if "forkserver" in methods:
            _context.set_forkserver_preload(PRELOAD)
    return _context


def run_bounded(
    target: Callable[..., Any],
    args: tuple[Any, ...],
    limits: ChildLimits,
    *,
    name: str,
    prepare: Callable[[], None] | None = None,
    quiet: bool = False,
) -> Any:
    """`target(*args)` (a module-level function; its arguments and result are pickled) in a limited
    child; its result, or ChildFailed. `prepare` runs in the child before the limits are set (what
    must reserve memory first). `quiet`: the child's stderr goes nowhere (a native library that
    prints a whole backtrace per failure); the failure comes back as ChildFailed all the same."""
    context = _get_context()
    receive, send = context.Pipe(duplex=False)
    child = context.Process(
        target=_child_main, args=(send, target, args, limits, prepare, quiet), name=name, daemon=True
    )
    child.start()
    send.close()
    answer: tuple[str, Any] | None = None
    timed_out = False
    try:
        if receive.poll(limits.wall_s):
            answer = receive.recv()
        else:
            timed_out = True
    except EOFError:  # ended without an answer: killed by its CPU limit, or crashed
        answer = None
    finally:
        receive.close()
        if answer is None and child.is_alive():
            child.kill()
        child.join()
    if answer is not None:
        kind, value = answer
        if kind == "ok":
            return value
        raise ChildFailed(cast(Failure, kind), value or "")
    if timed_out:
        raise ChildFailed("deadline")
    if child.exitcode in (-signal.SIGXCPU, -signal.SIGKILL):  # SIGKILL: past the hard CPU limit
        raise ChildFailed("cpu")
    raise ChildFailed("crashed", f"exit code {child.exitcode}")


def _child_main(
    send: Connection,
    target: Callable[..., Any],
    args: tuple[Any, ...],
    limits: ChildLimits,
    prepare: Callable[[], None] | None,
    quiet: bool,
) -> None:
    # A collection would touch every object inherited from the forkserver, copying its pages: a
    # short-lived child does without one.
    gc.disable()
    if quiet:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
    if prepare is not None:
        prepare()
    resource.setrlimit(resource.RLIMIT_AS, (_address_space() + limits.memory_bytes, resource.RLIM_INFINITY))
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 5))
    answer: tuple[str, Any]
    try:
        answer = ("ok", target(*args))
    except MemoryError:  # pyarrow's ArrowMemoryError is one too
        answer = ("memory", None)
    except Exception as exc:  # a library's bug: its type only, the message may quote the input
        answer = ("error", type(exc).__name__)
    except BaseException as exc:  # pyo3's PanicException: a Rust library's panic
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        answer = ("panic", f"{type(exc).__name__}: {_first_line(exc)}")
    send.send(answer)
    send.close()


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:200] if lines else ""


def _address_space() -> int:
    """This process's virtual memory size now (bytes)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0
