"""Every child `mixgate serve` owns dies with it, the embedded redis-server included; a start
never puts a second redis-server on one AOF; SIGTERM of an idle server exits 0 promptly.
Real `mixgate serve` processes with their embedded redis-server."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.live.processes import ServerProcess
from tests.child_processes import (
    children,
    engine_child,
    processes_matching,
    stacks_of,
    wait_gone,
)
from tests.replica_cluster import SseReader, model_name, submit_jobs

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def embedded(model_dir: Path, data_dir: Path, **env: str) -> ServerProcess:
    # NOTE: an empty --redis-url means "unset": the server starts its embedded redis-server.
    prefix = f"{{own-{uuid.uuid4().hex[:8]}}}:"
    return ServerProcess(model_dir, "", prefix, data_dir, extra_env=env)


def redis_servers_on(data_dir: Path) -> list[int]:
    return processes_matching(str((data_dir / "redis" / "redis.sock").resolve()))


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "data"
    # Whatever a failed test left behind must not outlive it.
    for pid in redis_servers_on(tmp_path / "data"):
        os.kill(pid, signal.SIGKILL)


def _pid(server: ServerProcess) -> int:
    assert server.process is not None
    return server.process.pid


def test_sigkill_leaves_no_children_and_a_restart_runs_one_redis(
    tiny_model_dir: Path, data_dir: Path
) -> None:
    server = embedded(tiny_model_dir, data_dir).start()
    owned = children(_pid(server))
    engine_pid = engine_child(_pid(server))
    (redis_pid,) = redis_servers_on(data_dir)
    assert {engine_pid, redis_pid} <= set(owned), owned
    server.kill()
    assert wait_gone([engine_pid, redis_pid], 30) == [], children(1)

    again = embedded(tiny_model_dir, data_dir).start()
    try:
        assert len(redis_servers_on(data_dir)) == 1
        assert (data_dir / "redis" / "redis.pid").read_text().strip() == str(
            redis_servers_on(data_dir)[0]
        )
    finally:
        assert again.stop() == 0


def test_a_second_server_on_the_same_data_folder_refuses(
    tiny_model_dir: Path, data_dir: Path
) -> None:
    first = embedded(tiny_model_dir, data_dir).start()
    try:
        (redis_pid,) = redis_servers_on(data_dir)
        second = embedded(tiny_model_dir, data_dir).launch()
        assert second.process is not None
        assert second.process.wait(60) != 0
        assert "already running" in second.logs(), second.logs()
        assert redis_servers_on(data_dir) == [redis_pid]
    finally:
        assert first.stop() == 0


def test_sigterm_of_an_idle_server_exits_0_promptly(tiny_model_dir: Path, data_dir: Path) -> None:
    server = embedded(tiny_model_dir, data_dir).start()
    assert server.process is not None
    owned = list(children(_pid(server)))
    started_s = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    code = server.process.wait(30)
    exit_s = time.monotonic() - started_s
    assert code == 0, server.logs()
    # Generous: the target is 1 s; this bound only catches a shutdown that waits on something.
    assert exit_s < 5.0, exit_s
    assert wait_gone(owned, 10) == []


def test_sigterm_of_a_busy_server_drains_within_its_drain_time(
    tiny_model_dir: Path, data_dir: Path
) -> None:
    drain_s = 3.0
    server = embedded(tiny_model_dir, data_dir, MIXGATE_DRAIN_TIMEOUT_S=str(drain_s)).start()
    assert server.process is not None
    model = model_name(server)
    # Far more work than the drain time allows: the drain ends by handing leases back.
    submit_jobs(server, model, 40, 900, "busy")
    reader = SseReader(server, model, 900, "busy")
    reader.start()
    assert reader.first_token.wait(60) and reader.failure is None, reader.errors
    started_s = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    try:
        code = server.process.wait(60)
    except subprocess.TimeoutExpired:
        # Seen once, in a CI run under xdist (still running 60 s after the signal): say where
        # each thread waits, then kill it (its engine child follows it).
        stacks, logs = stacks_of(server.process.pid), server.logs()
        server.kill()
        pytest.fail(f"no exit 60 s after SIGTERM\n{stacks}\n{logs}")
    exit_s = time.monotonic() - started_s
    assert code == 0, server.logs()
    # NOTE: before the drain began at the signal, uvicorn first waited for the open stream
    # (up to drain + 5 s) and only then did the lifespan drain for drain_s more.
    assert exit_s < drain_s + 4.0, exit_s
    reader.join(30)
    # The open chat either finished inside the drain (a fast machine) or ended with one error
    # event when its lease was handed back; never both, and never a stream cut without [DONE].
    finished = any(c.get("finish_reason") for f in reader.chunks for c in f["choices"])
    assert not reader.is_alive() and reader.done, reader.errors
    assert finished != (len(reader.errors) == 1), (finished, reader.errors)
