"""Token delivery in O(steps): in-process when the chat's handler is on the replica that runs
it, over Redis only when it is not, and nothing per token for bulk jobs nobody reads.

Real redis-server, real `mixgate serve` processes and a real engine on the tiny model. Redis
commands are counted at the server (INFO commandstats, which counts the commands that Lua
scripts run as well), and MONITOR, which lists the same commands and marks those that scripts
run (`lua`), says which of them were the chat's and which were round trips.

Over 400 lines on purpose: one concept (where a request's tokens travel) checked on every route
against one reference engine and one command-counting set-up that the sections share.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aioredis

from bench.live.processes import ServerProcess, start_redis, stop_process
from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.request import GenerationRequest
from engine.core.sampling_params import SamplingParams
from engine.process.async_engine import AsyncEngine
from gateway.dispatch.config import DispatcherConfig
from gateway.dispatch.dispatcher import Dispatcher
from gateway.dispatch.local_delivery import WATCHED_KEY
from gateway.dispatch.stream_event import DELTA, END, StreamEvent
from gateway.dispatch.token_stream import TokenStreams
from gateway.queue import Keys, NewJob, QueueStore
from gateway.queue.payload import JobPayload
from policies.request_class import RequestClass
from tests.replica_cluster import (
    cluster_prefix,
    model_name,
    redis_client,
    replica,
    start_all,
    wait_terminal,
)

pytestmark = [pytest.mark.redis, pytest.mark.anyio]

MAX_TOKENS = 64
MESSAGES = [{"role": "user", "content": "tell me about token delivery"}]
# The idle loops' cadences made long, so that the only commands in a counting window are the
# chat's own and the dispatcher's idle wait (whose 1 s timeouts the count takes out exactly).
QUIET_ENV = {
    "MIXGATE_LEASE_S": "600",
    "MIXGATE_REDIS_CHECK_INTERVAL_S": "3600",
    "MIXGATE_BATCH_POLL_INTERVAL_S": "3600",
}


# ---- the reference: the same greedy request straight on an engine ----------------------------


@pytest.fixture(scope="module")
async def engine(tiny_model_dir: Path) -> AsyncIterator[AsyncEngine]:
    config = EngineConfig(
        max_active_seqs=8,
        step_token_budget=256,
        num_kv_blocks=256,
        block_size_tokens=16,
        device="cpu",
        dtype="float32",
    )
    eng = AsyncEngine(LLMEngine(tiny_model_dir, config))
    await eng.start()
    try:
        yield eng
    finally:
        await eng.stop()


def _sampling(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


async def _reference(engine: AsyncEngine, max_tokens: int) -> tuple[str, list[int]]:
    """Text and token ids of the chat's prompt generated greedily on the engine itself."""
    prompt = engine.engine.tokenizer.encode_chat(MESSAGES)
    request = GenerationRequest(
        request_id=f"ref-{uuid.uuid4().hex[:8]}",
        prompt_token_ids=tuple(prompt),
        sampling=_sampling(max_tokens),
        request_class=RequestClass.INTERACTIVE,
        arrival_s=None,
    )
    text, ids = [], []
    async for delta in engine.generate(request):
        text.append(delta.new_text)
        ids += delta.new_token_ids
    return "".join(text), ids


