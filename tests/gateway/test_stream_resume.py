"""Resuming a chat stream with Last-Event-ID, on the replica that runs it or on another one.

Two real `mixgate serve` replicas on one real redis-server and key prefix, API keys for two
tenants, a real HTTP client reading SSE. A resumable chat (`stream_options.resumable`) starts
on A (A has a free slot, so A runs it, in-process); its client reads a few frames and leaves;
a resume with the last `id:` it read, on A or on B, gives the rest, and the two parts are the
uninterrupted greedy answer. A's grace is long (600 s), so no resume test depends on how fast
it comes; B's is short, for the stream that nobody resumes. C claims only bulk work, so a chat
sent to C runs elsewhere and its stream is in Redis from its first token.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from bench.live.processes import ServerProcess
from gateway.queue import Keys
from tests.replica_cluster import (
    cluster_prefix,
    job_hash,
    redis_client,
    replica,
    start_all,
    wait_terminal,
)

pytestmark = [pytest.mark.redis, pytest.mark.slow]

ALPHA, BETA = "sk-resume-alpha-41c2", "sk-resume-beta-9e07"
KEYS = {"keys": [{"key": ALPHA, "tenant": "alpha"}, {"key": BETA, "tenant": "beta"}]}
MESSAGES = [{"role": "user", "content": "resume me where I left off"}]
MAX_TOKENS = 96
# Frames the first client reads before it leaves.
READ_BEFORE_LEAVING = 6


@dataclass
class Cluster:
    a: ServerProcess
    b: ServerProcess
    c: ServerProcess
    client: redis.Redis
    model: str
    prefix: str
    http: dict[str, httpx.Client] = field(default_factory=dict)


@pytest.fixture(scope="module")
def cluster(
    tiny_model_dir: Path, redis_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("resume")
    prefix = cluster_prefix()
    keys = json.dumps(KEYS)
    a = replica(tiny_model_dir, redis_server, prefix, tmp, "A", MIXGATE_STREAM_RESUME_GRACE_S="600")
    b = replica(
        tiny_model_dir, redis_server, prefix, tmp, "B", MIXGATE_STREAM_RESUME_GRACE_S="0.05"
    )
    c = replica(
        tiny_model_dir,
        redis_server,
        prefix,
        tmp,
        "C",
        claim="bulk",
        MIXGATE_STREAM_RESUME_GRACE_S="600",
    )
    a.api_keys_json = b.api_keys_json = c.api_keys_json = keys
    start_all(a, b, c)
    client = redis_client(redis_server)
    model = httpx.get(
        a.url + "/v1/models", headers={"Authorization": f"Bearer {ALPHA}"}, timeout=10
    ).json()["data"][0]["id"]
    try:
        yield Cluster(a, b, c, client, model, prefix)
    finally:
        client.close()
        for server in (a, b, c):
            assert server.stop() == 0, server.logs()


def _body(model: str, max_tokens: int, resumable: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": MESSAGES,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if resumable:
        body["stream_options"]["resumable"] = True
    return body


def _auth(key: str = ALPHA) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@dataclass
class Read:
    """What a client made of an SSE stream: frames with the id each carried (or None)."""

    frames: list[tuple[str | None, dict[str, Any]]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False

    @property
    def text(self) -> str:
        return "".join(
            c["delta"].get("content", "")
            for _, f in self.frames
            for c in f.get("choices", [])
            if "delta" in c
        )

    @property
    def ids(self) -> list[str]:
        return [i for i, _ in self.frames if i is not None]

    @property
    def job_id(self) -> str:
        return str(self.frames[0][1]["id"])


def _read(lines: Iterator[str], read: Read, stop_after: int | None = None) -> Read:
    """Parse SSE lines into `read`; stop after `stop_after` content frames (the client leaves)."""
    event_id: str | None = None
    content_frames = 0
    for line in lines:
        if line.startswith("id: "):
            event_id = line[len("id: ") :]
        elif line == "data: [DONE]":
            read.done = True
            return read
        elif line.startswith("data: "):
            frame = json.loads(line[len("data: ") :])
            if "error" in frame:
                read.errors.append(frame["error"])
                continue
            read.frames.append((event_id, frame))
            event_id = None
            if any(c["delta"].get("content") for c in frame.get("choices", [])):
                content_frames += 1
                if stop_after is not None and content_frames >= stop_after:
                    return read
    return read


def _chat(server: ServerProcess, body: dict[str, Any], stop_after: int | None = None) -> Read:
    with httpx.stream(
        "POST", server.url + "/v1/chat/completions", json=body, headers=_auth(), timeout=60
    ) as response:
        assert response.status_code == 200, response.read()
        # Returning closes the response: with stop_after, the client leaves mid-stream.
        return _read(response.iter_lines(), Read(), stop_after)


def _resume(
    server: ServerProcess, job_id: str, last_event_id: str | None, key: str = ALPHA
) -> httpx.Response | Read:
    """The resumed stream read to its end, or the error response."""
    headers = _auth(key)
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    url = f"{server.url}/v1/chat/completions/{job_id}/stream"
    with httpx.stream("GET", url, headers=headers, timeout=60) as response:
        if response.status_code != 200:
            response.read()
            return response
        assert response.headers["content-type"].startswith("text/event-stream")
        return _read(response.iter_lines(), Read())


def _stream_id(text: str) -> tuple[int, int]:
    ms, seq = text.split("-")
    return int(ms), int(seq)


@pytest.fixture(scope="module")
def reference(cluster: Cluster) -> Read:
    """The uninterrupted greedy answer (resumable, read to its end while connected)."""
    read = _chat(cluster.a, _body(cluster.model, MAX_TOKENS))
    assert read.done and read.text
    # Read to its end by its client: delivered in-process, nothing of it went to Redis.
    assert not cluster.client.exists(Keys(cluster.prefix).out(read.job_id))
    return read


@pytest.mark.parametrize("resume_on", ["same replica", "other replica"])
def test_a_stream_resumed_after_a_disconnect_gives_the_uninterrupted_tokens(
    cluster: Cluster, reference: Read, resume_on: str
) -> None:
    first = _chat(cluster.a, _body(cluster.model, MAX_TOKENS), stop_after=READ_BEFORE_LEAVING)
    assert not first.done and first.ids
    job_id, last_id = first.job_id, first.ids[-1]
    # A ran it (in-process delivery), so the stream reached Redis through the handover.
    assert job_hash(cluster.client, cluster.prefix, job_id)["replica"] == "A"
    target = cluster.a if resume_on == "same replica" else cluster.b
    rest = _resume(target, job_id, last_id)
    assert isinstance(rest, Read), rest.text
    assert rest.done and not first.errors and not rest.errors
    # Nothing twice, nothing lost: the two parts are the uninterrupted greedy answer.
    assert first.text + rest.text == reference.text
    # No second role chunk: the client had it.
    assert not any(c["delta"].get("role") for _, f in rest.frames for c in f.get("choices", []))
    ids = [_stream_id(i) for i in first.ids + rest.ids]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    usage = rest.frames[-1][1]["usage"]
    assert usage["completion_tokens"] == MAX_TOKENS
    # The in-process events kept their ids in Redis (0-1, 0-2, ...), the rest followed them.
    entries: Any = cluster.client.xrange(Keys(cluster.prefix).out(job_id))
    assert entries[0][0] == "0-1" and entries[-1][1]["e"] == "end"

    # After the end: what Redis keeps is replayed, from the start without a Last-Event-ID
    # (role chunk included), and nothing but [DONE] after the last event's id.
    wait_terminal(cluster.client, cluster.prefix, [job_id])
    again = _resume(cluster.b, job_id, None)
    assert isinstance(again, Read) and again.done
    assert again.text == reference.text
    assert again.frames[0][1]["choices"][0]["delta"].get("role") == "assistant"
    after_end = _resume(cluster.a, job_id, (first.ids + rest.ids)[-1])
    assert isinstance(after_end, Read) and after_end.done and after_end.frames == []


def test_a_stream_run_by_another_replica_resumes_from_its_redis_ids(
    cluster: Cluster, reference: Read
) -> None:
    first = _chat(cluster.c, _body(cluster.model, MAX_TOKENS), stop_after=READ_BEFORE_LEAVING)
    job_id = first.job_id
    assert job_hash(cluster.client, cluster.prefix, job_id)["replica"] in ("A", "B")
    # Its events were in Redis from the first: the ids are Redis's own, not 0-n.
    assert _stream_id(first.ids[-1])[0] > 0
    rest = _resume(cluster.c, job_id, first.ids[-1])
    assert isinstance(rest, Read) and rest.done and not rest.errors
    assert first.text + rest.text == reference.text


def test_a_resume_takes_over_from_a_first_connection_the_server_still_holds(
    cluster: Cluster,
) -> None:
    long_tokens = 900
    whole = _chat(cluster.a, _body(cluster.model, long_tokens))
    body = _body(cluster.model, long_tokens)
    with httpx.stream(
        "POST", cluster.a.url + "/v1/chat/completions", json=body, headers=_auth(), timeout=60
    ) as response:
        lines = response.iter_lines()
        first = _read(lines, Read(), stop_after=4)
        # The first connection stays open (a half-open one, as the server sees it) while the
        # client resumes on the same replica.
        rest = _resume(cluster.a, first.job_id, first.ids[-1])
        assert isinstance(rest, Read) and rest.done and not rest.errors
        # The first handler let go: its stream ends with an error, not the answer's end.
        old = _read(lines, Read())
    assert old.done and [e["code"] for e in old.errors] == ["stream_resumed"]
    assert first.text + rest.text == whole.text


def test_a_stream_nobody_resumes_is_cancelled_after_the_grace_and_frees_its_kv_blocks(
    cluster: Cluster,
) -> None:
    # B's grace is 0.05 s. The request asks for far more tokens than run in that time.
    first = _chat(cluster.b, _body(cluster.model, 900), stop_after=3)
    assert not first.done
    job_id = first.job_id
    done = wait_terminal(cluster.client, cluster.prefix, [job_id])
    assert done[job_id]["status"] == "cancelled", done[job_id]
    # Whoever ran it freed its KV blocks (wait for the event, bounded: a hang fails).
    server = cluster.a if done[job_id]["replica"] == "A" else cluster.b
    deadline_s = time.monotonic() + 30
    while _kv_usage(server) != 0.0:
        assert time.monotonic() < deadline_s, "KV blocks not freed"
        time.sleep(0.02)
    # A client that resumes after all reads the rest that was made, then why it ended.
    late = _resume(cluster.a, job_id, first.ids[-1])
    assert isinstance(late, Read) and late.done
    assert [e["code"] for e in late.errors] == ["cancelled"]


def _kv_usage(server: ServerProcess) -> float:
    for line in httpx.get(server.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("mixgate_kv_cache_usage "):
            return float(line.split()[1])
    raise AssertionError("no mixgate_kv_cache_usage in /metrics")


def _error(response: httpx.Response | Read) -> dict[str, Any]:
    assert isinstance(response, httpx.Response), "expected an error, got a stream"
    body = response.json()
    assert set(body["error"]) == {"message", "type", "code", "param"}, body
    return dict(body["error"]) | {"status": response.status_code}


def test_bad_and_unknown_ids_get_openai_shaped_errors(cluster: Cluster, reference: Read) -> None:
    job_id = reference.job_id
    bad = _error(_resume(cluster.a, job_id, "not-an-id"))
    assert (bad["status"], bad["type"], bad["param"]) == (
        400,
        "invalid_request_error",
        "Last-Event-ID",
    )
    unknown = _error(_resume(cluster.b, "chatcmpl-doesnotexist0", None))
    assert (unknown["status"], unknown["code"]) == (404, "chat_completion_not_found")
    # Another tenant's id reads exactly as an unknown one.
    theirs = _error(_resume(cluster.a, job_id, None, key=BETA))
    assert theirs | {"message": ""} == unknown | {"message": ""}
    # A chat that did not ask to be resumable, read to its end.
    plain = _chat(cluster.a, _body(cluster.model, 8, resumable=False))
    not_resumable = _error(_resume(cluster.a, plain.job_id, None))
    assert (not_resumable["status"], not_resumable["code"]) == (404, "stream_not_resumable")
    # A resumable chat read to its end while connected: nothing was kept to replay.
    expired = _error(_resume(cluster.b, job_id, None))
    assert (expired["status"], expired["code"]) == (404, "stream_expired")
    # Ids are for resumable streams: a plain one keeps OpenAI's bytes (no `id:` lines); a
    # resumable one carries one on every content frame.
    assert plain.frames and plain.ids == []
    content = [
        i for i, f in reference.frames if f["choices"] and f["choices"][0]["delta"].get("content")
    ]
    assert content and None not in content
