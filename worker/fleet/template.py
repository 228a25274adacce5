"""What the warm-start template process imports before it forks jobs (see worker/fleet/warm.py).

Imported only by the forkserver process (multiprocessing's preload), never by the worker itself.
It must leave the process fit to fork: one thread, CUDA not initialised, no torch op run (an op
would start torch's OpenMP thread pool).

It must also never outlive its worker (a SIGKILLed worker's template went on importing for up to
17 s, holding memory and a core, while its replacement imported its own). While it imports, it
watches the worker as job processes do (worker/fleet/template_watch.py, imported first), and stops the
watch before its first fork. From then on multiprocessing's own signal takes over: the forkserver
leaves its loop the moment the last holder of its "alive" pipe is gone — the worker, since each job
process forked from it closes its copy first thing (worker/fleet/warm.py) — and `_exit_at_once` spares it
the 3–4 s of tearing torch and the rest down.
"""

from __future__ import annotations

import os

from worker.fleet.template_watch import WATCH

# Native libraries start helper threads when they load, and a fork copies none of them (nor the
# locks they hold): OpenBLAS (numpy's and scipy's linear algebra, not torch's) starts thread
# servers, pyarrow's jemalloc a background purging thread. Set before anything loads them; a job's
# child then runs numpy's BLAS single-threaded, which its metrics do not notice.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("JE_ARROW_MALLOC_CONF", "background_thread:false")

import atexit
import importlib
import logging
import sys

import accelerate  # noqa: F401
import datasets  # noqa: F401
import torch
import transformers  # noqa: F401

logger = logging.getLogger(__name__)

# transformers imports a model family's code when it first loads one: these are the families the
# service's recipes and tests fine-tune.
MODEL_MODULES = (
    "transformers.models.bert.modeling_bert",
    "transformers.models.bert.tokenization_bert",
    "transformers.models.roberta.modeling_roberta",
    "transformers.models.deberta_v2.modeling_deberta_v2",
)
for _name in MODEL_MODULES:
    try:
        importlib.import_module(_name)
    except ImportError as exc:  # an older or newer transformers: that family loads cold
        logger.warning("warm-start template: could not preload %s: %s", _name, exc)


def _build_weight_renaming_table() -> None:
    """transformers builds its table of checkpoint weight renamings (about a thousand regular
    expressions) on a model's first from_pretrained and keeps it in a module global: built here, it
    is in every fork (measured: 0.25-0.5 s of each job's start on the shared 2-core machine)."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping

        get_checkpoint_conversion_mapping("bert")
    except Exception as exc:  # pure speed: a transformers without it loads as before
        logger.warning("warm-start template: could not prebuild the weight renaming table: %s", exc)


_build_weight_renaming_table()


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return -1


def _exit_at_once() -> None:
    """Registered last, so it runs first when the forkserver leaves its loop (its worker is gone):
    exit now, without the interpreter's teardown of torch, transformers and datasets (3–4 s on the
    shared 2-core machine). Job processes forked from here unregister it (worker/fleet/warm.py)."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


atexit.register(_exit_at_once)
if WATCH is not None:
    WATCH.stop()  # the imports are done: one thread again before the first fork

# Measured once the imports are done, in the template: what every fork starts from.
THREADS_AT_FORK = _threads()
CUDA_INITIALISED = torch.cuda.is_initialized()


def describe() -> str:
    return f"template threads: {THREADS_AT_FORK}, CUDA initialised in the template: {CUDA_INITIALISED}"
