"""planning.envelope_tie_break: which of the knob settings tied on load an envelope is built
from, alone and through derive_envelope."""

from __future__ import annotations

import pytest

from planning.envelope_derive import Knobs, SweepPoint, derive_envelope
from planning.envelope_tie_break import DRAIN_TIE_FRACTION, TiedPoint, break_tie
from planning.slo import load_slo
from policies.envelope import Envelope

HEADROOM = 0.2


def _tied(index: int, room_used: float, drain: float | None, tokens: float = 100.0) -> TiedPoint:
    return TiedPoint(index, room_used, drain, tokens)


def test_the_fastest_drain_that_keeps_the_headroom_wins() -> None:
    points = [_tied(0, 0.3, 700.0), _tied(1, 0.6, 850.0), _tied(2, 0.9, 990.0)]
    # 2 drains fastest but uses 90% of a bound: it eats into the headroom.
    assert break_tie(points, HEADROOM) == 1


def test_drains_within_the_tie_fraction_go_to_the_most_room() -> None:
    close = (1 - DRAIN_TIE_FRACTION) * 850.0 + 1
    assert break_tie([_tied(0, 0.3, close), _tied(1, 0.6, 850.0)], HEADROOM) == 0
    farther = (1 - DRAIN_TIE_FRACTION) * 850.0 - 1
    assert break_tie([_tied(0, 0.3, farther), _tied(1, 0.6, 850.0)], HEADROOM) == 1


def test_without_drains_or_headroom_the_most_room_then_tokens_then_the_earlier_point() -> None:
    assert break_tie([_tied(0, 0.9, 990.0), _tied(1, 0.85, 500.0)], HEADROOM) == 1
    assert break_tie([_tied(0, 0.5, None), _tied(1, 0.4, None)], HEADROOM) == 1
    assert break_tie([_tied(0, 0.5, None, 99.0), _tied(1, 0.5, None, 100.0)], HEADROOM) == 1
    assert break_tie([_tied(3, 0.5, None), _tied(1, 0.5, None)], HEADROOM) == 1
    with pytest.raises(ValueError):
        break_tie([], HEADROOM)


SLO_TOML = """
headroom = 0.2
max_rejection_rate = 0.01

[[target]]
class = "interactive"
metric = "itl_s"
percentile = 99
max = 0.1
"""


def _point(chunk: int, itl_s: float, drain: float, load: float = 2.0) -> SweepPoint:
    return SweepPoint(
        offered_load=load,
        knobs=Knobs(max_active_seqs=32, step_token_budget=512, bulk_prefill_chunk_tokens=chunk),
        measured={
            "interactive": {"itl_p99_s": itl_s, "rejection_rate": 0.0},
            "bulk": {"rejection_rate": 0.0, "output_tokens_per_busy_s": drain},
        },
    )


def test_derive_builds_the_envelope_from_the_tie_break() -> None:
    # This machine's sweep at load 2 (chunk: ITL p99, bulk drain): 512 and 256 drain within
    # 10%, 256 has more room; 128 keeps the most room but drains 14% slower than 512.
    points = [_point(128, 0.045, 610.0), _point(256, 0.056, 710.0), _point(512, 0.066, 753.0)]
    slo = load_slo(SLO_TOML).slo()
    derivation = derive_envelope(points, slo, Envelope.default(), HEADROOM, "w", "2026-12-04")
    assert derivation.envelope.bulk_prefill_chunk_tokens == 256
    # A larger load still wins over any drain.
    more = [*points, _point(128, 0.05, 600.0, load=3.0)]
    derivation = derive_envelope(more, slo, Envelope.default(), HEADROOM, "w", "2026-12-04")
    assert derivation.envelope.bulk_prefill_chunk_tokens == 128
