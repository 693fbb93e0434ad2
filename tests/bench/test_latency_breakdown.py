"""`mixgate bench breakdown`: a few seconds on the tiny preset against a real redis-server and
a real `mixgate serve`; the JSON's structure, and parts that add up to their totals. No speed
verdicts: the numbers themselves depend on this machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gateway.breakdown_shares import ChatTimes, RunCounters, breakdown, split_total
from bench.load.records import read_records
from mixgate.cli import main

TINY_WORKLOAD = """
name = "tiny-chat-over-backlog"
description = "a few seconds of chat over a small bulk backlog"
duration_s = 3
seed = 5

[interactive]
arrival = { kind = "poisson", rate_per_s = 3.0 }
prompt_tokens = { kind = "uniform", min = 24, max = 48 }
output_tokens = { kind = "fixed", value = 6 }

[bulk]
arrival = { kind = "backlog", count = 4 }
prompt_tokens = { kind = "uniform", min = 48, max = 96 }
output_tokens = { kind = "fixed", value = 8 }
"""


def _adds_up(block: dict[str, object]) -> None:
    total = block["total"]
    parts = block["parts"]
    shares = block["shares"]
    assert isinstance(total, float) and isinstance(parts, dict) and isinstance(shares, dict)
    assert all(v >= 0 for v in parts.values())
    assert sum(parts.values()) == pytest.approx(total, rel=1e-9, abs=1e-12)
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-9)


@pytest.mark.slow
@pytest.mark.redis
def test_breakdown_writes_parts_that_add_up(
    tiny_model_dir: Path, redis_server: str, tmp_path: Path
) -> None:
    workload = tmp_path / "tiny.toml"
    workload.write_text(TINY_WORKLOAD)
    out = tmp_path / "out"
    code = main(
        [
            "bench",
            "breakdown",
            "--workload",
            str(workload),
            "--out",
            str(out),
            "--model",
            str(tiny_model_dir),
            "--redis-url",
            redis_server,
            "--threads",
            "1",
            "--drain-s",
            "20",
        ]
    )
    assert code == 0
    report = json.loads((out / "breakdown.json").read_text())
    assert report["chats"] > 0
    assert report["chats_with_server_timings"] == report["chats"]
    assert report["chats_with_text_timings"] == report["chats"]
    _adds_up(report["ttft_s"])
    assert set(report["ttft_s"]["parts"]) == {
        "queueing",
        "engine",
        "first_text",
        "redis",
        "event_loop_lag",
        "other_gateway",
    }
    _adds_up(report["itl_s"])
    assert set(report["itl_s"]["parts"]) == {
        "engine_step",
        "redis",
        "event_loop_lag",
        "other_gateway",
    }
    # The server counters moved over the run: Redis commands, loop-lag probes, engine steps
    # with both classes' tokens in them.
    assert report["redis"]["calls"] > 0 and report["redis"]["by_command"]
    assert report["event_loop"]["probes"] > 0
    engine = report["engine"]
    assert engine["steps"] > 0
    assert {"interactive/prefill", "bulk/prefill"} <= set(engine["by_class_kind"])
    shares = [b["time_share"] for b in engine["by_class_kind"].values()]
    assert sum(shares) == pytest.approx(1.0, abs=1e-6)
    # Admission's prediction came back for every admitted chat and job.
    predicted = report["predicted_vs_measured_ttft"]
    assert predicted["interactive"]["count"] == report["chats"]
    assert predicted["bulk"]["count"] > 0
    assert predicted["interactive"]["predicted_mean_s"] > 0
    # The chats went from their own process; what the server said came back on their records.
    assert report["chats_with_server_timings"] == report["chats"]
    records = read_records(out / "run" / "requests.jsonl")
    chats = [r for r in records if r.request_class == "interactive" and r.outcome == "ok"]
    assert chats and all(r.server_ttft_s is not None and r.server_ttft_s > 0 for r in chats)
    assert all(r.server_ttft_s is not None and r.server_ttft_s <= r.ttft_s for r in chats)
    # The step trace read every step of the run (the /metrics count, seen or not between
    # scrapes), and each slow chat is laid against the steps it waited on: they end after its
    # hand-off and by its first token, and one of them ran its prompt.
    assert engine["steps_traced"] == engine["steps"] + engine["steps_unseen"]
    assert engine["steps_missed_by_trace"] == 0
    assert all(r.server_handed_at_s is not None for r in chats)
    for chat in report["slowest_chats"]:
        steps = chat["steps"]
        assert steps, chat
        for step in steps:
            ended_s = chat["handed_at_s"] + step["offset_s"] + step["duration_s"]
            assert chat["handed_at_s"] < ended_s <= chat["first_token_at_s"] + 1e-4
        assert any("prefill" in step["tokens"].get("interactive", {}) for step in steps)


def _counters(**overrides: object) -> RunCounters:
    values: dict[str, object] = {
        "duration_s": 10.0,
        "requests": 4,
        "redis_by_command": {"xadd": (100, 2_000.0), "evalsha": (100, 8_000.0)},
        "loop_lag_sum_s": 0.5,
        "loop_lag_count": 100,
        "engine_steps": 50,
        "engine_step_s": 5.0,
        "engine_by_class_kind": {("interactive", "decode"): (60.0, 1.0)},
    }
    values.update(overrides)
    return RunCounters(**values)  # type: ignore[arg-type]


def test_ttft_parts_worked_by_hand() -> None:
    # One chat: client TTFT 0.5 s; server TTFT 0.3 s of which 0.1 s queueing. The 0.2 s left:
    # Redis 8000 µs of non-stream commands over 4 requests (2 ms) + 2000 µs of XADD over the
    # chat's 3 deltas (0.667 ms); loop lag 2 x 5 ms = 10 ms; the rest other_gateway.
    chat = ChatTimes(0.5, (0.2, 0.2), server_ttft_s=0.3, server_queue_s=0.1, predicted_ttft_s=0.4)
    report = breakdown([chat], _counters())
    parts = report["ttft_s"]["parts"]
    assert parts["queueing"] == pytest.approx(0.1)
    assert parts["engine"] == pytest.approx(0.2)
    assert parts["first_text"] == 0.0  # the server did not report its first text
    assert parts["redis"] == pytest.approx(0.002 + 0.002 / 3)
    assert parts["event_loop_lag"] == pytest.approx(0.01)
    assert parts["other_gateway"] == pytest.approx(0.2 - 0.01 - 0.002 - 0.002 / 3)
    # ITL 0.2 s: the mean step (0.1 s), a delta's XADD share, lag 10 ms, the rest.
    itl = report["itl_s"]["parts"]
    assert itl["engine_step"] == pytest.approx(0.1)
    assert itl["redis"] == pytest.approx(0.002 / 3)
    assert itl["other_gateway"] == pytest.approx(0.2 - 0.1 - 0.002 / 3 - 0.01)
    pairs = report["predicted_vs_measured_ttft"]["interactive"]
    assert (pairs["count"], pairs["under_predicted"]) == (1, 0)
    assert report["redis"]["calls_per_request"] == pytest.approx(50.0)


def test_the_wait_for_the_first_text_is_its_own_part() -> None:
    # The same chat, its first token sampled at 0.3 s but with text only at 0.38 s: those
    # 80 ms leave other_gateway for first_text, and the parts still add up to 0.5 s.
    chat = ChatTimes(0.5, (0.2,), server_ttft_s=0.3, server_queue_s=0.1, server_text_ttft_s=0.38)
    report = breakdown([chat], _counters())
    parts = report["ttft_s"]["parts"]
    assert (parts["engine"], parts["first_text"]) == pytest.approx((0.2, 0.08))
    assert parts["other_gateway"] == pytest.approx(0.12 - 0.01 - 0.002 - 0.002 / 2)
    assert sum(parts.values()) == pytest.approx(0.5)
    assert report["chats_with_text_timings"] == 1


def test_the_slowest_chats_are_listed_with_what_each_waited_for() -> None:
    # A p99 over ~60 chats is its slowest one or two: each is listed, slowest first, with its
    # own server parts and when it was sent (the first chat of a phase can meet a lull step).
    chats = [
        ChatTimes(0.05 + i / 1000, (), server_ttft_s=0.03, server_queue_s=0.01,
                  request_id=f"c{i}", sent_s=float(i))
        for i in range(8)
    ]  # fmt: skip
    slow = ChatTimes(0.13, (), server_ttft_s=0.12, server_queue_s=0.09, request_id="first",
                     sent_s=0.26)  # fmt: skip
    report = breakdown([*chats, slow], _counters())
    listed = report["slowest_chats"]
    assert [c["request_id"] for c in listed] == ["first", "c7", "c6", "c5", "c4"]
    first = listed[0]
    assert first["sent_s"] == 0.26
    assert (first["ttft_s"], first["queueing_s"], first["engine_s"]) == pytest.approx(
        (0.13, 0.09, 0.03)
    )
    assert first["gateway_s"] == pytest.approx(0.01)


def test_queueing_splits_into_dispatch_accept_and_engine_queue() -> None:
    # 90 ms queued: 30 ms to the engine, 20 ms into its core, so 40 ms in its scheduler. A
    # chat whose server reported no split has None parts and is left out of the means.
    split = ChatTimes(0.2, (), server_ttft_s=0.15, server_queue_s=0.09,
                      server_dispatch_s=0.03, server_accept_s=0.02, request_id="split")  # fmt: skip
    unsplit = ChatTimes(0.1, (), server_ttft_s=0.05, server_queue_s=0.01, request_id="plain")
    # A dispatch past queue_s (a clock edge) is clamped to it: the parts still sum to queue_s.
    edge = ChatTimes(0.05, (), server_ttft_s=0.02, server_queue_s=0.01,
                     server_dispatch_s=0.015, server_accept_s=0.001, request_id="edge")  # fmt: skip
    report = breakdown([split, unsplit, edge], _counters())
    listed = {chat["request_id"]: chat for chat in report["slowest_chats"]}
    first = listed["split"]
    assert (first["dispatch_s"], first["accept_s"], first["engine_queue_s"]) == pytest.approx(
        (0.03, 0.02, 0.04)
    )
    assert listed["plain"]["dispatch_s"] is None and listed["plain"]["engine_queue_s"] is None
    assert (listed["edge"]["dispatch_s"], listed["edge"]["accept_s"]) == pytest.approx((0.01, 0))
    assert listed["edge"]["engine_queue_s"] == pytest.approx(0.0)
    means = report["queueing_split_s"]
    assert means == pytest.approx({"dispatch": 0.02, "accept": 0.01, "engine_queue": 0.02})


def test_named_parts_larger_than_the_total_are_scaled_down_to_it() -> None:
    parts = split_total(0.01, {"a": 0.02, "b": 0.02})
    assert parts == pytest.approx({"a": 0.005, "b": 0.005, "other_gateway": 0.0})
    assert sum(split_total(1.0, {"a": 0.25}).values()) == pytest.approx(1.0)
