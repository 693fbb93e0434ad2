"""StepHistory's running sums agree with recomputing the window, through evictions."""

from __future__ import annotations

import random

from engine.core.step_record import StepHistory, StepRecord
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
