"""The arithmetic of `bench compare --repeats` (bench/live/repeats.py): element-wise medians
over repeats, ratios to a peer paired within each repeat, and the rotated policy order."""

from __future__ import annotations

from typing import Any

import pytest

from bench.live.repeats import median_tree, paired_ratios, rotated


def _row(policy: str, ttft_p99: float | None, itl_p99: float, bulk_tps: float) -> dict[str, Any]:
    return {
        "policy": policy,
        "summary": {
            "classes": {
                "interactive": {"ttft_s": {"p99": ttft_p99}, "itl_s": {"p99": itl_p99}},
                "bulk": {"output_tokens_per_s": bulk_tps},
            }
        },
    }


def test_median_tree_takes_each_numbers_median_and_keeps_the_rest() -> None:
    trees = [
        {"a": 1, "b": {"c": 10.0, "name": "x"}, "d": [1, 5], "e": None, "f": True},
        {"a": 3, "b": {"c": 30.0, "name": "y"}, "d": [2, 6], "e": 4.0, "f": False},
        {"a": 2, "b": {"c": 20.0, "name": "z"}, "d": [3, 7], "e": None},
    ]
    assert median_tree(trees) == {
        "a": 2,
        "b": {"c": 20.0, "name": "x"},
        "d": [2, 6],
        "e": 4.0,  # the median of the repeats that measured it
        "f": True,  # not a number: the first repeat's
    }
    with pytest.raises(ValueError):
        median_tree([])


def test_paired_ratios_divide_inside_each_repeat_then_take_the_median() -> None:
    repeats = [
        [_row("peer", 0.6, 0.05, 800.0), _row("ours", 0.15, 0.04, 600.0)],
        # A slow machine this time: both sides slower, the pair's ratio barely moves.
        [_row("peer", 1.2, 0.10, 400.0), _row("ours", 0.36, 0.09, 320.0)],
        [_row("peer", 0.8, 0.08, 500.0), _row("ours", None, 0.04, 450.0)],
    ]
    paired = paired_ratios(repeats, "peer")
    assert set(paired) == {"ours"}
    ttft = paired["ours"]["chat_ttft_p99"]
    assert ttft["per_repeat"] == [0.25, 0.3, None] and ttft["median"] == pytest.approx(0.275)
    assert paired["ours"]["chat_itl_p99"]["median"] == pytest.approx(0.8)
    bulk = paired["ours"]["bulk_output_tokens_per_s"]
    assert bulk["per_repeat"] == [0.75, 0.8, 0.9] and bulk["median"] == pytest.approx(0.8)


def test_each_repeat_starts_the_policy_order_one_later() -> None:
    policies = ["a", "b", "c"]
    assert [rotated(policies, r) for r in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]
    assert rotated([], 3) == []
