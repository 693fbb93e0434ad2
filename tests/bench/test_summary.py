"""bench.report.summary: nearest-rank percentiles, per-class rates, headline ratios."""

from __future__ import annotations

import pytest

import bench.report.summary as summary_module
from bench.load.records import CANCELLED, EXPIRED, INCOMPLETE, OK, REJECTED, RequestRecord
from bench.report.summary import goodput, headline_ratios, percentile, summarize


def _record(
    index: int,
    request_class: str,
    outcome: str,
    *,
    ttft_s: float | None = None,
    itls_s: list[float] | None = None,
    e2e_s: float | None = None,
    queue_delay_s: float | None = None,
    output_tokens: int = 0,
) -> RequestRecord:
    return RequestRecord(
        request_id=f"r{index}",
        request_class=request_class,
        prompt_tokens=10,
        max_tokens=20,
        scheduled_s=float(index),
        sent_s=float(index),
        outcome=outcome,
        ttft_s=ttft_s,
        itls_s=itls_s or [],
        e2e_s=e2e_s,
        queue_delay_s=queue_delay_s,
        output_tokens=output_tokens,
    )


def test_all_exports_exist() -> None:
    for name in summary_module.__all__:
        assert hasattr(summary_module, name), name


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile(values, 0) == 1.0
    # Unsorted input, n = 5: p50 -> rank ceil(2.5) = 3; p90 -> rank ceil(4.5) = 5.
    assert percentile([5.0, 1.0, 4.0, 2.0, 3.0], 50) == 3.0
    assert percentile([5.0, 1.0, 4.0, 2.0, 3.0], 90) == 5.0
    assert percentile([7.0], 99) == 7.0


def test_percentile_empty_and_invalid() -> None:
    assert percentile([], 99) is None
    with pytest.raises(ValueError, match="percentile"):
        percentile([1.0], 101)


def _mixed_records() -> list[RequestRecord]:
    records = [
        _record(
            i,
            "interactive",
            OK,
            ttft_s=0.1 * (i + 1),
            itls_s=[0.01 * (i + 1), 0.02 * (i + 1)],
            e2e_s=1.0 + i,
            queue_delay_s=0.01,
            output_tokens=10,
        )
        for i in range(4)
    ]
    records += [
        _record(4, "interactive", REJECTED),
        _record(5, "interactive", CANCELLED, ttft_s=9.0, itls_s=[9.0]),
        _record(6, "bulk", OK, ttft_s=2.0, e2e_s=30.0, output_tokens=100),
        _record(7, "bulk", EXPIRED),
        _record(8, "bulk", INCOMPLETE),
        _record(9, "bulk", REJECTED),
    ]
    return records


def test_summarize_per_class_numbers() -> None:
    result = summarize(_mixed_records(), duration_s=10.0)
    chat = result["classes"]["interactive"]
    assert chat["count"] == 6
    assert chat["outcomes"][OK] == 4
    assert chat["outcomes"][REJECTED] == 1
    assert chat["outcomes"][CANCELLED] == 1
    assert chat["rejection_rate"] == pytest.approx(1 / 6)
    assert chat["cancel_rate"] == pytest.approx(1 / 6)
    assert chat["expiry_rate"] == 0.0
    # Over OK requests only: the cancelled request's 9 s TTFT and ITL are left out.
    assert chat["ttft_s"] == {"p50": pytest.approx(0.2), "p90": 0.4, "p99": 0.4}
    # ITLs pooled over OK streams: 0.01..0.04 and 0.02..0.08 -> 8 values, p99 = the max.
    assert chat["itl_s"]["p99"] == pytest.approx(0.08)
    assert chat["itl_s"]["p50"] == pytest.approx(0.03)
    assert chat["e2e_s"]["p99"] == 4.0
    assert chat["queue_delay_s"]["p50"] == 0.01
    assert chat["output_tokens_per_s"] == pytest.approx(4.0)

    bulk = result["classes"]["bulk"]
    assert bulk["count"] == 4
    assert bulk["expiry_rate"] == 0.25
    assert bulk["rejection_rate"] == 0.25
    assert bulk["ok_rate"] == 0.25
    assert bulk["outcomes"][INCOMPLETE] == 1
    assert bulk["output_tokens_per_s"] == pytest.approx(10.0)
    assert bulk["itl_s"] == {"p50": None, "p99": None}

    overall = result["overall"]
    assert overall["count"] == 10
    assert overall["output_tokens_per_s"] == pytest.approx(14.0)
    assert overall["rejection_rate"] == pytest.approx(0.2)


def test_summarize_empty_run_has_both_classes_with_nones() -> None:
    result = summarize([], duration_s=5.0)
    for name in ("interactive", "bulk"):
        block = result["classes"][name]
        assert block["count"] == 0
        assert block["rejection_rate"] is None
        assert block["ttft_s"] == {"p50": None, "p90": None, "p99": None}
        assert block["output_tokens_per_s"] == 0.0
    assert result["overall"]["count"] == 0


def test_summarize_rejects_bad_duration() -> None:
    with pytest.raises(ValueError, match="duration_s"):
        summarize([], duration_s=0.0)


def _summary(ttft_p99: float | None, itl_p99: float | None, bulk_tps: float) -> dict[str, object]:
    return {
        "classes": {
            "interactive": {"ttft_s": {"p99": ttft_p99}, "itl_s": {"p99": itl_p99}},
            "bulk": {"output_tokens_per_s": bulk_tps},
        }
    }


