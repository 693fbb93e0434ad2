"""Smoke test of `mixgate bench gateway` with tiny numbers: every JSON field present, positive."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mixgate.cli import main

pytestmark = pytest.mark.redis

PERCENTILE_FIELDS = (
    "admit_ms",
    "claim_ms",
    "ttft_gateway_ms",
    "ttft_engine_ms",
    "gateway_added_ms",
)


def test_bench_gateway_writes_every_field(redis_server: str, tmp_path: Path) -> None:
    out = tmp_path / "gateway.json"
    argv = ["bench", "gateway", "--redis-url", redis_server, "--admissions", "50"]
    argv += ["--concurrency", "8", "--chats", "5", "--json", str(out)]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["admissions_per_s"] > 0
    assert result["round_trips_per_s"] > 0
    for name in PERCENTILE_FIELDS:
        assert set(result[name]) == {"p50", "p99"}, name
        assert result[name]["p50"] > 0, name
        assert result[name]["p99"] > 0, name
    config = result["config"]
    assert (config["admissions"], config["concurrency"], config["chats"]) == (50, 8, 5)
    assert config["chats_timed_gateway"] > 0
    assert config["chats_timed_engine"] > 0
