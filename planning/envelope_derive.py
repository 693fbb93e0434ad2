"""From a load sweep to an operating envelope: the largest load that meets the SLO, less headroom.

A sweep runs the same workload at several offered loads under several knob settings
(max_active_seqs, step_token_budget, bulk_prefill_chunk_tokens) and measures each run per class.
``derive_envelope`` then:

1. checks every point against every SLO target and the rejection-rate bound, keeping the
   reasons a point fails (a report shows them);
2. per knob setting, finds the largest load it sustains: the largest load such that the point
   at that load *and every lower load measured for that setting* meet the SLO;
3. picks the setting that sustains the largest load; ties on load are broken by
   ``planning/envelope_tie_break.py`` (the fastest bulk drains that keep the headroom, then the
   most room);
4. keeps ``headroom`` of it in reserve: the admitted load is ``(1 - headroom) ×`` the sustained
   load, enforced by scaling the base envelope's queue limits by ``1 - headroom`` and stated
   (with ``max_sustainable_load``) in the provenance notes.

Pure: no I/O, no clock (the caller passes ``created_at``). ``planning/slo.py`` reads SLO files into
the ``Slo`` / ``SloTarget`` types below; ``planning/envelope_command.py`` reads sweep folders into
``SweepPoint`` values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final

from planning.envelope_tie_break import BULK_DRAIN_METRIC, TiedPoint, break_tie
from policies.admission import LengthLimits
from policies.envelope import Envelope, Provenance

__all__ = [
    "COMPLETION_METRIC",
    "LATENCY_METRICS",
    "Derivation",
    "Knobs",
    "Slo",
    "SloTarget",
    "SweepPoint",
    "check_point",
    "derive_envelope",
    "slo_fraction_used",
]

# Latency metrics an SLO target may bound (seconds, at a percentile, with ``max``).
LATENCY_METRICS: Final = ("ttft_s", "itl_s", "e2e_s", "queue_delay_s")
# The fraction of a class's requests that finished OK (so within their deadline: one that
# missed it is "expired"), bounded with ``min``. Measured as ``ok_rate``.
COMPLETION_METRIC: Final = "completion_within_deadline"
_CLASSES: Final = ("interactive", "bulk")


def _check_fraction(name: str, value: float, *, upper_open: bool) -> None:
    if not math.isfinite(value) or value < 0 or value > 1 or (upper_open and value == 1):
        bound = "[0, 1)" if upper_open else "[0, 1]"
        raise ValueError(f"{name} must be in {bound}, got {value!r}")


@dataclass(frozen=True, slots=True)
class SloTarget:
    """One bound on one class's measurement, e.g. interactive TTFT p99 <= 0.5 s."""

    request_class: str  # "interactive" | "bulk"
    metric: str  # one of LATENCY_METRICS, or COMPLETION_METRIC
    percentile: int | None = None  # latency metrics only: 50, 90 or 99
    max_value: float | None = None  # latency metrics: the bound, in seconds
    min_value: float | None = None  # COMPLETION_METRIC: the least acceptable fraction
    # The workload the target was stated for ("" = any); the seed asks every target to say so.
    workload: str = ""

    def __post_init__(self) -> None:
        if self.request_class not in _CLASSES:
            raise ValueError(f"class must be one of {_CLASSES}, got {self.request_class!r}")
        if self.metric in LATENCY_METRICS:
            if self.percentile not in (50, 90, 99):
                raise ValueError(f"{self.metric} needs percentile 50, 90 or 99")
            if self.max_value is None or self.min_value is not None:
                raise ValueError(f"{self.metric} is bounded by max (seconds), not min")
            if not (math.isfinite(self.max_value) and self.max_value > 0):
                raise ValueError(f"{self.metric} max must be positive, got {self.max_value!r}")
        elif self.metric == COMPLETION_METRIC:
            if self.percentile is not None:
                raise ValueError(f"{COMPLETION_METRIC} is a fraction: it takes no percentile")
            if self.min_value is None or self.max_value is not None:
                raise ValueError(f"{COMPLETION_METRIC} is bounded by min (a fraction), not max")
            _check_fraction(f"{COMPLETION_METRIC} min", self.min_value, upper_open=False)
        else:
            known = (*LATENCY_METRICS, COMPLETION_METRIC)
            raise ValueError(f"unknown SLO metric {self.metric!r}; known: {known}")

    @property
    def measured_key(self) -> str:
        """The key of ``SweepPoint.measured[class]`` this target reads, e.g. ``ttft_p99_s``."""
        if self.metric == COMPLETION_METRIC:
            return "ok_rate"
        return f"{self.metric.removesuffix('_s')}_p{self.percentile}_s"

    @property
    def name(self) -> str:
        """A stable name for provenance, e.g. ``interactive_ttft_p99_s_max``."""
        bound = "min" if self.metric == COMPLETION_METRIC else "max"
        return f"{self.request_class}_{self.measured_key}_{bound}"

    @property
    def bound(self) -> float:
        value = self.min_value if self.metric == COMPLETION_METRIC else self.max_value
        # __post_init__ guarantees the bound of the metric's kind is set; 0.0 keeps mypy calm.
        return 0.0 if value is None else value

    def miss(self, measured: float | None) -> str | None:
        """Why ``measured`` fails this target, or None when it meets it."""
        label = f"{self.request_class} {self.measured_key}"
        if measured is None:
            # NOTE: no measurement is a failure: an envelope must rest on evidence.
            return f"{label} not measured"
        if self.metric == COMPLETION_METRIC:
            if measured < self.bound:
                return f"{label} {measured:.4g} < min {self.bound:.4g}"
        elif measured > self.bound:
            return f"{label} {measured:.4g} > max {self.bound:.4g}"
        return None


