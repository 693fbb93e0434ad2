"""Medians over repeated comparisons, and each policy's ratio to a peer paired inside a repeat.

Why: on this project's shared 2-vCPU machines the same `compare --workload mixed --policies
mixgate` run four times in a row on the same code gave bulk 427-629 output tokens/s and chat
TTFT p99 113-377 ms. One run decides nothing at that spread; `bench compare --repeats N` runs
the whole comparison N times (the policy order rotated each time, so that a drift in the
machine's speed does not always land on the same policy) and reports, per policy, the median
of every number across repeats, plus each policy's ratio to a peer policy computed *within*
each repeat and then taken at the median (paired: both sides of a ratio saw the same minutes of
the machine).

Pure: no I/O.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["PAIRED_METRICS", "median_tree", "paired_ratios", "rotated"]

# (name, class, path inside a class's summary block): the headline numbers a peer ratio is
# taken of, per repeat.
PAIRED_METRICS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("chat_ttft_p99", "interactive", ("ttft_s", "p99")),
    ("chat_itl_p99", "interactive", ("itl_s", "p99")),
    ("bulk_output_tokens_per_s", "bulk", ("output_tokens_per_s",)),
)


def rotated(policies: Sequence[str], repeat: int) -> list[str]:
    """The policies in the order repeat `repeat` runs them (each repeat starts one later)."""
    if not policies:
        return []
    shift = repeat % len(policies)
    return [*policies[shift:], *policies[:shift]]


def median_tree(trees: Sequence[Any]) -> Any:
    """The element-wise median of same-shaped JSON trees: numbers become their median (None
    where every tree has None), dicts and lists recurse, anything else keeps the first value.
    A key missing from some trees takes the median of the trees that have it."""
    if not trees:
        raise ValueError("no trees to take a median of")
    first = trees[0]
    if isinstance(first, bool) or first is None or isinstance(first, (int, float)):
        numbers = [t for t in trees if isinstance(t, (int, float)) and not isinstance(t, bool)]
        if not numbers:
            return first
        return statistics.median(numbers)
    if isinstance(first, Mapping):
        keys: dict[str, None] = {}
        for tree in trees:
            if isinstance(tree, Mapping):
                keys.update(dict.fromkeys(tree))
        return {
            key: median_tree([t[key] for t in trees if isinstance(t, Mapping) and key in t])
            for key in keys
        }
    if isinstance(first, list) and all(isinstance(t, list) and len(t) == len(first) for t in trees):
        return [median_tree([t[i] for t in trees]) for i in range(len(first))]
    return first


def _metric(row: Mapping[str, Any], request_class: str, path: tuple[str, ...]) -> float | None:
    value: Any = row.get("summary", {}).get("classes", {}).get(request_class, {})
    for step in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(step)
    return float(value) if isinstance(value, (int, float)) else None


def paired_ratios(
    repeats: Sequence[Sequence[Mapping[str, Any]]], peer: str
) -> dict[str, dict[str, Any]]:
    """Per policy other than `peer`: each PAIRED_METRICS ratio (policy / peer) per repeat, and
    their median. `repeats`: the rows of each repeat (one row per policy)."""
    out: dict[str, dict[str, Any]] = {}
    for rows in repeats:
        by_policy = {row["policy"]: row for row in rows}
        if peer not in by_policy:
            continue
        for policy, row in by_policy.items():
            if policy == peer:
                continue
            fresh: dict[str, dict[str, Any]] = {
                name: {"per_repeat": []} for name, *_ in PAIRED_METRICS
            }
            entry = out.setdefault(policy, fresh)
            for name, request_class, path in PAIRED_METRICS:
                mine = _metric(row, request_class, path)
                theirs = _metric(by_policy[peer], request_class, path)
                ratio = None if mine is None or not theirs else mine / theirs
                entry[name]["per_repeat"].append(ratio)
    for entry in out.values():
        for block in entry.values():
            known = [r for r in block["per_repeat"] if r is not None]
            block["median"] = statistics.median(known) if known else None
    return out
