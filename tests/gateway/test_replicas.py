"""Two real `mixgate serve` replicas on one real redis-server share the queues; SIGTERM of
one drains it (exit 0) while the other takes over.

Replica A claims only bulk work, B claims both classes: a chat sent to A has to run on B, so
its tokens cross replicas through the Redis stream, and a cancel sent to A has to reach B.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from bench.live.processes import ServerProcess
from tests.replica_cluster import (
    SseReader,
    cluster_prefix,
    job_hash,
    ledger,
    metric,
    model_name,
    redis_client,
    replica,
    running_on,
    small_envelope,
    start_all,
    submit_jobs,
    wait_terminal,
    wait_until_running_on,
)

pytestmark = [pytest.mark.redis, pytest.mark.slow]
# No drain time: whatever A runs at its SIGTERM is handed back at once, so the takeover by B
# is what the SIGTERM test sees on any CPU (with 1 s, a fast one could finish A's jobs).
DRAIN_TIMEOUT_S = 0.0


class Cluster:
    def __init__(self, a: ServerProcess, b: ServerProcess, prefix: str, redis_url: str) -> None:
        self.a, self.b, self.prefix = a, b, prefix
        self.redis: redis.Redis = redis_client(redis_url)
        self.model = model_name(a)


@pytest.fixture(scope="module")
def cluster(
    tiny_model_dir: Path, redis_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("replicas")
    prefix = cluster_prefix()
    # Three slots per replica for bulk: a backlog of jobs cannot all fit on one replica.
    envelope = small_envelope(tmp, max_active_seqs=3, reserved=1)
    env = {"MIXGATE_DRAIN_TIMEOUT_S": str(DRAIN_TIMEOUT_S)}
    a = replica(
        tiny_model_dir, redis_server, prefix, tmp, "A", claim="bulk", envelope=envelope, **env
    )
    b = replica(tiny_model_dir, redis_server, prefix, tmp, "B", envelope=envelope, **env)
    start_all(a, b)
    cluster = Cluster(a, b, prefix, redis_server)
    yield cluster
    cluster.redis.close()
    assert b.stop() == 0, b.logs()
    assert a.stop() == 0, a.logs()  # already stopped by the SIGTERM test: its exit code


def finished(server: ServerProcess, status: str = "completed") -> float:
    return metric(server, "mixgate_jobs_finished_total", status=status)


def test_bulk_work_spreads_over_both_replicas_and_is_written_once(cluster: Cluster) -> None:
    before = finished(cluster.a) + finished(cluster.b)
    ids = submit_jobs(cluster.a, cluster.model, 6, 60, "spread-a")
    ids += submit_jobs(cluster.b, cluster.model, 6, 60, "spread-b")
    done = wait_terminal(cluster.redis, cluster.prefix, ids)
    assert {f["status"] for f in done.values()} == {"completed"}
    # Fencing: one attempt each, one END on each stream, one completion counted in total.
    assert {f["attempts"] for f in done.values()} == {"1"}
    outcomes, twice = ledger(cluster.redis, cluster.prefix, ids)
    assert outcomes == {"completed": len(ids)} and twice == []
    assert {f["replica"] for f in done.values()} == {"A", "B"}, "one replica ran everything"
    assert finished(cluster.a) + finished(cluster.b) - before == len(ids)


def test_chat_sent_to_a_streams_tokens_produced_on_b(cluster: Cluster) -> None:
    reader = SseReader(cluster.a, cluster.model, max_tokens=40, tag="cross")
    reader.start()
    reader.join(60)
    assert reader.failure is None and reader.status == 200
    assert reader.done and reader.errors == [] and reader.text
    assert reader.job_id is not None
    assert job_hash(cluster.redis, cluster.prefix, reader.job_id)["replica"] == "B"
    assert reader.chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_disconnect_from_a_stops_the_work_on_b(cluster: Cluster) -> None:
    reader = SseReader(cluster.a, cluster.model, max_tokens=900, tag="leave")
    reader.start()
    assert reader.first_token.wait(30) and reader.failure is None
    assert reader.job_id is not None, (reader.errors, reader.status)
    assert metric(cluster.b, "mixgate_engine_running", **{"class": "interactive"}) >= 1
    # A served engine core adapts its threads and says how many it runs on (0: no sample).
    assert metric(cluster.b, "mixgate_engine_threads") >= 1
    reader.stop_reading.set()
    reader.join(30)
    (fields,) = wait_terminal(cluster.redis, cluster.prefix, [reader.job_id], 15).values()
    assert fields["status"] == "cancelled" and fields["replica"] == "B"
    # B aborted it in its engine: nothing runs there and its KV blocks are free again.
    running = metric(cluster.b, "mixgate_engine_running")
    assert running == 0 and metric(cluster.b, "mixgate_kv_cache_usage") == 0.0


def test_delete_sent_to_a_cancels_a_stream_running_on_b(cluster: Cluster) -> None:
    reader = SseReader(cluster.b, cluster.model, max_tokens=900, tag="delete")
    reader.start()
    assert reader.first_token.wait(30) and reader.job_id is not None
    response = httpx.delete(f"{cluster.a.url}/v1/jobs/{reader.job_id}", timeout=10)
    assert response.status_code == 200, response.text
    reader.join(30)
    assert not reader.is_alive() and reader.failure is None
    assert [e["code"] for e in reader.errors] == ["cancelled"] and reader.done
    fields = job_hash(cluster.redis, cluster.prefix, reader.job_id)
    assert fields["status"] == "cancelled" and fields["replica"] == "B"


def test_sigterm_drains_and_exits_0_while_the_other_replica_takes_over(cluster: Cluster) -> None:
    """Last in this module: it stops A (B finishes what A hands back)."""
    jobs = submit_jobs(cluster.b, cluster.model, 8, 900, "drain")
    held = wait_until_running_on(cluster.redis, cluster.prefix, jobs, "A")
    assert cluster.a.process is not None
    cluster.a.process.terminate()
    exit_code = cluster.a.process.wait(DRAIN_TIMEOUT_S + 60)
    assert exit_code == 0, cluster.a.logs()
    assert not running_on(cluster.redis, cluster.prefix, jobs, "A")
    done = wait_terminal(cluster.redis, cluster.prefix, jobs, 120)
    assert {f["status"] for f in done.values()} == {"completed"}
    outcomes, twice = ledger(cluster.redis, cluster.prefix, jobs)
    assert outcomes == {"completed": len(jobs)} and twice == []
    # B took over what A ran: a job A held at the SIGTERM was handed back and completed by B
    # on its second attempt (or, only if it ended in the instant before, by A on its first).
    took_over = [i for i in held if (done[i]["replica"], done[i]["attempts"]) == ("B", "2")]
    assert took_over, {i: (done[i]["replica"], done[i]["attempts"]) for i in held}
    assert all((done[i]["replica"], done[i]["attempts"]) in {("A", "1"), ("B", "2")} for i in held)
    assert all(f["replica"] == "B" or f["attempts"] == "1" for f in done.values())
