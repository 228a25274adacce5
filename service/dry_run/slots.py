"""How many dry runs (and uploads' checks) the API works on at once.

A dry run reads the job's data and tokenises a sample of it inside the API process (the plan's token
lengths and padding): about a second of CPU and tens of MB for a large file, where every other route
costs milliseconds. Without a bound, a client asking for many at once starves the API's thread pool
and memory; with one, the extra requests get 429 and Retry-After at once instead of queuing. An
upload's check (service/files/check_runner.py) is bounded the same way, with its own count of slots.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from shared.core.errors import TooBusy

RETRY_AFTER_S = 2


class DryRunSlots:
    def __init__(self, slots: int, busy: str = "dry run(s) are already being planned") -> None:
        self.slots = slots
        self.busy = busy
        self._free = threading.BoundedSemaphore(slots)

    @contextmanager
    def slot(self) -> Iterator[None]:
        """A free slot for the duration of one dry run, or TooBusy (429) when none is free."""
        if not self._free.acquire(blocking=False):
            raise TooBusy(
                f"{self.slots} {self.busy}; try again in a moment",
                retry_after_s=RETRY_AFTER_S,
            )
        try:
            yield
        finally:
            self._free.release()
