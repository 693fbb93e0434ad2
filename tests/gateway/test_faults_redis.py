"""Redis faults with real processes: Redis stopped (unreachable) and Redis SIGKILLed and
restarted from its AOF (`appendfsync always`) on the same port and folder, under a real
`mixgate serve`."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.live.processes import ServerProcess, start_redis, stop_process
from tests.dependencies import missing_dependency
from tests.replica_cluster import (
    cluster_prefix,
    ledger,
    metric,
    model_name,
    redis_client,
    replica,
    submit_jobs,
    wait_terminal,
)

pytestmark = [pytest.mark.redis, pytest.mark.slow]


class DurableRedis:
    """A redis-server with AOF that can be stopped and started again on its port and folder."""

    def __init__(self, folder: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            missing_dependency("redis-server is not on PATH (apt-get install -y redis-server)")
        self.binary, self.folder = binary, folder
        self.process, self.port = start_redis(binary, folder, durable=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self, kill: bool) -> None:
        if kill:
            self.process.kill()
            self.process.wait(10)
        else:
            stop_process(self.process)

    def restart(self) -> None:
        self.process, _ = start_redis(self.binary, self.folder, port=self.port, durable=True)


@pytest.fixture(scope="module")
def redis_proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DurableRedis]:
    server = DurableRedis(tmp_path_factory.mktemp("aof-redis"))
    yield server
    server.stop(kill=False)


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, redis_proc: DurableRedis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, str]]:
    prefix = cluster_prefix()
    tmp = tmp_path_factory.mktemp("redis-faults")
    # A lease longer than the outages here: work that finishes while Redis is away still holds
    # its lease when Redis returns, so its own result is written (attempts stay 1).
    proc = replica(tiny_model_dir, redis_proc.url, prefix, tmp, "R", MIXGATE_LEASE_S="10")
    proc.start()
    yield proc, prefix
    if redis_proc.process.poll() is not None:
        redis_proc.restart()  # a failed test left it down: let the server drain normally
    assert proc.stop() == 0, proc.logs()


def wait_ready(server: ServerProcess, ready: bool, timeout_s: float = 15.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        response = httpx.get(server.url + "/readyz", timeout=2)
        if (response.status_code == 200) == ready:
            body: dict[str, Any] = response.json()
            return body
        assert time.monotonic() < deadline, f"/readyz never became {ready}: {response.text}"
        time.sleep(0.02)


def refused_at_once(server: ServerProcess, model: str, job_id: str, count: int) -> None:
    """Send `count` requests of every kind while the gateway knows Redis is down: each must be
    the flag's answer (503 `redis_unavailable`, Retry-After 1), not a wait on a socket that
    ends in a timeout or a 500. The client's bound is generous: a hang fails, speed does not
    (how fast the answer comes is for a benchmark)."""
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    calls = [
        ("POST", "/v1/chat/completions", chat),
        ("POST", "/v1/jobs", chat),
        ("GET", f"/v1/jobs/{job_id}", None),
        ("GET", "/v1/jobs", None),
        ("DELETE", f"/v1/jobs/{job_id}", None),
    ]
    with httpx.Client(base_url=server.url, timeout=30.0) as client:
        for i in range(count):
            method, path, body = calls[i % len(calls)]
            response = client.request(method, path, json=body)
            assert response.status_code == 503, (method, path, response.text)
            error = response.json()["error"]
            assert set(error) == {"message", "type", "code", "param"}
            assert (error["type"], error["code"]) == ("service_unavailable", "redis_unavailable")
            assert response.headers["retry-after"] == "1", (method, path)


def test_redis_unreachable_is_refused_with_503_and_in_flight_work_lands_when_it_returns(
    server: tuple[ServerProcess, str], redis_proc: DurableRedis
) -> None:
    proc, prefix = server
    model = model_name(proc)
    jobs = submit_jobs(proc, model, 3, 400, "outage")
    client = redis_client(redis_proc.url)
    deadline = time.monotonic() + 30
    while metric(proc, "mixgate_engine_running") < 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    client.close()
    outage_started_ms = int(time.time() * 1000)
    redis_proc.stop(kill=False)
    assert "redis unreachable" in wait_ready(proc, ready=False)["reasons"]
    refused_at_once(proc, model, jobs[0], 20)
    # The engine keeps going without Redis: its work ends there, and waits to be written.
    deadline = time.monotonic() + 60
    while metric(proc, "mixgate_engine_running") > 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    redis_proc.restart()
    wait_ready(proc, ready=True, timeout_s=60.0)
    client = redis_client(redis_proc.url)
    try:
        done = wait_terminal(client, prefix, jobs, 60)
        assert {f["status"] for f in done.values()} == {"completed"}, proc.logs()
        assert {f["attempts"] for f in done.values()} == {"1"}
        assert ledger(client, prefix, jobs) == ({"completed": len(jobs)}, [])
        # At least one job met the outage: its result was written after Redis went down (it
        # could only be written once Redis was back), by the attempt that was running then.
        finished_ms = [int(f["finished_ms"]) for f in done.values()]
        assert max(finished_ms) >= outage_started_ms, (finished_ms, outage_started_ms)
    finally:
        client.close()


class Submitter(threading.Thread):
    """Submits jobs until told to stop; keeps the ids of the accepted ones (202) and counts
    the 503s. NOTE: no assert here: one would only end this thread, and the test would wait
    on it until the pytest timeout; anything unexpected goes to `failures`, which the test
    asserts on."""

    def __init__(self, server: ServerProcess, model: str) -> None:
        super().__init__(daemon=True)
        self.server, self.model = server, model
        self.accepted: list[str] = []
        self.refused = 0
        self.failures: list[str] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        body = {"model": self.model, "messages": [{"role": "user", "content": "x"}]}
        try:
            with httpx.Client(base_url=self.server.url, timeout=30.0) as client:
                while not self.stop_event.is_set():
                    response = client.post("/v1/jobs", json={**body, "max_tokens": 40})
                    if response.status_code == 202:
                        self.accepted.append(response.json()["id"])
                    elif response.status_code == 503:
                        self.refused += 1
                    else:
                        self.failures.append(f"{response.status_code}: {response.text}")
                        return
                    # Pacing, not synchronisation: keeps the loop from flooding the queue.
                    time.sleep(0.01)
        except Exception as error:  # noqa: BLE001 - reported by the test, not lost with the thread
            self.failures.append(repr(error))

    def wait_until(self, condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
        """Poll `condition` (bounded); fail at once if the thread reported a failure or died."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert not self.failures, self.failures
            assert self.is_alive(), f"the submitter ended before {what}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.01)


