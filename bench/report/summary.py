"""Numbers a load run is judged by: per-class latency percentiles, outcome rates, throughput.

Shape of ``summarize``'s result (every latency in seconds, ``None`` where nothing was measured)::

    {
      "duration_s": 60.0,
      "classes": {
        "interactive": {
          "count": 120,
          "outcomes": {"ok": 110, "rejected": 5, "expired": 0, "cancelled": 5, ...},
          "rejection_rate": 0.04, "expiry_rate": 0.0, "cancel_rate": 0.04, "ok_rate": 0.92,
          "ttft_s": {"p50": .., "p90": .., "p99": ..},
          "itl_s": {"p50": .., "p99": ..},
          "e2e_s": {"p50": .., "p99": ..},
          "queue_delay_s": {"p50": .., "p99": ..},
          "output_tokens": 12345,
          "output_tokens_per_s": 205.7,
        },
        "bulk": {...},
      },
      "overall": {...the same block over every request...},
    }

"interactive" and "bulk" are always present (count 0 when a run had none), so readers can
index them without checking; any other class name found in the records gets its own block.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from bench.load.records import CANCELLED, EXPIRED, OK, OUTCOMES, REJECTED, RequestRecord

__all__ = ["CLASSES", "goodput", "headline_ratios", "percentile", "request_meets", "summarize"]

CLASSES = ("interactive", "bulk")


def percentile(values: Iterable[float], pct: float) -> float | None:
    """The ``pct``-th percentile by the nearest-rank method: the smallest value such that at
    least ``pct`` percent of the values are <= it, i.e. ``sorted(values)[ceil(pct/100 * n) - 1]``
    (the minimum for ``pct == 0``). No interpolation: the result is always a measured value,
    which is what a tail latency should be. ``None`` for no values."""
    if not 0 <= pct <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {pct!r}")
    ordered = sorted(values)
    if not ordered:
        return None
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def _percentiles(values: list[float], pcts: tuple[int, ...]) -> dict[str, float | None]:
    return {f"p{p}": percentile(values, p) for p in pcts}


def _rate(part: int, whole: int) -> float | None:
    # None, not 0.0, for a class with no requests: "nothing measured" must not read as "perfect".
    return part / whole if whole else None


def _class_block(records: list[RequestRecord], duration_s: float) -> dict[str, Any]:
    outcomes = {name: 0 for name in OUTCOMES}
    for record in records:
        outcomes[record.outcome] = outcomes.get(record.outcome, 0) + 1
    count = len(records)
    # NOTE: latencies are taken over OK requests only. A rejected request has no TTFT, and a
    # cancelled or expired one would mix the client's behaviour into the service's latency;
    # the failures are what the rates below count, so nothing is hidden.
    ok = [r for r in records if r.outcome == OK]
    output_tokens = sum(r.output_tokens for r in ok)
    return {
        "count": count,
        "outcomes": outcomes,
        "rejection_rate": _rate(outcomes[REJECTED], count),
        "expiry_rate": _rate(outcomes[EXPIRED], count),
        "cancel_rate": _rate(outcomes[CANCELLED], count),
        # The fraction that finished: the bulk "completion within deadline" SLO reads this.
        "ok_rate": _rate(outcomes[OK], count),
        "ttft_s": _percentiles([r.ttft_s for r in ok if r.ttft_s is not None], (50, 90, 99)),
        # Every gap of every OK stream, pooled: one stalled token anywhere is a stall.
        "itl_s": _percentiles([gap for r in ok for gap in r.itls_s], (50, 99)),
        "e2e_s": _percentiles([r.e2e_s for r in ok if r.e2e_s is not None], (50, 99)),
        "queue_delay_s": _percentiles(
            [r.queue_delay_s for r in ok if r.queue_delay_s is not None], (50, 99)
        ),
        "output_tokens": output_tokens,
        "output_tokens_per_s": output_tokens / duration_s,
        # NOTE: a backlog that drains before the run ends makes every server look the same
        # over the run's length (its tokens / duration); over the class's own busy span (first
        # send to last finish) the rate says how fast the server got through it.
        "output_tokens_per_busy_s": _per_busy_s(output_tokens, records, ok),
    }


def _per_busy_s(
    output_tokens: int, records: list[RequestRecord], ok: list[RequestRecord]
) -> float | None:
    ends_s = [r.sent_s + r.e2e_s for r in ok if r.e2e_s is not None]
    if not ends_s:
        return None
    busy_s = max(ends_s) - min(r.sent_s for r in records)
    return output_tokens / busy_s if busy_s > 0 else None


def request_meets(record: RequestRecord, bounds_s: Mapping[str, float]) -> bool:
    """Whether one request met per-request bounds, as vLLM's benchmark and AIPerf count it:
    finished OK, its TTFT <= ``bounds_s["ttft_s"]`` and its mean inter-token latency (over its
    own gaps) <= ``bounds_s["itl_s"]``, each bound only where given. A stream with no gaps
    (one token) has no ITL to miss."""
    if record.outcome != OK:
        return False
    ttft_max = bounds_s.get("ttft_s")
    if ttft_max is not None and (record.ttft_s is None or record.ttft_s > ttft_max):
        return False
    itl_max = bounds_s.get("itl_s")
    if itl_max is not None and record.itls_s:
        return sum(record.itls_s) / len(record.itls_s) <= itl_max
    return True


def goodput(
    records: list[RequestRecord],
    duration_s: float,
    bounds_by_class: Mapping[str, Mapping[str, float]],
) -> dict[str, dict[str, Any]]:
    """Per class: requests per second that met their class's bounds (``request_meets``).

    ``{"interactive": {"bounds_s": {"ttft_s": 0.5, "itl_s": 0.1}, "good": 57, "count": 60,
    "good_fraction": 0.95, "goodput_per_s": 1.42}, "bulk": {...}}``. A class without bounds
    counts every OK request (its goodput is its completed requests per second); the run's
    ``duration_s`` is the denominator, as in vLLM's and AIPerf's goodput."""
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s must be positive and finite, got {duration_s!r}")
    names = list(CLASSES) + sorted({r.request_class for r in records} - set(CLASSES))
    result: dict[str, dict[str, Any]] = {}
    for name in names:
        mine = [r for r in records if r.request_class == name]
        bounds = dict(bounds_by_class.get(name, {}))
        good = sum(1 for r in mine if request_meets(r, bounds))
        result[name] = {
            "bounds_s": bounds,
            "good": good,
            "count": len(mine),
            "good_fraction": _rate(good, len(mine)),
            "goodput_per_s": good / duration_s,
        }
    return result


def summarize(records: list[RequestRecord], duration_s: float) -> dict[str, Any]:
    """Per-class and overall summary of one run (shape in the module docstring).

    ``duration_s`` is the run's length, the denominator of the token rates."""
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s must be positive and finite, got {duration_s!r}")
    names = list(CLASSES) + sorted({r.request_class for r in records} - set(CLASSES))
    return {
        "duration_s": duration_s,
        "classes": {
            name: _class_block([r for r in records if r.request_class == name], duration_s)
            for name in names
        },
        "overall": _class_block(list(records), duration_s),
    }


