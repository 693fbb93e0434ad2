"""The load generator's heap, frozen for the length of a run: its GC must not pause a client.

NOTE: a load generator that stops to collect garbage measures its own pause as the server's
latency. The bench process carries every module it imported (its HTTP client, rich, the engine's and
vLLM's packages for the server it manages): a full (gen-2) collection of that heap took 440 ms
in the middle of a `bench breakdown --workload mixed` run and 249 ms at its start (gc.callbacks
trace, 2-vCPU AMD EPYC): the bulk client stood still, and a core was taken from the engine the
run measures. `gc.freeze()` moves what exists before the run to the permanent generation, which
no collection scans (the largest collection left in the same run: 46 ms, in the 400-job burst);
objects made during the run are still collected as usual, so memory stays bounded.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["heap_frozen"]


@contextlib.contextmanager
def heap_frozen() -> Iterator[None]:
    """Collect once, then freeze the heap until the block ends; then give it back to the
    collector, so that a process that runs several loads frees each one's setup (unless
    something froze it before: gc cannot unfreeze only what this froze, so it stays)."""
    frozen_before = gc.get_freeze_count() > 0
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        if not frozen_before:
            gc.unfreeze()