def test_redis_sigkill_and_restart_loses_no_accepted_job(
    server: tuple[ServerProcess, str], redis_proc: DurableRedis
) -> None:
    proc, prefix = server
    model = model_name(proc)
    submitter = Submitter(proc, model)
    submitter.start()
    try:
        submitter.wait_until(lambda: len(submitter.accepted) >= 20, "20 accepted jobs")
        redis_proc.stop(kill=True)
        # Keep Redis down until a submission has met the outage (a 503), instead of a fixed
        # sleep that hoped one would.
        submitter.wait_until(lambda: submitter.refused >= 1, "a 503 while Redis is down")
        redis_proc.restart()
        wait_ready(proc, ready=True, timeout_s=60.0)
        target = len(submitter.accepted) + 20
        submitter.wait_until(lambda: len(submitter.accepted) >= target, "20 more accepted jobs")
    finally:
        submitter.stop_event.set()
        submitter.join(60)
    assert not submitter.is_alive() and not submitter.failures, submitter.failures
    assert submitter.refused >= 1
    client = redis_client(redis_proc.url)
    try:
        accepted = submitter.accepted
        wait_terminal(client, prefix, accepted, 90)
        outcomes, twice = ledger(client, prefix, accepted)
        assert outcomes == {"completed": len(accepted)} and twice == [], outcomes
    finally:
        client.close()


def test_aof_is_on_with_fsync_always(redis_proc: DurableRedis) -> None:
    client = redis_client(redis_proc.url)
    try:
        config: Any = client.config_get("append*")
    finally:
        client.close()
    assert config["appendonly"] == "yes" and config["appendfsync"] == "always"
