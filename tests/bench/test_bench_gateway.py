"""Smoke test of `mixgate bench gateway` with tiny numbers: every JSON field present; measured
times positive, and the gateway-added figures exactly the differences they are said to be."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mixgate.cli import main

pytestmark = [pytest.mark.redis, pytest.mark.slow]

PERCENTILE_FIELDS = (
    "admit_ms",
    "claim_ms",
    "ttft_gateway_ms",
    "ttft_gateway_httpx_ms",
    "ttft_engine_ms",
)
# Differences of two measured percentiles: with five chats on a loaded machine the gateway's
# p99 can come out below the direct engine's (seen: -5.3 ms), so only their arithmetic is checked.
DIFFERENCE_FIELDS = {
    "gateway_added_ms": "ttft_gateway_ms",
    "gateway_added_httpx_ms": "ttft_gateway_httpx_ms",
}


def test_bench_gateway_writes_every_field(redis_server: str, tmp_path: Path) -> None:
    out = tmp_path / "gateway.json"
    argv = ["bench", "gateway", "--redis-url", redis_server, "--admissions", "50"]
    argv += ["--concurrency", "8", "--chats", "5", "--json", str(out)]
    argv += ["--submissions", "40", "--polls", "80", "--connections", "4", "--command-chats", "2"]
    argv += ["--command-idle-s", "1", "--rounds", "3"]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["admissions_per_s"] > 0
    assert result["round_trips_per_s"] > 0
    # Every submission accepted (202) and every poll answered (200), in each of 3 rounds: the
    # rates count 2xx only.
    assert result["http"]["submission_statuses"] == {"202": 120}
    assert result["http"]["poll_statuses"] == {"200": 240}
    # Each rate is the median of its rounds (three rounds: the middle one).
    for name in ("admissions_per_s", "round_trips_per_s", "job_submissions_per_s"):
        rounds = result["rounds"][name]
        assert len(rounds) == 3 and result[name] == sorted(rounds)[1], name
    assert result["job_submissions_per_s"] > 0
    assert result["job_polls_per_s"] > 0
    # A streamed chat costs Redis at least its admit, claim and completion.
    assert result["redis_commands_per_chat"] >= 3
    assert result["redis_commands"]["chats"] == 2
    for name in PERCENTILE_FIELDS:
        assert set(result[name]) == {"p50", "p99"}, name
        assert result[name]["p50"] > 0, name
        assert result[name]["p99"] > 0, name
    # Per-chat differences (gateway minus direct, same prompt): any sign, both percentiles.
    assert set(result["gateway_added_per_chat_ms"]) == {"p50", "p99"}
    for name, through_gateway in DIFFERENCE_FIELDS.items():
        for q in ("p50", "p99"):
            expected = result[through_gateway][q] - result["ttft_engine_ms"][q]
            assert result[name][q] == pytest.approx(expected), (name, q)
    config = result["config"]
    assert (config["admissions"], config["concurrency"], config["chats"]) == (50, 8, 5)
    # Timed chats leave out the warm-up ones and any with no visible text on a path.
    assert 0 < config["chats_timed"] <= 5


def test_more_submissions_than_the_bulk_queue_holds_are_refused_up_front() -> None:
    # Past the default envelope's bulk bound the last rounds' posts would come back 429.
    with pytest.raises(SystemExit, match="the bulk queue bound"):
        main(["bench", "gateway", "--rounds", "4", "--submissions", "3000"])
