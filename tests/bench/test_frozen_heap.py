"""The load generator freezes its heap for a run, so that no collection scans what it imported
(a 440 ms pause measured as chat latency), and gives it back to the collector after."""

from __future__ import annotations

import gc

from bench.load.frozen_heap import heap_frozen


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_the_heap_made_before_the_run_is_frozen_and_given_back_after() -> None:
    gc.unfreeze()  # whatever an earlier test in this process froze
    before = _Cycle()
    with heap_frozen():
        assert gc.get_freeze_count() > 0
        # What existed before the block sits in the permanent generation: no collection sees it.
        assert not any(obj is before for obj in gc.get_objects())
        # What the run makes is still collected as usual.
        during = _Cycle()
        assert any(obj is during for obj in gc.get_objects())
        del during
        assert gc.collect() >= 1
    assert gc.get_freeze_count() == 0
    assert any(obj is before for obj in gc.get_objects())


def test_a_heap_frozen_before_stays_frozen() -> None:
    """gc cannot unfreeze only what the block froze: a heap frozen before (a gateway in this
    process freezes its startup heap) is left frozen, not thawed by the load's end."""
    gc.unfreeze()
    earlier = _Cycle()
    gc.freeze()
    try:
        with heap_frozen():
            pass
        assert gc.get_freeze_count() > 0
        assert not any(obj is earlier for obj in gc.get_objects())
    finally:
        gc.unfreeze()
