"""The API under cProfile, every thread of it: uvicorn's event loop and the threads that routes, the
request guard and the stream readers run in (cProfile alone sees only the thread that enabled it).
On exit (uvicorn ends on SIGTERM) the threads' figures are added up into one pstats file, and the
functions that took the most time of their own, and the most time with what they called, are
printed to stderr. bench/api_polling.py --profile PATH runs its API through this.

    python bench/profiled_api.py PATH -- service.main:create_app --factory --port 8000
"""

from __future__ import annotations

import cProfile
import pstats
import runpy
import signal
import sys
import threading
from typing import Any

_profilers: list[cProfile.Profile] = []
_lock = threading.Lock()


def _profile_this_thread(*_: Any) -> None:
    # threading calls this as the new thread's first profile event: hand the thread to a cProfile
    # of its own (this hook is replaced by the profiler's).
    sys.setprofile(None)
    profiler = cProfile.Profile()
    with _lock:
        _profilers.append(profiler)
    profiler.enable()


def main() -> None:
    out, separator, *uvicorn_args = sys.argv[1:]
    if separator != "--":
        raise SystemExit("usage: profiled_api.py PATH -- UVICORN ARGS")
    # uvicorn re-raises the SIGTERM it shut down on, with the handler it found: this one, so that the
    # process ends through SystemExit below (and writes its profile) rather than dying of the signal.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    threading.setprofile(_profile_this_thread)
    loop = cProfile.Profile()
    _profilers.append(loop)
    sys.argv = ["uvicorn", *uvicorn_args]
    loop.enable()
    try:
        runpy.run_module("uvicorn", run_name="__main__", alter_sys=True)
    except SystemExit:
        pass
    finally:
        loop.disable()
        threading.setprofile(None)
        with _lock:
            stats = pstats.Stats(_profilers[0], stream=sys.stderr)
            for profiler in _profilers[1:]:
                stats.add(profiler)
        stats.dump_stats(out)
        stats.sort_stats("tottime").print_stats(40)
        stats.sort_stats("cumulative").print_stats(60)


if __name__ == "__main__":
    main()
