"""StepHistory's running sums agree with recomputing the window, through evictions; the bulk
prefill per step admission drains a bulk queue at."""

from __future__ import annotations

import random

import pytest

from engine.core.step_record import MIN_BULK_PREFILL_STEPS, StepHistory, StepRecord
from policies.request_class import RequestClass


def test_running_rates_equal_the_window_recomputed() -> None:
    history = StepHistory(capacity=8)
    rng = random.Random(1)
    records: list[StepRecord] = []
    for index in range(50):
        tokens: dict[tuple[RequestClass, str], int] = {}
        if rng.random() < 0.6:
            tokens[(RequestClass.BULK, "prefill")] = rng.randint(1, 100)
        if rng.random() < 0.8:
            tokens[(RequestClass.INTERACTIVE, "decode")] = rng.randint(1, 10)
        record = StepRecord(index, 0.0, rng.uniform(0.001, 0.1), tokens, {}, {}, 0.0, 0)
        history.add(record)
        records.append(record)
        window = records[-8:]
        for kind in ("prefill", "decode"):
            seconds = sum(r.duration_s for r in window if r.tokens_of(kind))
            expected = sum(r.tokens_of(kind) for r in window) / seconds if seconds else None
            got = history.rate_tokens_per_s(kind)
            if expected is None:
                assert got is None
            else:
                assert got is not None and abs(got - expected) <= 1e-9 * expected
    durations = sorted(r.duration_s for r in records[-8:])
    assert history.recent_step_s(window=8) == durations[4]
    assert history.total_steps == 50


def bulk_step(index: int, bulk_prefill: int, bulk_waiting: int, duration_s: float) -> StepRecord:
    tokens = {(RequestClass.BULK, "decode"): 8}
    if bulk_prefill:
        tokens[(RequestClass.BULK, "prefill")] = bulk_prefill
    waiting = {RequestClass.BULK: bulk_waiting}
    return StepRecord(index, 0.0, duration_s, tokens, {}, waiting, 0.0, 0)


def test_bulk_prefill_pace_is_measured_over_the_steps_bulk_had_a_prompt_for() -> None:
    history = StepHistory(capacity=64)
    # 31 steps of a 100-token bulk chunk at 10 ms: one short of the minimum.
    for index in range(MIN_BULK_PREFILL_STEPS - 1):
        history.add(bulk_step(index, 100, 1, 0.010))
    assert history.bulk_prefill_pace() is None
    # A step that held bulk back (a chat's prefill, 41 ms) while a bulk prompt waited counts,
    # with no bulk prefill; decode-only steps with no bulk prompt waiting do not count.
    history.add(bulk_step(31, 0, 2, 0.041))
    for index in range(32, 40):
        history.add(bulk_step(index, 0, 0, 0.005))
    pace = history.bulk_prefill_pace()
    assert pace is not None
    assert pace.tokens_per_step == 3_100 / 32
    assert pace.step_s == pytest.approx((31 * 0.010 + 0.041) / 32)
    # Evicted steps leave the sums: 64 steps of 400 tokens push every earlier one out.
    for index in range(40, 104):
        history.add(bulk_step(index, 400, 0, 0.030))
    pace = history.bulk_prefill_pace()
    assert pace is not None
    assert pace.tokens_per_step == 400.0
    assert pace.step_s == pytest.approx(0.030)
