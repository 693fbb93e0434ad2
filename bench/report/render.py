"""Markdown reports of a run (``render_report``) and of several policies (``render_comparison``).

Latencies are shown in milliseconds, rates as percentages, ``-`` where nothing was measured.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from bench.load.records import OUTCOMES

__all__ = ["render_comparison", "render_report", "table"]

_TIMELINE_PNG = "kv_usage_and_queue_depth.png"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _get(block: Mapping[str, Any] | None, *keys: str) -> Any:
    node: Any = block
    for key in keys:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def _ms(value: Any) -> str:
    return "-" if value is None else f"{1000 * float(value):.1f}"


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * float(value):.2f}%"


def _num(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{float(value):.{digits}f}"


def _ratio(value: Any) -> str:
    return "-" if value is None else f"{float(value):.2f}×"


def _blocks(summary: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    blocks = list(summary.get("classes", {}).items())
    if "overall" in summary:
        blocks.append(("overall", summary["overall"]))
    return blocks


def _outcome_table(summary: Mapping[str, Any]) -> str:
    rows = [
        [name, str(block.get("count", 0))]
        + [str(_get(block, "outcomes", outcome) or 0) for outcome in OUTCOMES]
        for name, block in _blocks(summary)
    ]
    return table(["class", "requests", *OUTCOMES], rows)


def _latency_table(summary: Mapping[str, Any]) -> str:
    header = [
        "class",
        "TTFT p50 (ms)",
        "TTFT p90 (ms)",
        "TTFT p99 (ms)",
        "ITL p50 (ms)",
        "ITL p99 (ms)",
        "E2E p50 (ms)",
        "E2E p99 (ms)",
        "queue p50 (ms)",
        "queue p99 (ms)",
    ]
    rows = [
        [
            name,
            _ms(_get(block, "ttft_s", "p50")),
            _ms(_get(block, "ttft_s", "p90")),
            _ms(_get(block, "ttft_s", "p99")),
            _ms(_get(block, "itl_s", "p50")),
            _ms(_get(block, "itl_s", "p99")),
            _ms(_get(block, "e2e_s", "p50")),
            _ms(_get(block, "e2e_s", "p99")),
            _ms(_get(block, "queue_delay_s", "p50")),
            _ms(_get(block, "queue_delay_s", "p99")),
        ]
        for name, block in _blocks(summary)
    ]
    return table(header, rows)


def _rate_table(summary: Mapping[str, Any]) -> str:
    header = ["class", "output tokens/s", "rejection", "expiry", "cancel", "completed"]
    rows = [
        [
            name,
            _num(block.get("output_tokens_per_s")),
            _pct(block.get("rejection_rate")),
            _pct(block.get("expiry_rate")),
            _pct(block.get("cancel_rate")),
            _pct(block.get("ok_rate")),
        ]
        for name, block in _blocks(summary)
    ]
    return table(header, rows)


def _config_section(runtime_config: Mapping[str, Any]) -> str:
    facts = [
        ("git revision", runtime_config.get("git_revision")),
        ("hardware", runtime_config.get("hardware")),
        ("versions", runtime_config.get("versions")),
    ]
    bullets = [
        f"- **{name}**: `{json.dumps(value, default=str)}`" for name, value in facts if value
    ]
    # The whole configuration travels with the report: a number without it cannot be trusted.
    dump = json.dumps(runtime_config, indent=2, sort_keys=True, default=str)
    return "\n".join([*bullets, "", "```json", dump, "```"])


def render_report(
    title: str,
    summary: Mapping[str, Any],
    runtime_config: Mapping[str, Any],
    extra_tables: Mapping[str, str] | None = None,
) -> str:
    """One run: outcome, latency and rate tables per class, the timeline plot, the configuration.

    ``extra_tables`` maps a section heading to Markdown (e.g. ``render_comparison``'s output).
    """
    duration = summary.get("duration_s")
    parts = [
        f"# {title}",
        "",
        f"Run length: {_num(duration)} s. Percentiles by the nearest-rank method over OK "
        "requests; ITL pools every gap of every OK stream.",
        "",
        "## Outcomes",
        "",
        _outcome_table(summary),
        "",
        "## Latency",
        "",
        _latency_table(summary),
        "",
        "## Throughput and rates",
        "",
        _rate_table(summary),
        "",
        "## KV usage and queue depth",
        "",
        f"![KV usage and queue depth]({_TIMELINE_PNG})",
        "",
    ]
    for heading, body in (extra_tables or {}).items():
        parts += [f"## {heading}", "", body, ""]
    parts += ["## Runtime configuration", "", _config_section(runtime_config), ""]
    return "\n".join(parts)


def _goodput_bounds(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The per-class goodput bounds the rows were counted with ({} when none)."""
    for row in rows:
        goodput = row["summary"].get("goodput") or {}
        bounds = {
            name: block["bounds_s"] for name, block in goodput.items() if block.get("bounds_s")
        }
        if bounds:
            return bounds
    return {}


def render_comparison(rows: Sequence[Mapping[str, Any]]) -> str:
    """Several policies side by side.

    Each row: ``{"policy": str, "summary": summarize(...), "ratios": headline_ratios(...) or
    None}``; the summary may carry ``"goodput"`` (``bench.report.summary.goodput``). Gives one line
    per policy and class, then the headline ratios per policy.
    """
    header = [
        "policy",
        "class",
        "TTFT p50 (ms)",
        "TTFT p99 (ms)",
        "ITL p99 (ms)",
        "E2E p99 (ms)",
        "output tokens/s",
        "rejection",
        "expiry",
        "goodput (req/s)",
        "good",
    ]
    lines = []
    for row in rows:
        goodput = row["summary"].get("goodput") or {}
        for name, block in row["summary"].get("classes", {}).items():
            good = goodput.get(name) or {}
            lines.append(
                [
                    str(row["policy"]),
                    name,
                    _ms(_get(block, "ttft_s", "p50")),
                    _ms(_get(block, "ttft_s", "p99")),
                    _ms(_get(block, "itl_s", "p99")),
                    _ms(_get(block, "e2e_s", "p99")),
                    _num(block.get("output_tokens_per_s")),
                    _pct(block.get("rejection_rate")),
                    _pct(block.get("expiry_rate")),
                    _num(good.get("goodput_per_s"), 2),
                    _pct(good.get("good_fraction")),
                ]
            )
    ratio_header = [
        "policy",
        "chat TTFT p99, mixed / chat alone",
        "chat ITL p99, mixed / chat alone",
        "bulk tokens/s, mixed / bulk alone",
    ]
    ratio_rows = [
        [
            str(row["policy"]),
            _ratio(_get(row.get("ratios"), "interactive_ttft_p99_ratio")),
            _ratio(_get(row.get("ratios"), "interactive_itl_p99_ratio")),
            _ratio(_get(row.get("ratios"), "bulk_tokens_per_s_ratio")),
        ]
        for row in rows
    ]
    parts = [table(header, lines)]
    bounds = _goodput_bounds(rows)
    if bounds:
        parts.append(
            "Goodput: requests per second whose own TTFT and mean ITL met the SLO's bounds "
            f"(`{json.dumps(bounds, sort_keys=True)}`, seconds; a class without bounds counts "
            "its completed requests); good: their share of the class's requests."
        )
    return "\n\n".join([*parts, "Headline ratios:", table(ratio_header, ratio_rows)])