def test_headline_ratios() -> None:
    ratios = headline_ratios(
        mixed=_summary(0.6, 0.05, 80.0),
        chat_alone=_summary(0.2, 0.04, 0.0),
        bulk_alone=_summary(None, None, 100.0),
    )
    assert ratios["interactive_ttft_p99_ratio"] == pytest.approx(3.0)
    assert ratios["interactive_itl_p99_ratio"] == pytest.approx(1.25)
    assert ratios["bulk_tokens_per_s_ratio"] == pytest.approx(0.8)


def test_headline_ratios_missing_or_zero_sides_are_none() -> None:
    ratios = headline_ratios(
        mixed=_summary(0.6, None, 80.0), chat_alone=_summary(0.0, 0.04, 0.0), bulk_alone=None
    )
    assert ratios == {
        "interactive_ttft_p99_ratio": None,
        "interactive_itl_p99_ratio": None,
        "bulk_tokens_per_s_ratio": None,
        "bulk_busy_tokens_per_s_ratio": None,
    }


def test_headline_ratios_from_real_summaries() -> None:
    chat = [_record(0, "interactive", OK, ttft_s=0.1, itls_s=[0.01], output_tokens=5)]
    mixed = chat + [_record(1, "bulk", OK, output_tokens=50)]
    bulk = [_record(2, "bulk", OK, output_tokens=100)]
    ratios = headline_ratios(summarize(mixed, 1.0), summarize(chat, 1.0), summarize(bulk, 1.0))
    assert ratios["interactive_ttft_p99_ratio"] == pytest.approx(1.0)
    assert ratios["bulk_tokens_per_s_ratio"] == pytest.approx(0.5)


def test_goodput_counts_requests_within_both_bounds_per_second() -> None:
    bounds = {"interactive": {"ttft_s": 0.5, "itl_s": 0.1}}
    records = [
        _record(0, "interactive", OK, ttft_s=0.4, itls_s=[0.05, 0.15]),  # mean ITL 0.1: good
        _record(1, "interactive", OK, ttft_s=0.6, itls_s=[0.01]),  # TTFT too late
        _record(2, "interactive", OK, ttft_s=0.1, itls_s=[0.3, 0.01]),  # mean ITL 0.155
        _record(3, "interactive", OK, ttft_s=0.5),  # one token: no ITL to miss; good
        _record(4, "interactive", REJECTED),  # refused: never good
        _record(5, "bulk", OK, ttft_s=30.0, e2e_s=60.0),  # no bulk bounds: every OK is good
        _record(6, "bulk", INCOMPLETE),
    ]
    result = goodput(records, 10.0, bounds)
    chat, bulk = result["interactive"], result["bulk"]
    assert (chat["good"], chat["count"]) == (2, 5)
    assert chat["goodput_per_s"] == pytest.approx(0.2)
    assert chat["good_fraction"] == pytest.approx(0.4)
    assert chat["bounds_s"] == {"ttft_s": 0.5, "itl_s": 0.1}
    assert (bulk["good"], bulk["count"], bulk["bounds_s"]) == (1, 2, {})
    assert bulk["goodput_per_s"] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="duration_s"):
        goodput(records, 0.0, bounds)


def test_goodput_of_a_class_without_requests_is_zero_not_missing() -> None:
    result = goodput([], 5.0, {})
    assert result["interactive"]["goodput_per_s"] == 0.0
    assert result["interactive"]["good_fraction"] is None


def test_goodput_bounds_of_the_chat_over_backlog_slo() -> None:
    from planning.slo import DEFAULT_SLO_PATH, goodput_bounds, load_slo

    assert goodput_bounds(DEFAULT_SLO_PATH) == {"interactive": {"ttft_s": 0.5, "itl_s": 0.1}}
    # The tightest bound wins where several percentiles bound one metric; other metrics and
    # the completion fraction are not per-request goodput bounds.
    spec = load_slo(
        """
[[target]]
class = "interactive"
metric = "ttft_s"
percentile = 50
max = 0.2
[[target]]
class = "interactive"
metric = "ttft_s"
percentile = 99
max = 0.8
[[target]]
class = "interactive"
metric = "e2e_s"
percentile = 99
max = 5.0
[[target]]
class = "bulk"
metric = "completion_within_deadline"
min = 0.99
"""
    )
    assert spec.goodput_bounds() == {"interactive": {"ttft_s": 0.2}}


def test_busy_rate_divides_by_the_class_span_not_the_run() -> None:
    # Sent at 0, 1, 2 s; the last finishes at 2 + 3 = 5 s: 60 tokens over a 5 s span, though
    # the run lasted 60 s (a drained backlog reads the same over the run on every server).
    records = [
        _record(0, "bulk", OK, e2e_s=2.0, output_tokens=20),
        _record(1, "bulk", OK, e2e_s=1.0, output_tokens=20),
        _record(2, "bulk", OK, e2e_s=3.0, output_tokens=20),
        _record(3, "bulk", REJECTED),
    ]
    block = summarize(records, 60.0)["classes"]["bulk"]
    assert block["output_tokens_per_s"] == pytest.approx(1.0)
    assert block["output_tokens_per_busy_s"] == pytest.approx(12.0)
    assert (
        summarize([_record(0, "bulk", REJECTED)], 60.0)["classes"]["bulk"][
            "output_tokens_per_busy_s"
        ]
        is None
    )
    slower = summarize([_record(0, "bulk", OK, e2e_s=10.0, output_tokens=60)], 60.0)
    faster = summarize(records, 60.0)
    ratios = headline_ratios(slower, None, faster)
    assert ratios["bulk_busy_tokens_per_s_ratio"] == pytest.approx(6.0 / 12.0)