def _chat_text(server: ServerProcess, model: str, max_tokens: int) -> tuple[str, str, int]:
    """(content, job id, content chunks) of one streamed greedy chat."""
    body = {
        "model": model,
        "messages": MESSAGES,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    parts, job_id, done = [], "", False
    with httpx.stream(
        "POST", server.url + "/v1/chat/completions", json=body, timeout=60
    ) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: {"):
                frame = json.loads(line[len("data: ") :])
                assert "error" not in frame, frame
                job_id = frame["id"]
                parts += [
                    c["delta"]["content"] for c in frame["choices"] if c["delta"].get("content")
                ]
    assert done
    return "".join(parts), job_id, len(parts)


# ---- counting at the server ------------------------------------------------------------------


class CommandLog(threading.Thread):
    """Every command the server receives between two markers, from MONITOR."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self._client = redis.Redis.from_url(url)
        self._marker = f"mark-{uuid.uuid4().hex[:8]}"
        self._seen: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._marks = 0
        # Set once MONITOR is on: a marker sent before then is never seen.
        self._monitoring = threading.Event()

    def run(self) -> None:
        with self._client.monitor() as monitor:  # type: ignore[no-untyped-call]
            self._monitoring.set()
            for command in monitor.listen():
                with self._cond:
                    if self._marker in command["command"]:
                        self._marks += 1
                        self._cond.notify_all()
                        if self._marks == 2:
                            return
                    elif self._marks == 1:
                        self._seen.append(command)

    def wait_monitoring(self) -> None:
        """Until MONITOR is on and the markers' connection is open (its HELLO, which MONITOR
        never lists, falls before any count)."""
        assert self._monitoring.wait(30), "MONITOR did not start"
        self._client.ping()

    def mark(self, marks: int) -> None:
        """Send marker number `marks` and wait until MONITOR has shown it."""
        assert self._monitoring.wait(30), "MONITOR did not start"
        self._client.echo(self._marker)
        with self._cond:
            assert self._cond.wait_for(lambda: self._marks >= marks, timeout=30)

    def between(self) -> list[dict[str, Any]]:
        self.join(30)
        self._client.close()
        return self._seen


def _script_names() -> dict[str, str]:
    folder = Path(__file__).parents[2] / "gateway" / "queue" / "scripts"
    return {hashlib.sha1(p.read_bytes()).hexdigest(): p.stem for p in folder.glob("*.lua")}


def _names(commands: list[dict[str, Any]]) -> Counter[str]:
    """Commands by name; a script call by its script's name."""
    scripts = _script_names()
    names: Counter[str] = Counter()
    for command in commands:
        words = command["command"].split(" ")
        name = words[0].lower()
        if name == "evalsha" and len(words) > 1:
            name = "evalsha:" + scripts.get(words[1], words[1][:8])
        names[name] += 1
    return names


@pytest.fixture
def quiet_server(
    tiny_model_dir: Path, tmp_path: Path
) -> Iterator[tuple[ServerProcess, redis.Redis, str]]:
    """One replica on a redis-server of its own (MONITOR then sees this replica alone)."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not on PATH")
    proc, port = start_redis(binary, tmp_path / "redis")
    url = f"redis://127.0.0.1:{port}/0"
    server = ServerProcess(
        tiny_model_dir, url, cluster_prefix(), tmp_path / "srv", extra_env=QUIET_ENV
    )
    try:
        server.start()
        yield server, redis_client(url), url
    finally:
        server.stop()
        stop_process(proc)


def _groups(commands: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Each client command with the commands its script ran (MONITOR lists those right after
    it: Redis runs a script to its end before anything else)."""
    groups: list[list[dict[str, Any]]] = []
    for command in commands:
        if command["client_type"] == "lua" and groups:
            groups[-1].append(command)
        else:
            groups.append([command])
    return groups


# What an idle replica sends on its own: the wake-up wait, the empty claim after its timeout
# (a script call and the queue heads it reads), health pings, a new connection's HELLO.
_IDLE_COMMANDS = {"bzpopmin", "evalsha", "zrange", "ping", "hello"}


def _calls_by_name(client: redis.Redis) -> Counter[str]:
    """INFO commandstats: calls so far per command name (the counter's own INFO left out)."""
    stats = client.info("commandstats")
    return Counter(
        {
            name.removeprefix("cmdstat_"): int(entry["calls"])
            for name, entry in stats.items()
            if isinstance(entry, dict) and name != "cmdstat_info"
        }
    )


def _is_idle(group: list[dict[str, Any]], scripts: dict[str, str]) -> bool:
    """The idle dispatcher's own traffic: its 1 s wake-up wait, and the claim after each
    timeout that finds nothing (no ZREM: it took no job)."""
    words = group[0]["command"].split(" ")
    name = words[0].lower()
    if name == "bzpopmin":
        return True
    claim = name == "evalsha" and len(words) > 1 and scripts.get(words[1]) == "claim"
    return claim and not any(c["command"].lower().startswith("zrem ") for c in group[1:])


@pytest.mark.slow
async def test_a_streamed_chat_on_one_replica_costs_at_most_11_redis_commands(
    quiet_server: tuple[ServerProcess, redis.Redis, str], engine: AsyncEngine
) -> None:
    server, client, url = quiet_server
    model = model_name(server)
    await asyncio.to_thread(_chat_text, server, model, 4)  # warm: first-request paths
    log = CommandLog(url)
    log.start()
    log.wait_monitoring()
    before = _calls_by_name(client)
    log.mark(1)
    text, job_id, chunks = await asyncio.to_thread(_chat_text, server, model, MAX_TOKENS)
    log.mark(2)
    after = _calls_by_name(client)
    scripts = _script_names()
    groups = _groups(log.between())
    # NOTE: the idle replica's own traffic (its dispatcher's 1 s wake-up wait and the empty
    # claim after each timeout, pings) lands in any window, more of it the slower this CPU:
    # MONITOR says which commands were the chat's, and those are counted, with the commands
    # their scripts ran. The chat itself never wakes the dispatcher (a chat with a free slot
    # here starts at once: no queue entry, no wake-up), which is asserted below.
    chat = [c for g in groups if not _is_idle(g, scripts) for c in g]
    per_chat = len(chat)
    print(
        f"\nredis commands per {MAX_TOKENS}-token chat (at the server): {per_chat} {_names(chat)}"
    )
    assert per_chat <= 11, [c["command"][:80] for c in chat]
    # INFO commandstats agrees: beside the chat's commands and the two markers, the server
    # ran only idle traffic over the window.
    by_name = Counter(c["command"].split(" ")[0].lower() for c in chat)
    by_name["echo"] += 2
    rest = Counter({name: after[name] - before.get(name, 0) for name in after}) - by_name
    assert set(rest) <= _IDLE_COMMANDS, rest
    assert all(after[name] - before.get(name, 0) >= n for name, n in by_name.items())
    # Three round trips: start (admit + lease), first token marked, fenced complete.
    round_trips = [g[0] for g in groups if not _is_idle(g, scripts)]
    assert len(round_trips) == 3, _names(round_trips)
    names = _names(chat)
    # The start draws its lease token itself: no INCR of the shared fence counter.
    assert names["incr"] == 0
    # Delivered in-process: the chat's tokens never went through Redis (no XADD, no XREAD).
    assert names["xadd"] == 0 and names["xread"] == 0
    assert not client.exists(Keys(server.key_prefix).out(job_id))
    wake_keys = [Keys(server.key_prefix).wake(c) for c in RequestClass]
    assert not any(key in c["command"] for c in chat for key in wake_keys)
    expected_text, _ = await _reference(engine, MAX_TOKENS)
    assert text == expected_text and chunks > 0
    record = client.hgetall(Keys(server.key_prefix).job(job_id))
    assert (record["status"], record["attempts"], record["tokens_sent"]) == ("completed", "1", "1")


# ---- two replicas: the chat's job runs on the other one ----------------------------------------


@pytest.fixture(scope="module")
def pair(
    tiny_model_dir: Path, redis_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, ServerProcess, redis.Redis]]:
    tmp = tmp_path_factory.mktemp("delivery")
    prefix = cluster_prefix()
    # A claims only bulk work: a chat sent to A runs on B.
    a = replica(tiny_model_dir, redis_server, prefix, tmp, "A", claim="bulk")
    b = replica(tiny_model_dir, redis_server, prefix, tmp, "B")
    start_all(a, b)
    client = redis_client(redis_server)
    try:
        yield a, b, client
    finally:
        client.close()
        a.stop()
        b.stop()


