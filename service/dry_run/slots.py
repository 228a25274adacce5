"""How many dry runs (and uploads' checks) the API works on at once.

A dry run reads the job's data and tokenises a sample of it inside the API process (the plan's token
lengths and padding): about a second of CPU and tens of MB for a large file, where every other route
costs milliseconds. Without a bound, a client asking for many at once starves the API's thread pool
and memory; with one, the extra requests get 429 and Retry-After at once instead of queuing. One owner
holds at most half the slots (at least one): the model's tokenizer is the owner's, and one that runs
each dry run to its limits (service/dry_run/tokenizer_child.py) must not keep every other owner's out
for that long. An upload's check (service/files/check_runner.py) is bounded the same way, with its own
count of slots.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from shared.core.errors import TooBusy

RETRY_AFTER_S = 2


class DryRunSlots:
    def __init__(self, slots: int, busy: str = "dry run(s) are already being planned") -> None:
        self.slots = slots
        self.busy = busy
        self.per_owner = max(1, slots // 2)
        self._free = threading.BoundedSemaphore(slots)
        self._lock = threading.Lock()
        self._held: Counter[str] = Counter()

    @contextmanager
    def slot(self, owner: str | None = None) -> Iterator[None]:
        """A free slot for the duration of one dry run, or TooBusy (429) when none is free, or when
        `owner` holds its share of them already."""
        with self._lock:
            if owner is not None and self._held[owner] >= self.per_owner:
                raise TooBusy(
                    f"you have {self._held[owner]} dry run(s) being planned, the most one owner may "
                    f"have of the API's {self.slots}; try again in a moment",
                    retry_after_s=RETRY_AFTER_S,
                )
            if not self._free.acquire(blocking=False):
                raise TooBusy(f"{self.slots} {self.busy}; try again in a moment", retry_after_s=RETRY_AFTER_S)
            if owner is not None:
                self._held[owner] += 1
        try:
            yield
        finally:
            with self._lock:
                if owner is not None:
                    self._held[owner] -= 1
                    if not self._held[owner]:
                        del self._held[owner]
                self._free.release()
