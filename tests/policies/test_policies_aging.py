"""Linear aging: the class pick the Redis claim script mirrors, and its starvation bound."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.aging import ClassOffsets, effective_score_ms, max_wait_bound_ms, pick_class
from policies.request_class import RequestClass

INTERACTIVE = RequestClass.INTERACTIVE
BULK = RequestClass.BULK
DEFAULT = ClassOffsets()
NOW_MS = 1_700_000_000_000


def test_effective_score_adds_the_class_offset() -> None:
    assert effective_score_ms(1_000, INTERACTIVE, DEFAULT) == 1_000
    assert effective_score_ms(1_000, BULK, DEFAULT) == 31_000
    custom = ClassOffsets(interactive_ms=5, bulk_ms=7)
    assert effective_score_ms(1_000, INTERACTIVE, custom) == 1_005
    assert effective_score_ms(1_000, BULK, custom) == 1_007


def test_offsets_by_class_feed_the_queue_store() -> None:
    assert ClassOffsets(interactive_ms=5, bulk_ms=7).by_class_ms() == {INTERACTIVE: 5, BULK: 7}


def test_empty_queues_pick_nothing() -> None:
    assert pick_class({}, DEFAULT) is None
    assert pick_class({INTERACTIVE: None, BULK: None}, DEFAULT) is None


def test_a_lone_head_is_picked_however_young() -> None:
    assert pick_class({BULK: NOW_MS}, DEFAULT) is BULK
    assert pick_class({INTERACTIVE: NOW_MS, BULK: None}, DEFAULT) is INTERACTIVE


@pytest.mark.parametrize(
    ("bulk_waited_ms", "expected"),
    [
        (0, INTERACTIVE),
        (29_999, INTERACTIVE),
        (30_000, INTERACTIVE),  # equal effective scores: the tie goes to interactive
        (30_001, BULK),
        (600_000, BULK),
    ],
)
def test_bulk_beats_a_fresh_interactive_only_after_the_offset(
    bulk_waited_ms: int, expected: RequestClass
) -> None:
    heads = {INTERACTIVE: NOW_MS, BULK: NOW_MS - bulk_waited_ms}
    assert pick_class(heads, DEFAULT) is expected


def test_an_older_interactive_head_still_beats_an_aged_bulk_head() -> None:
    # Bulk waited 40 s (score NOW - 10 000) but interactive waited 15 s (score NOW - 15 000).
    heads = {INTERACTIVE: NOW_MS - 15_000, BULK: NOW_MS - 40_000}
    assert pick_class(heads, DEFAULT) is INTERACTIVE


def test_offsets_validate() -> None:
    with pytest.raises(ValueError, match="bulk_ms"):
        ClassOffsets(bulk_ms=-1)
    with pytest.raises(ValueError, match="interactive_ms"):
        ClassOffsets(interactive_ms=True)
    with pytest.raises(ValueError, match="bulk_ms"):
        ClassOffsets(bulk_ms=1.5)  # type: ignore[arg-type]


def test_wait_bound_worked_by_hand() -> None:
    # delta = 30 s; 2 interactive/s can add ceil(2 · 30) = 60 jobs that still beat the bulk head;
    # with 5 already pending and 10 claims/s: (5 + 60 + 1) / 10 = 6.6 s.
    assert max_wait_bound_ms(DEFAULT, 5, 2.0, 10.0) == 6_600
    # No interactive arrivals: only the backlog, then the bulk head: (5 + 1) / 10 = 0.6 s.
    assert max_wait_bound_ms(DEFAULT, 5, 0.0, 10.0) == 600


def test_wait_bound_is_finite_under_interactive_overload() -> None:
    # 20 interactive/s against 10 claims/s: interactive alone would grow without end, yet the
    # bulk head waits at most (0 + 600 + 1) / 10 = 60.1 s.
    assert max_wait_bound_ms(DEFAULT, 0, 20.0, 10.0) == 60_100


def test_wait_bound_ignores_arrivals_when_bulk_has_no_handicap() -> None:
    # bulk_ms <= interactive_ms: later interactive jobs can never pass the bulk head.
    offsets = ClassOffsets(interactive_ms=1_000, bulk_ms=0)
    assert max_wait_bound_ms(offsets, 3, 1_000.0, 4.0) == 1_000


def test_wait_bound_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="claims_per_s"):
        max_wait_bound_ms(DEFAULT, 0, 1.0, 0.0)
    with pytest.raises(ValueError, match="interactive_backlog"):
        max_wait_bound_ms(DEFAULT, -1, 1.0, 1.0)
    with pytest.raises(ValueError, match="interactive_arrivals_per_s"):
        max_wait_bound_ms(DEFAULT, 0, float("nan"), 1.0)


heads_ms = st.one_of(st.none(), st.integers(min_value=0, max_value=10**13))
offsets_st = st.builds(
    ClassOffsets,
    interactive_ms=st.integers(min_value=0, max_value=120_000),
    bulk_ms=st.integers(min_value=0, max_value=120_000),
)


@given(interactive_head=heads_ms, bulk_head=heads_ms, offsets=offsets_st)
def test_the_winner_has_the_lowest_effective_score(
    interactive_head: int | None, bulk_head: int | None, offsets: ClassOffsets
) -> None:
    heads = {INTERACTIVE: interactive_head, BULK: bulk_head}
    winner = pick_class(heads, offsets)
    scores = {
        c: effective_score_ms(head, c, offsets) for c, head in heads.items() if head is not None
    }
    if not scores:
        assert winner is None
        return
    assert winner is not None
    assert scores[winner] == min(scores.values())
    if len(scores) == 2 and scores[INTERACTIVE] == scores[BULK]:
        assert winner is INTERACTIVE


def simulate_bulk_head_wait_ms(
    offsets: ClassOffsets,
    enqueue_ms: int,
    head_since_ms: int,
    pending_ms: list[int],
    arrivals_ms: list[int],
    claim_interval_ms: int,
) -> int:
    """Claims every claim_interval_ms after head_since_ms, each open to both classes (the
    slowest service the bound allows), picking with pick_class; returns the bulk head's wait.

    pending_ms: interactive enqueue times pending at head_since_ms; arrivals_ms: later ones.
    """
    pending = sorted(pending_ms)
    arrivals = sorted(arrivals_ms)
    claim_ms = head_since_ms
    for _ in range(100_000):
        claim_ms += claim_interval_ms
        while arrivals and arrivals[0] <= claim_ms:
            pending.append(arrivals.pop(0))
        heads = {INTERACTIVE: pending[0] if pending else None, BULK: enqueue_ms}
        if pick_class(heads, offsets) is BULK:
            return claim_ms - head_since_ms
        pending.pop(0)
    raise AssertionError("the bulk head was never claimed")


def test_wait_bound_is_tight_in_the_worst_case() -> None:
    # delta 2.5 s, interactive every 1 s starting 1 ms after the bulk head formed at 0: the
    # arrivals at 1, 1001 and 2001 ms (ceil(1 · 2.5) = 3) all score <= 2500 and go first.
    # One claim every 2 s: the bulk head is claimed 4th, at 8 s = (0 + 3 + 1) / 0.5 claims/s.
    offsets = ClassOffsets(interactive_ms=0, bulk_ms=2_500)
    arrivals = [1 + 1_000 * k for k in range(20)]
    wait_ms = simulate_bulk_head_wait_ms(offsets, 0, 0, [], arrivals, claim_interval_ms=2_000)
    assert wait_ms == 8_000
    assert max_wait_bound_ms(offsets, 0, 1.0, 0.5) == 8_000


@given(
    offsets=st.builds(
        ClassOffsets,
        interactive_ms=st.integers(min_value=0, max_value=10_000),
        bulk_ms=st.integers(min_value=0, max_value=20_000),
    ),
    bulk_lag_ms=st.integers(min_value=0, max_value=20_000),
    backlog_ages_ms=st.lists(st.integers(min_value=0, max_value=60_000), max_size=30),
    first_arrival_ms=st.integers(min_value=1, max_value=2_000),
    arrival_spacing_ms=st.integers(min_value=1, max_value=2_000),
    # Mostly back-to-back at the peak rate, the case the bound is tight for.
    extra_gaps_ms=st.lists(
        st.one_of(st.just(0), st.integers(min_value=0, max_value=3_000)), max_size=300
    ),
    claim_interval_ms=st.integers(min_value=1, max_value=2_000),
)
def test_simulated_bulk_head_never_waits_past_the_bound(
    offsets: ClassOffsets,
    bulk_lag_ms: int,
    backlog_ages_ms: list[int],
    first_arrival_ms: int,
    arrival_spacing_ms: int,
    extra_gaps_ms: list[int],
    claim_interval_ms: int,
) -> None:
    # The bulk job was enqueued at e_b and reached the head of its queue at h = e_b + lag.
    enqueue_ms = 1_000_000
    head_since_ms = enqueue_ms + bulk_lag_ms
    # Arrivals after h at least arrival_spacing_ms apart; the first may come 1 ms after h
    # (the peak rate limits the gaps, not the phase).
    arrivals: list[int] = []
    t_ms = head_since_ms + first_arrival_ms
    for extra_ms in extra_gaps_ms:
        arrivals.append(t_ms)
        t_ms += arrival_spacing_ms + extra_ms
    wait_ms = simulate_bulk_head_wait_ms(
        offsets,
        enqueue_ms,
        head_since_ms,
        [head_since_ms - age for age in backlog_ages_ms],
        arrivals,
        claim_interval_ms,
    )
    bound_ms = max_wait_bound_ms(
        offsets,
        interactive_backlog=len(backlog_ages_ms),
        interactive_arrivals_per_s=1000 / arrival_spacing_ms,
        claims_per_s=1000 / claim_interval_ms,
    )
    assert wait_ms <= bound_ms