def _class_number(summary: Mapping[str, Any] | None, request_class: str, *keys: str) -> Any:
    """summary["classes"][request_class][keys...], or None where any level is missing."""
    if summary is None:
        return None
    node: Any = summary.get("classes", {}).get(request_class)
    for key in keys:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def _ratio(numerator: Any, denominator: Any) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return float(numerator) / float(denominator)


def headline_ratios(
    mixed: Mapping[str, Any] | None,
    chat_alone: Mapping[str, Any] | None,
    bulk_alone: Mapping[str, Any] | None,
) -> dict[str, float | None]:
    """What sharing the engine costs each class, from three ``summarize`` results.

    - ``interactive_ttft_p99_ratio``: interactive TTFT p99 under bulk load / with chat alone;
    - ``interactive_itl_p99_ratio``: the same for ITL p99 (1.0: bulk load costs chat nothing);
    - ``bulk_tokens_per_s_ratio``: bulk output tokens/s under chat load / bulk alone
      (1.0: chat costs bulk nothing);
    - ``bulk_busy_tokens_per_s_ratio``: the same over each run's bulk busy span (first send to
      last finish), which still means something when the backlog drains before the run ends.

    A ratio is ``None`` where either side is missing or its denominator is zero.
    """
    return {
        "interactive_ttft_p99_ratio": _ratio(
            _class_number(mixed, "interactive", "ttft_s", "p99"),
            _class_number(chat_alone, "interactive", "ttft_s", "p99"),
        ),
        "interactive_itl_p99_ratio": _ratio(
            _class_number(mixed, "interactive", "itl_s", "p99"),
            _class_number(chat_alone, "interactive", "itl_s", "p99"),
        ),
        "bulk_tokens_per_s_ratio": _ratio(
            _class_number(mixed, "bulk", "output_tokens_per_s"),
            _class_number(bulk_alone, "bulk", "output_tokens_per_s"),
        ),
        "bulk_busy_tokens_per_s_ratio": _ratio(
            _class_number(mixed, "bulk", "output_tokens_per_busy_s"),
            _class_number(bulk_alone, "bulk", "output_tokens_per_busy_s"),
        ),
    }
