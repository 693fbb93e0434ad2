"""Replica faults with real processes: SIGKILL of one of two replicas mid-run.

S claims only bulk work and V claims both classes, so every chat stream opened on S runs on
V: when V dies, S's reclaim sweep takes V's leases back, requeues its bulk jobs (S completes
them) and ends the started streams with an error event that S's SSE clients receive.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from bench.live.processes import ServerProcess
from tests.replica_cluster import (
    SseReader,
    cluster_prefix,
    job_hash,
    ledger,
    model_name,
    redis_client,
    replica,
    small_envelope,
    start_all,
    submit_jobs,
    wait_terminal,
    wait_until_running_on,
)

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@dataclasses.dataclass
class Pair:
    s: ServerProcess
    v: ServerProcess
    prefix: str
    redis: redis.Redis
    model: str = ""


@pytest.fixture(scope="module")
def pair(
    tiny_model_dir: Path, redis_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pair]:
    tmp = tmp_path_factory.mktemp("faults")
    prefix = cluster_prefix()
    envelope = small_envelope(tmp, max_active_seqs=3, reserved=1)
    s = replica(tiny_model_dir, redis_server, prefix, tmp, "S", claim="bulk", envelope=envelope)
    v = replica(tiny_model_dir, redis_server, prefix, tmp, "V", envelope=envelope)
    start_all(s, v)
    pair = Pair(s, v, prefix, redis_client(redis_server), model_name(s))
    yield pair
    pair.redis.close()
    pair.v.kill()
    pair.s.kill()


def test_sigkill_of_a_replica_mid_run(pair: Pair) -> None:
    jobs = submit_jobs(pair.s, pair.model, 10, 400, "kill")
    readers = [SseReader(pair.s, pair.model, 900, f"kill-{i}") for i in range(2)]
    for reader in readers:
        reader.start()
    assert all(r.first_token.wait(30) for r in readers)
    assert all(r.failure is None and r.job_id for r in readers), [r.errors for r in readers]
    # A token a reader on another replica has seen is one the job is marked for: V marks before
    # it publishes, so a kill at any moment from here leaves no retryable job behind a started
    # stream (marked after, a kill in between requeued the chat and its stream never ended).
    for reader in readers:
        assert reader.job_id is not None
        assert job_hash(pair.redis, pair.prefix, reader.job_id)["tokens_sent"] == "1"
    held = wait_until_running_on(pair.redis, pair.prefix, jobs, "V")
    assert held  # V ran some of the jobs when it was killed
    pair.v.kill()

    # Started streams end with a clear error event, then [DONE], on the surviving replica.
    for reader in readers:
        reader.join(30)
        assert not reader.is_alive() and reader.failure is None
        assert [e["code"] for e in reader.errors] == ["lease_lost_after_first_token"]
        assert reader.errors[0]["type"] == "server_error" and reader.done

    done = wait_terminal(pair.redis, pair.prefix, jobs, 120)
    assert {f["status"] for f in done.values()} == {"completed"}, pair.s.logs()
    assert all(done[i]["attempts"] == "2" and done[i]["replica"] == "S" for i in held)
    chats = [r.job_id for r in readers if r.job_id]
    outcomes, twice = ledger(pair.redis, pair.prefix, [*jobs, *chats])
    # accepted = completed + failed + expired + cancelled, and nothing completed twice.
    assert outcomes == {"completed": len(jobs), "failed": len(chats)} and twice == []