@pytest.mark.slow
async def test_a_chat_run_by_another_replica_streams_every_token_exactly_once(
    pair: tuple[ServerProcess, ServerProcess, redis.Redis], engine: AsyncEngine
) -> None:
    a, _, client = pair
    text, job_id, _ = await asyncio.to_thread(_chat_text, a, model_name(a), MAX_TOKENS)
    expected_text, expected_ids = await _reference(engine, MAX_TOKENS)
    assert client.hget(Keys(a.key_prefix).job(job_id), "replica") == "B"
    assert text == expected_text
    # On the stream: every token once, in order, then one END.
    entries: Any = client.xrange(Keys(a.key_prefix).out(job_id))
    kinds = [fields["e"] for _, fields in entries]
    ids = [t for _, f in entries if f["e"] == DELTA for t in json.loads(f["d"])["token_ids"]]
    assert ids == expected_ids and kinds.count(END) == 1 and kinds[-1] == END


@pytest.mark.slow
def test_a_bulk_job_writes_no_stream_entries(
    pair: tuple[ServerProcess, ServerProcess, redis.Redis],
) -> None:
    a, b, client = pair
    ids = []
    with httpx.Client(timeout=30) as http:
        for server in (a, b):
            body = {"model": model_name(server), "messages": MESSAGES, "max_tokens": 16}
            body |= {"temperature": 0, "ignore_eos": True}
            response = http.post(server.url + "/v1/jobs", json=body)
            assert response.status_code == 202, response.text
            ids.append(response.json()["id"])
    done = wait_terminal(client, a.key_prefix, ids)
    assert {f["status"] for f in done.values()} == {"completed"}
    assert all(json.loads(f["result"])["usage"]["completion_tokens"] == 16 for f in done.values())
    assert not any(client.exists(Keys(a.key_prefix).out(i)) for i in ids)


