"""Bulk claim pacing on a live `mixgate serve` (tiny preset, real redis-server): the setting
MIXGATE_MAX_UNSTARTED_BULK_JOBS, and what /metrics shows of it.

With the engine process paused (SIGSTOP) no bulk job makes a token, so the replica holds
exactly as many bulk jobs as the setting lets it hold unstarted and the rest stay queued in
Redis; 0 turns pacing off and the jobs fill the bulk slots. /metrics shows the work the held
jobs have still to run (what bulk admission counts ahead of a new job). Once the engine runs
again every job completes and nothing is left unstarted or in flight.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.live.processes import ServerProcess
from tests.child_processes import engine_child

pytestmark = [pytest.mark.redis, pytest.mark.slow]

JOBS = 6
MAX_TOKENS = 4
WAIT_S = 60.0


def local_state(server: ServerProcess) -> dict[str, float]:
    """The bulk queue's depth, the replica's local bulk jobs and its unstarted ones."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    state: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            bulk = sample.labels.get("class") == "bulk"
            if sample.name == "mixgate_queue_depth" and bulk:
                state["queued"] = sample.value
            elif sample.name == "mixgate_dispatch_local_jobs" and bulk:
                state["local"] = sample.value
            elif sample.name == "mixgate_dispatch_unstarted_bulk_jobs":
                state["unstarted"] = sample.value
            elif sample.name == "mixgate_dispatch_work_in_flight_tokens" and bulk:
                state[f"{sample.labels['kind']}_tokens"] = sample.value
    return state


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.parametrize(("setting", "held"), [("2", 2), ("0", JOBS)])
def test_a_replica_holds_as_many_unstarted_bulk_jobs_as_the_setting_allows(
    tiny_model_dir: Path, redis_server: str, tmp_path: Path, setting: str, held: int
) -> None:
    server = ServerProcess(
        tiny_model_dir,
        redis_server,
        f"{{mg-{uuid.uuid4().hex[:8]}}}:",
        tmp_path / "data",
        extra_env={"MIXGATE_MAX_UNSTARTED_BULK_JOBS": setting},
    ).start()
    try:
        assert server.process is not None
        engine = engine_child(server.process.pid)
        with httpx.Client(base_url=server.url, timeout=30) as client:
            model = client.get("/v1/models").json()["data"][0]["id"]
            os.kill(engine, signal.SIGSTOP)
            try:
                ids = []
                for i in range(JOBS):
                    body = {"model": model, "messages": [{"role": "user", "content": f"doc {i}"}],
                            "max_tokens": MAX_TOKENS, "ignore_eos": True}  # fmt: skip
                    response = client.post("/v1/jobs", json=body)
                    assert response.status_code == 202, response.text
                    ids.append(response.json()["id"])
                # Every job is accounted for: queued in Redis or held here, none running yet.
                wait_for(
                    lambda: (
                        (s := local_state(server)).get("queued", -1) + s.get("local", -1) == JOBS
                        and s["local"] == held
                    ),
                    f"{held} bulk jobs held and {JOBS - held} queued",
                )
                state = local_state(server)
                assert state["unstarted"] == held
                assert state["queued"] == JOBS - held
                held_state = state
            finally:
                os.kill(engine, signal.SIGCONT)
            for job_id in ids:
                wait_for(
                    lambda job_id=job_id: (
                        client.get(f"/v1/jobs/{job_id}").json()["status"] == "completed"
                    ),
                    f"job {job_id} to complete",
                )
            # What admission counted ahead of a new bulk job while they were held: each held
            # job's whole prompt (none had a token) and its max_tokens. Every prompt has the
            # same length ("doc 0".."doc 5" in one template): read it off a result's usage.
            usage = client.get(f"/v1/jobs/{ids[0]}").json()["response"]["usage"]
            assert held_state["prompt_tokens"] == held * usage["prompt_tokens"]
            assert held_state["output_tokens"] == held * MAX_TOKENS
            # (The queue depth is the health watcher's reading, refreshed twice a second.)
            nothing = {"queued": 0, "local": 0, "unstarted": 0}
            nothing |= {"prompt_tokens": 0, "output_tokens": 0}
            wait_for(lambda: local_state(server) == nothing, "nothing queued, held or unstarted")
    finally:
        assert server.stop() == 0, server.logs()