@dataclass(frozen=True, slots=True)
class Slo:
    targets: tuple[SloTarget, ...]
    # Each class's rejection rate must stay at or below this (an envelope that meets latency
    # targets by refusing most work is no envelope).
    max_rejection_rate: float

    def __post_init__(self) -> None:
        _check_fraction("max_rejection_rate", self.max_rejection_rate, upper_open=False)
        names = [t.name for t in self.targets]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate SLO targets: {names}")

    def as_provenance(self) -> dict[str, float]:
        return {
            **{t.name: t.bound for t in self.targets},
            "max_rejection_rate": self.max_rejection_rate,
        }


@dataclass(frozen=True, slots=True)
class Knobs:
    """The engine settings one sweep run used; the envelope takes them from the chosen point."""

    max_active_seqs: int
    step_token_budget: int
    bulk_prefill_chunk_tokens: int

    def __post_init__(self) -> None:
        # The Envelope's own rules, checked here so a bad sweep point fails where it is read.
        for name in ("max_active_seqs", "step_token_budget", "bulk_prefill_chunk_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.step_token_budget < self.max_active_seqs:
            raise ValueError("step_token_budget must be >= max_active_seqs")
        if self.bulk_prefill_chunk_tokens > self.step_token_budget:
            raise ValueError("bulk_prefill_chunk_tokens must not exceed step_token_budget")

    def describe(self) -> str:
        return (
            f"max_active_seqs={self.max_active_seqs} step_token_budget={self.step_token_budget}"
            f" bulk_prefill_chunk_tokens={self.bulk_prefill_chunk_tokens}"
        )


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One run of a sweep: the load offered, the knobs used, what was measured per class."""

    # Relative load factor or request rate: any unit, as long as one sweep uses one.
    offered_load: float
    knobs: Knobs
    # class -> measurement -> value (None: not measured). Keys the derivation reads:
    # ttft_p99_s, itl_p99_s (or any ``SloTarget.measured_key``), rejection_rate, ok_rate,
    # output_tokens_per_s, output_tokens_per_busy_s.
    measured: Mapping[str, Mapping[str, float | None]]
    # The length limits the run was served under, by class; when the chosen point has them
    # they replace the base envelope's (the measurement only vouches for what it served).
    length_limits: Mapping[str, LengthLimits] = field(default_factory=dict, hash=False)
    label: str = ""  # where it came from (a run folder), for reports

    def __post_init__(self) -> None:
        if not (math.isfinite(self.offered_load) and self.offered_load > 0):
            raise ValueError(f"offered_load must be positive, got {self.offered_load!r}")
        # NOTE: frozen does not freeze nested dicts; copy them so callers cannot change a point.
        copied: dict[str, dict[str, float | None]] = {}
        for request_class, values in self.measured.items():
            copied[request_class] = {}
            for key, value in values.items():
                if value is not None and not (math.isfinite(value) and value >= 0):
                    raise ValueError(f"measured {request_class}.{key} must be >= 0: {value!r}")
                copied[request_class][key] = None if value is None else float(value)
        object.__setattr__(self, "measured", copied)
        unknown = set(self.length_limits) - set(_CLASSES)
        if unknown:
            raise ValueError(f"length_limits for unknown classes: {sorted(unknown)}")
        object.__setattr__(self, "length_limits", dict(self.length_limits))

    def value(self, request_class: str, key: str) -> float | None:
        return self.measured.get(request_class, {}).get(key)

    def total_output_tokens_per_s(self) -> float:
        return sum(self.value(c, "output_tokens_per_s") or 0.0 for c in _CLASSES)

    def describe(self) -> str:
        where = f" ({self.label})" if self.label else ""
        return f"load={self.offered_load:g} {self.knobs.describe()}{where}"


@dataclass(frozen=True, slots=True)
class Derivation:
    envelope: Envelope
    chosen: SweepPoint
    # The largest load the chosen knobs sustain within the SLO, and what is admitted after
    # headroom: admitted_load = (1 - headroom) * max_sustainable_load.
    max_sustainable_load: float
    admitted_load: float
    # Every point that was not usable, with the reasons (an SLO miss, or a lower load failing).
    rejected: tuple[tuple[SweepPoint, tuple[str, ...]], ...]


def slo_fraction_used(point: SweepPoint, targets: Sequence[SloTarget]) -> float:
    """The tightest latency target's measured / bound (1.0 at the bound; lower: more room).
    Completion floors are pass/fail (a passing point completes all but a sliver), left out."""
    fractions = []
    for target in targets:
        if target.metric == COMPLETION_METRIC:
            continue
        measured = point.value(target.request_class, target.measured_key)
        fractions.append(math.inf if measured is None else measured / target.bound)
    return max(fractions, default=0.0)


def check_point(point: SweepPoint, slo: Slo, targets: Sequence[SloTarget]) -> tuple[str, ...]:
    """Every reason ``point`` misses ``targets`` or the rejection bound (empty: it meets all)."""
    reasons: list[str] = []
    for target in targets:
        reason = target.miss(point.value(target.request_class, target.measured_key))
        if reason is not None:
            reasons.append(reason)
    for request_class in _CLASSES:
        rate = point.value(request_class, "rejection_rate")
        # None: the class had no requests in this run; nothing was refused.
        if rate is not None and rate > slo.max_rejection_rate:
            reasons.append(
                f"{request_class} rejection_rate {rate:.4g} > max {slo.max_rejection_rate:.4g}"
            )
    return tuple(reasons)


def _applicable(slo: Slo, workload_name: str) -> tuple[list[SloTarget], list[SloTarget]]:
    used = [t for t in slo.targets if t.workload in ("", workload_name)]
    skipped = [t for t in slo.targets if t not in used]
    if slo.targets and not used:
        # A silent skip would let every point pass: loud instead.
        workloads = sorted({t.workload for t in skipped})
        raise ValueError(
            f"no SLO target applies to workload {workload_name!r} (targets are for {workloads})"
        )
    return used, skipped


def _sustained(
    points: Sequence[SweepPoint], failures: Mapping[int, tuple[str, ...]]
) -> tuple[dict[Knobs, int], dict[int, tuple[str, ...]]]:
    """Per knob setting, the index of the highest-load point with no failure at or below its
    load; and extra rejections for passing points above a failing lower load."""
    best: dict[Knobs, int] = {}
    extra: dict[int, tuple[str, ...]] = {}
    by_knobs: dict[Knobs, list[int]] = {}
    for index, point in enumerate(points):
        by_knobs.setdefault(point.knobs, []).append(index)
    for knobs, indices in by_knobs.items():
        first_failure: float | None = None
        # Failures first among equal loads: a repeat that failed spoils that load for all.
        for index in sorted(indices, key=lambda i: (points[i].offered_load, i not in failures)):
            load = points[index].offered_load
            if index in failures:
                first_failure = load if first_failure is None else first_failure
            elif first_failure is not None and load >= first_failure:
                # NOTE: a pass above a failure is noise or luck, not capacity: the envelope
                # claims every load up to its limit, so it only trusts an unbroken run of passes.
                extra[index] = (f"a load of {first_failure:g} or less with these knobs failed",)
            else:
                best[knobs] = index
    return best, extra


def _closest_miss(points: Sequence[SweepPoint], failures: Mapping[int, tuple[str, ...]]) -> str:
    # Closest: fewest missed targets, then the highest load (the most useful to fix).
    index = min(failures, key=lambda i: (len(failures[i]), -points[i].offered_load))
    return f"closest: {points[index].describe()} missed: {'; '.join(failures[index])}"


def _notes(
    chosen: SweepPoint,
    headroom: float,
    admitted_load: float,
    skipped: Sequence[SloTarget],
    points: Sequence[SweepPoint],
    rejected_count: int,
) -> str:
    parts = [
        f"max_sustainable_load={chosen.offered_load:g} (largest load meeting every SLO target "
        f"and the rejection bound, with every lower load for the same knobs passing too)",
        f"headroom={headroom:g}: admitted_load={admitted_load:g}; queue limits scaled by "
        f"{1 - headroom:g}",
        f"chosen: {chosen.describe()}",
        f"{len(points)} points, {rejected_count} rejected",
    ]
    if skipped:
        parts.append("targets for other workloads ignored: " + ", ".join(t.name for t in skipped))
    return "; ".join(parts)


def _build_envelope(
    base: Envelope, chosen: SweepPoint, targets: Sequence[SloTarget], headroom: float
) -> Envelope:
    knobs = chosen.knobs
    keep = 1 - headroom
    ttft_targets = [t for t in targets if t.request_class == "interactive" and t.metric == "ttft_s"]
    return replace(
        base,
        max_active_seqs=knobs.max_active_seqs,
        step_token_budget=knobs.step_token_budget,
        bulk_prefill_chunk_tokens=knobs.bulk_prefill_chunk_tokens,
        # Fewer queued requests is how the service turns away the load above admitted_load.
        interactive_queue_limit=max(1, math.floor(base.interactive_queue_limit * keep)),
        bulk_queue_limit=max(1, math.floor(base.bulk_queue_limit * keep)),
        # The reserve must leave bulk at least one slot under the new max_active_seqs.
        interactive_reserved_seqs=min(base.interactive_reserved_seqs, knobs.max_active_seqs - 1),
        interactive_limits=chosen.length_limits.get("interactive", base.interactive_limits),
        bulk_limits=chosen.length_limits.get("bulk", base.bulk_limits),
        # Admission refuses chat it predicts will miss this; the SLO's bound is the honest one.
        interactive_ttft_target_s=(
            min(t.bound for t in ttft_targets) if ttft_targets else base.interactive_ttft_target_s
        ),
    )


def derive_envelope(
    points: Sequence[SweepPoint],
    slo: Slo,
    base: Envelope,
    headroom: float,
    workload_name: str,
    created_at: str,
) -> Derivation:
    """The envelope for the knobs that sustain the largest load within ``slo`` (module docstring).

    Raises ValueError when no point meets the SLO, naming the closest point and its misses.
    """
    if not points:
        raise ValueError("no sweep points to derive an envelope from")
    _check_fraction("headroom", headroom, upper_open=True)
    targets, skipped = _applicable(slo, workload_name)
    failures = {i: r for i, p in enumerate(points) if (r := check_point(p, slo, targets))}
    if len(failures) == len(points):
        raise ValueError(f"no sweep point meets the SLO; {_closest_miss(points, failures)}")
    best, extra = _sustained(points, failures)
    top_load = max(points[i].offered_load for i in best.values())
    tied = [
        TiedPoint(
            index=i,
            slo_fraction_used=slo_fraction_used(points[i], targets),
            bulk_drain_tokens_per_s=points[i].value("bulk", BULK_DRAIN_METRIC),
            output_tokens_per_s=points[i].total_output_tokens_per_s(),
        )
        for i in best.values()
        if points[i].offered_load == top_load
    ]
    chosen = points[break_tie(tied, headroom)]
    rejected = tuple(
        (point, failures.get(i) or extra[i])
        for i, point in enumerate(points)
        if i in failures or i in extra
    )
    admitted_load = (1 - headroom) * chosen.offered_load
    envelope = _build_envelope(base, chosen, targets, headroom)
    provenance = Provenance(
        source="sweep",
        created_at=created_at,
        workload=workload_name,
        slo={**slo.as_provenance(), "headroom": headroom},
        notes=_notes(chosen, headroom, admitted_load, skipped, points, len(rejected)),
    )
    return Derivation(
        envelope=replace(envelope, provenance=provenance),
        chosen=chosen,
        max_sustainable_load=chosen.offered_load,
        admitted_load=admitted_load,
        rejected=rejected,
    )