# ---- in-process: the publisher and the dispatcher's routes ---------------------------------


async def test_appends_of_one_tick_leave_in_one_pipeline_in_order(
    aclient: aioredis.Redis, keys: Keys
) -> None:
    streams = TokenStreams(aclient, keys.out, ttl_s=60)
    jobs = [f"j{i}" for i in range(8)]

    async def two(job_id: str) -> None:
        await streams.batched.publish(job_id, DELTA, {"text": "a", "token_ids": [1]})
        await streams.batched.publish(job_id, END, {"finish_reason": "length", "usage": {}})

    await asyncio.gather(*(two(j) for j in jobs))
    # Eight deltas in the first tick, eight ENDs in the next: two pipelines, not sixteen.
    assert streams.batched.flushes == 2
    for job_id in jobs:
        events = [e.kind async for e in streams.read(job_id, block_ms=100)]
        assert events == [DELTA, END]
        assert await aclient.ttl(keys.out(job_id)) > 0


async def _admit_chat(store: QueueStore, max_tokens: int, prompt: tuple[int, ...]) -> str:
    job_id = f"chatcmpl-{uuid.uuid4().hex[:10]}"
    payload = JobPayload(
        prompt_token_ids=prompt,
        sampling=_sampling(max_tokens),
        model="tiny",
        created_s=0,
        extra={WATCHED_KEY: True},
    )
    job = NewJob(
        job_id=job_id,
        tenant="t1",
        request_class=RequestClass.INTERACTIVE,
        request_json=payload.to_json(),
        enqueue_ms=int(time.time() * 1000),
        cost_tokens=payload.cost_tokens,
        queue_limit=1000,
    )
    assert (await store.admit(job)).admitted
    return job_id


def _dispatcher(store: QueueStore, streams: TokenStreams, engine: AsyncEngine) -> Dispatcher:
    config = DispatcherConfig(
        replica_id="r1",
        max_active_by_class={RequestClass.INTERACTIVE: 4, RequestClass.BULK: 4},
    )
    return Dispatcher(store, streams, engine, config, redis=store._redis)  # noqa: SLF001


