"""Which of several knob settings that sustain the same load an envelope is built from.

`planning/envelope_derive.py` finds, per knob setting, the largest load it sustains within the
SLO, and hands the settings tied on the largest load here, each as plain numbers: how much of
the SLO its latency used (the tightest target's measured / bound), its bulk drain and its
output tokens/s over the run. Pure: no I/O.

The rule: among the settings whose latency keeps the SLO's headroom (room used at most
``1 - headroom``), those that drain bulk work within ``DRAIN_TIE_FRACTION`` of the fastest;
of those, the most room under the SLO, then tokens/s over the run, then the earlier point.
The SLO is the promise; past it, bulk throughput is what the machine is for. Room alone (the
rule before) chose the 128-token bulk chunk on `small` although 256 drained bulk 16% faster
with chat ITL p99 at 56% of its bound; tokens/s over the run alone picks by noise (at a load
every tied point serves in full, so tokens/s is the offered load).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

__all__ = ["BULK_DRAIN_METRIC", "DRAIN_TIE_FRACTION", "TiedPoint", "break_tie"]

# What a tie on load is broken by: bulk output tokens over the bulk class's busy span (first
# send to last end; bench/report/summary.py), the rate a backlog drains at.
BULK_DRAIN_METRIC: Final = "output_tokens_per_busy_s"
# Drains this close to the fastest count as equal: a sweep has one run per point, and the same
# run on the shared 2-vCPU machines spread by 20-40% between repeats.
DRAIN_TIE_FRACTION: Final = 0.1


@dataclass(frozen=True, slots=True)
class TiedPoint:
    index: int  # the sweep point's position (the earlier wins a full tie)
    slo_fraction_used: float  # tightest latency target's measured / bound
    bulk_drain_tokens_per_s: float | None  # None: not measured
    output_tokens_per_s: float


def break_tie(tied: Sequence[TiedPoint], headroom: float) -> int:
    """The index of the point to build the envelope from (see the module docstring)."""
    if not tied:
        raise ValueError("no tied points to choose from")
    keeping = [p for p in tied if p.slo_fraction_used <= 1 - headroom]
    drains: Mapping[int, float] = {
        p.index: p.bulk_drain_tokens_per_s for p in keeping if p.bulk_drain_tokens_per_s is not None
    }
    candidates = list(tied)
    if drains:
        floor = (1 - DRAIN_TIE_FRACTION) * max(drains.values())
        candidates = [p for p in keeping if drains.get(p.index, -1.0) >= floor]
    best = max(candidates, key=lambda p: (-p.slo_fraction_used, p.output_tokens_per_s, -p.index))
    return best.index
