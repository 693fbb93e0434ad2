"""`mixgate bench soak` for a few seconds against a real server and Redis: it drives chats and
jobs with cancellations, and at the end every KV block is free, the engine is idle and the
server has no more asyncio tasks than before the load. (Memory flatness needs minutes: the
command reports it; a test this short does not judge it.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mixgate.cli import main

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def test_short_soak_ends_with_kv_free_and_no_task_leak(
    tiny_model_dir: Path, redis_server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "soak.json"
    args = ["bench", "soak", "--minutes", "0.1", "--model", str(tiny_model_dir)]
    args += ["--redis-url", redis_server, "--sample-s", "0.5", "--json", str(out)]
    main(args)
    report = json.loads(out.read_text())
    verdict = report["verdict"]
    assert verdict["kv_blocks_free"] and verdict["engine_idle"], report["final"]
    assert verdict["no_task_leak"], (verdict["idle_tasks"], verdict["final_tasks"])
    requests = report["requests"]
    assert sum(requests.values()) >= 10
    assert any(key.endswith(":cancelled") for key in requests), requests
    assert len(report["samples"]) >= 3
    assert max(s["asyncio_tasks"] for s in report["samples"]) > verdict["idle_tasks"]
    assert "verdict:" in capsys.readouterr().out
