"""freeze_startup_heap: what start-up made leaves the collector's generations (gc.freeze), and
full collections become rare (what is left to scan rarely dies)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from engine.process.startup_heap import (
    FULL_COLLECTION_EVERY_YOUNG_COLLECTIONS,
    freeze_startup_heap,
)


class _Node:
    other: object = None


@pytest.fixture
def unfrozen_after() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()  # the rest of the test session collects as before
    gc.set_threshold(*thresholds)


def test_survivors_are_frozen_and_garbage_is_not(unfrozen_after: None) -> None:
    gc.unfreeze()
    kept = [[i] for i in range(1_000)]
    cycle = _Node()
    cycle.other = cycle  # garbage only a collection frees
    gone = weakref.ref(cycle)
    del cycle
    frozen = freeze_startup_heap()
    assert frozen == gc.get_freeze_count()
    assert frozen >= len(kept)
    # The collection before the freeze freed the cycle: no garbage was frozen with the rest.
    assert gone() is None
    # Objects made afterwards are tracked and collected as usual.
    late: list[object] = []
    late.append(late)
    del late
    assert gc.collect() >= 1


def test_full_collections_wait_for_many_young_ones(unfrozen_after: None) -> None:
    gc.set_threshold(700, 10, 10)
    freeze_startup_heap()
    # The young generations keep their thresholds; only the oldest waits longer.
    assert gc.get_threshold() == (700, 10, FULL_COLLECTION_EVERY_YOUNG_COLLECTIONS)
    assert FULL_COLLECTION_EVERY_YOUNG_COLLECTIONS >= 100