async def _collect(events: AsyncIterator[StreamEvent]) -> list[StreamEvent]:
    async with asyncio.timeout(30):
        return [event async for event in events]


async def test_a_local_listener_gets_every_event_in_process_and_a_late_one_from_redis(
    aclient: aioredis.Redis, keys: Keys, engine: AsyncEngine
) -> None:
    store = QueueStore(aclient, keys)
    streams = TokenStreams(aclient, keys.out, ttl_s=60)
    prompt = tuple(engine.engine.tokenizer.encode_chat(MESSAGES))
    early = await _admit_chat(store, 12, prompt)
    listener = streams.local.listen(early)
    late = await _admit_chat(store, 12, prompt)
    await _dispatcher(store, streams, engine).run_until_idle()

    local_events = await _collect(listener.events())
    streams.local.forget(listener)
    # The early listener got everything in-process: nothing of it is in Redis.
    assert await aclient.exists(keys.out(early)) == 0
    # The late one registered after its job ran: the stream has it all, read back once.
    late_listener = streams.local.listen(late)
    late_events = await _collect(late_listener.events())
    streams.local.forget(late_listener)
    assert [e.kind for e in late_events] == [e.kind for e in local_events]
    expected_text, expected_ids = await _reference(engine, 12)
    for events in (local_events, late_events):
        assert events[-1].kind == END
        deltas = [e.data for e in events if e.kind == DELTA]
        assert "".join(d["text"] for d in deltas) == expected_text
        assert [t for d in deltas for t in d["token_ids"]] == expected_ids


async def _wait_marked(client: aioredis.Redis, keys: Keys, job_id: str) -> None:
    """Until the job's first token is recorded (bounded: a hang fails, speed does not)."""
    async with asyncio.timeout(30):
        while await client.hget(keys.job(job_id), "tokens_sent") != "1":
            await asyncio.sleep(0.01)


async def test_a_local_attempt_that_loses_its_lease_hands_its_listener_back_to_redis(
    aclient: aioredis.Redis, keys: Keys, engine: AsyncEngine
) -> None:
    store = QueueStore(aclient, keys)
    streams = TokenStreams(aclient, keys.out, ttl_s=60)
    now_ms = [int(time.time() * 1000)]
    lease_ms = 60_000
    config = DispatcherConfig(
        replica_id="r1",
        max_active_by_class={RequestClass.INTERACTIVE: 1, RequestClass.BULK: 1},
        lease_ms=lease_ms,
        # The lease loop's own rounds are far apart; the test drives renew_leases() itself.
        renew_interval_ms=30_000,
        reclaim_interval_ms=3_600_000,
    )
    dispatcher = Dispatcher(
        store, streams, engine, config, redis=aclient, clock_ms=lambda: now_ms[0]
    )
    job_id = await _admit_chat(store, 600, tuple(engine.engine.tokenizer.encode_chat(MESSAGES)))
    listener = streams.local.listen(job_id)
    events = listener.events()
    await dispatcher.start()
    try:
        first = await anext(events)
        assert first.kind == DELTA and first.entry_id == ""  # in-process
        await _wait_marked(aclient, keys, job_id)
        # This replica stalls past its lease: a sweep fails the started stream (it told the
        # stream, in Redis), and the next renewal finds the lease gone.
        now_ms[0] += lease_ms + 1
        assert (await dispatcher.reclaim_lapsed()).failed_ids == (job_id,)
        await dispatcher.renew_leases()
        rest = await _collect(events)
    finally:
        streams.local.forget(listener)
        await dispatcher.stop(drain_timeout_s=20.0)
    assert {e.kind for e in rest[:-1]} <= {DELTA}
    assert (rest[-1].kind, rest[-1].data["code"]) == ("error", "lease_lost_after_first_token")
    # The fenced attempt wrote nothing to the stream; the sweep wrote its one last event.
    entries: Any = await aclient.xrange(keys.out(job_id))
    assert [f["e"] for _, f in entries] == ["error"]
