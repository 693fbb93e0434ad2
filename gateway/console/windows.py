"""Windows over what the gateway already records: snapshots of its cumulative counters and
histograms, and the differences between two of them.

The console reads no request: once a second the sampler copies the cumulative values (the same
objects /metrics renders), and a window is the newest snapshot minus an older one. Quantiles
come from histogram buckets exactly as Prometheus's ``histogram_quantile`` computes them, so
the console's p50/p99 is what a dashboard over /metrics would show for the same window.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import Counter, Histogram

from engine.core.step_record import StepRecord
from policies.request_class import RequestClass

__all__ = [
    "HistogramCounts",
    "Snapshot",
    "StepTotals",
    "counter_values",
    "histogram_counts",
    "histogram_quantile",
]


@dataclass(frozen=True, slots=True)
class HistogramCounts:
    """One histogram series: cumulative counts per upper bound (+Inf last) and its count."""

    upper_bounds: tuple[float, ...]
    cumulative: tuple[float, ...]

    @property
    def count(self) -> float:
        return self.cumulative[-1] if self.cumulative else 0.0

    def minus(self, earlier: HistogramCounts | None) -> HistogramCounts:
        if earlier is None or earlier.upper_bounds != self.upper_bounds:
            return self
        pairs = zip(self.cumulative, earlier.cumulative, strict=True)
        return HistogramCounts(self.upper_bounds, tuple(max(0.0, a - b) for a, b in pairs))


def histogram_quantile(q: float, counts: HistogramCounts) -> float | None:
    """Prometheus's histogram_quantile: linear within the bucket that holds rank q * count;
    the first bucket starts at 0; a rank in the +Inf bucket answers the highest finite bound.
    None without observations."""
    total = counts.count
    if total <= 0 or not counts.upper_bounds:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, cumulative in zip(counts.upper_bounds, counts.cumulative, strict=True):
        if cumulative >= rank:
            if math.isinf(bound):
                return lower_bound
            in_bucket = cumulative - lower_count
            if in_bucket <= 0:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / in_bucket
        lower_bound, lower_count = bound, cumulative
    return lower_bound


def histogram_counts(histogram: Histogram) -> dict[str, HistogramCounts]:
    """Per `class` label value, the histogram's cumulative bucket counts right now."""
    buckets: dict[str, list[tuple[float, float]]] = {}
    for metric in histogram.collect():
        for sample in metric.samples:
            if sample.name.endswith("_bucket"):
                label = sample.labels.get("class", "")
                buckets.setdefault(label, []).append((float(sample.labels["le"]), sample.value))
    result = {}
    for label, pairs in buckets.items():
        pairs.sort()
        result[label] = HistogramCounts(
            tuple(b for b, _ in pairs), tuple(float(c) for _, c in pairs)
        )
    return result


def counter_values(counter: Counter) -> dict[tuple[str, ...], float]:
    """Each series of a labelled counter (its label values in order) and its total."""
    values: dict[tuple[str, ...], float] = {}
    for metric in counter.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                values[tuple(sample.labels.values())] = sample.value
    return values


@dataclass(slots=True)
class StepTotals:
    """Cumulative engine-step composition, grown from the engine's recent step records by
    step index (the records are a window; a step that left it between two catch-ups is
    counted in `unseen_steps`)."""

    steps: int = 0
    seconds: float = 0.0
    tokens: dict[tuple[str, str], float] = field(default_factory=dict)
    unseen_steps: int = 0
    last_index: int = -1

    def catch_up(self, records: Sequence[StepRecord]) -> None:
        new = [r for r in records if r.step_index > self.last_index]
        if not new:
            return
        if self.last_index >= 0:
            self.unseen_steps += max(0, new[0].step_index - self.last_index - 1)
        for record in new:
            self.steps += 1
            self.seconds += record.duration_s
            for (request_class, kind), tokens in record.tokens_by_kind.items():
                key = (request_class.value, kind)
                self.tokens[key] = self.tokens.get(key, 0.0) + tokens
        self.last_index = new[-1].step_index

    def frozen(self) -> StepTotals:
        return StepTotals(self.steps, self.seconds, dict(self.tokens), self.unseen_steps, -1)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The cumulative values at one moment (`at_s`: the event loop's clock)."""

    at_s: float
    ttft: Mapping[str, HistogramCounts]
    itl: Mapping[str, HistogramCounts]
    # (class, code) -> refusals; (class, status) -> finished jobs.
    rejections: Mapping[tuple[str, ...], float]
    finished: Mapping[tuple[str, ...], float]
    steps: StepTotals
    preemptions: int


def class_names() -> Iterable[str]:
    return (c.value for c in RequestClass)
