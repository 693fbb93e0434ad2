"""Helpers for the replica and fault tests: several real `mixgate serve` processes on one real
redis-server (one key prefix), SSE readers on threads, and the ledger of what became of every
accepted request, read from Redis itself."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import redis

from bench.live.processes import ServerProcess
from gateway.queue import Keys
from policies.envelope import Envelope, dump_envelope

TERMINAL = frozenset({"completed", "failed", "cancelled", "expired"})


def cluster_prefix() -> str:
    return f"{{rep-{uuid.uuid4().hex[:8]}}}:"


def small_envelope(tmp: Path, max_active_seqs: int, reserved: int = 1) -> Path:
    """Few slots per replica, so a backlog has to spread over the replicas."""
    envelope = dataclasses.replace(
        Envelope.default(), max_active_seqs=max_active_seqs, interactive_reserved_seqs=reserved
    )
    path = tmp / f"envelope-{max_active_seqs}-{reserved}.toml"
    path.write_text(dump_envelope(envelope))
    return path


def replica(
    model_dir: Path,
    redis_url: str,
    prefix: str,
    tmp: Path,
    name: str,
    *,
    claim: str = "interactive,bulk",
    envelope: Path | None = None,
    **env: str,
) -> ServerProcess:
    """One replica of a cluster: its own data folder and replica id, the shared prefix."""
    extra = {"MIXGATE_REPLICA_ID": name, "MIXGATE_CLAIM_CLASSES": claim, **env}
    return ServerProcess(
        model_dir, redis_url, prefix, tmp / name, envelope_path=envelope, extra_env=extra
    )


def start_all(*servers: ServerProcess, timeout_s: float = 120.0) -> None:
    """Start the replicas side by side (each loads its engine in its own process)."""
    try:
        for server in servers:
            server.launch()
        for server in servers:
            server.wait_ready(timeout_s)
    except BaseException:
        for server in servers:
            server.stop()
        raise


def model_name(server: ServerProcess) -> str:
    return str(httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]["id"])


def metric(server: ServerProcess, name: str, **labels: str) -> float:
    """Sum of a metric's samples whose labels include `labels`."""
    total = 0.0
    for line in httpx.get(server.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, value = line.rsplit(" ", 1)
        sample, _, label_text = head.partition("{")
        if sample != name:
            continue
        if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            total += float(value)
    return total


def redis_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True)


def job_hash(client: redis.Redis, prefix: str, job_id: str) -> dict[str, str]:
    result: dict[str, str] = client.hgetall(Keys(prefix).job(job_id))  # type: ignore[assignment]
    return result


def final_events(client: redis.Redis, prefix: str, job_id: str) -> set[str]:
    """The distinct last events (END or ERROR payloads) on a request's token stream.

    NOTE: distinct, because a publish that Redis applied but whose reply was lost (Redis
    killed mid-call) is retried and appends the same event twice (dispatcher_job says so);
    readers stop at the first. Two attempts that both finished would differ (timings).
    """
    entries: Any = client.xrange(Keys(prefix).out(job_id))
    return {f"{f['e']}:{f['d']}" for _, f in entries if f["e"] in ("end", "error")}


def wait_terminal(
    client: redis.Redis, prefix: str, ids: Iterable[str], timeout_s: float = 90.0
) -> dict[str, dict[str, str]]:
    """Every job's hash once all are terminal (assert on a timeout)."""
    pending = list(ids)
    done: dict[str, dict[str, str]] = {}
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        for job_id in list(pending):
            fields = job_hash(client, prefix, job_id)
            if fields.get("status") in TERMINAL:
                done[job_id] = fields
                pending.remove(job_id)
        time.sleep(0.05)
    assert not pending, f"{len(pending)} jobs not terminal: {pending[:3]}"
    return done


def ledger(
    client: redis.Redis, prefix: str, accepted: Iterable[str]
) -> tuple[Counter[str], list[str]]:
    """Outcomes of every accepted id, and the ids whose stream ended more than once.

    Each attempt that completes writes one END (or ERROR) after a fenced complete; a job
    completed twice would show two different ones.
    """
    outcomes: Counter[str] = Counter()
    twice = []
    for job_id in accepted:
        outcomes[job_hash(client, prefix, job_id).get("status", "lost")] += 1
        if len(final_events(client, prefix, job_id)) > 1:
            twice.append(job_id)
    return outcomes, twice


def submit_jobs(
    server: ServerProcess, model: str, count: int, max_tokens: int, tag: str
) -> list[str]:
    ids = []
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for i in range(count):
            body = {
                "model": model,
                "messages": [{"role": "user", "content": f"{tag} job {i}"}],
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
            }
            response = client.post("/v1/jobs", json=body)
            assert response.status_code == 202, response.text
            ids.append(response.json()["id"])
    return ids


class SseReader(threading.Thread):
    """Reads one chat stream on its own thread; `first_token` is set at the first content."""

    def __init__(self, server: ServerProcess, model: str, max_tokens: int, tag: str) -> None:
        super().__init__(daemon=True)
        self.url = server.url + "/v1/chat/completions"
        self.body = {
            "model": model,
            "messages": [{"role": "user", "content": f"stream {tag}"}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        self.first_token = threading.Event()
        self.stop_reading = threading.Event()
        self.job_id: str | None = None
        self.chunks: list[dict[str, Any]] = []
        self.errors: list[dict[str, Any]] = []
        self.done = False
        self.status: int | None = None
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            with (
                httpx.Client(timeout=60) as client,
                client.stream("POST", self.url, json=self.body) as response,
            ):
                self.status = response.status_code
                if self.status != 200:
                    self.errors.append({"status": self.status, "body": response.read().decode()})
                    return
                for line in response.iter_lines():
                    if self.stop_reading.is_set():
                        return  # leaving the block closes the connection: a disconnect
                    self._frame(line)
        except BaseException as error:  # noqa: BLE001 - the test thread reports it
            self.failure = error
        finally:
            self.first_token.set()  # never leave a waiter hanging

    def _frame(self, line: str) -> None:
        if not line.startswith("data: "):
            return
        data = line[len("data: ") :]
        if data == "[DONE]":
            self.done = True
            return
        frame = json.loads(data)
        if "error" in frame:
            self.errors.append(frame["error"])
            return
        self.job_id = frame["id"]
        self.chunks.append(frame)
        if any(c["delta"].get("content") for c in frame["choices"]):
            self.first_token.set()

    @property
    def text(self) -> str:
        return "".join(c["delta"].get("content") or "" for f in self.chunks for c in f["choices"])


def running_on(client: redis.Redis, prefix: str, ids: list[str], name: str) -> list[str]:
    """The ids among `ids` that replica `name` runs now."""
    fields = [(i, job_hash(client, prefix, i)) for i in ids]
    return [i for i, f in fields if f.get("status") == "running" and f.get("replica") == name]


def wait_until_running_on(
    client: redis.Redis, prefix: str, ids: list[str], name: str, timeout_s: float = 30.0
) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while not (found := running_on(client, prefix, ids, name)):
        assert time.monotonic() < deadline, f"no job ran on {name}"
        time.sleep(0.01)
    return found
