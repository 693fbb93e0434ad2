"""The engine core in its own process: the same tokens as the in-thread engine, and what a
dying engine process does to the replica (not ready, streams end with an error event, jobs
complete exactly once after a restart). Real processes, real Redis."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from engine.core.config import EngineConfig
from engine.core.errors import EngineDeadError, RequestValidationError
from engine.core.llm_engine import LLMEngine
from engine.core.request import GenerationRequest, RequestOutput
from engine.core.sampling_params import SamplingParams
from engine.process.async_engine import AsyncEngine
from engine.process.client import EngineCoreClient
from engine.process.omp_wait import ENGINE_GOMP_SPINCOUNT
from policies.request_class import RequestClass
from tests.child_processes import alive, engine_child, wait_gone
from tests.replica_cluster import (
    SseReader,
    cluster_prefix,
    ledger,
    model_name,
    redis_client,
    replica,
    small_envelope,
    submit_jobs,
    wait_terminal,
    wait_until_running_on,
)

CONFIG = EngineConfig(device="cpu", num_kv_blocks=128, num_threads=1)
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
LONG = SamplingParams(max_tokens=900, temperature=0.0, ignore_eos=True)


@asynccontextmanager
async def core_client(
    model_dir: Path, config: EngineConfig = CONFIG
) -> AsyncIterator[EngineCoreClient]:
    client = EngineCoreClient(model_dir, config)
    await client.start()
    try:
        yield client
    finally:
        await asyncio.wait_for(client.stop(), timeout=30)


async def _tokens(engine: AsyncEngine | EngineCoreClient, request: GenerationRequest) -> list[int]:
    outputs: list[RequestOutput] = [o async for o in engine.generate(request)]
    assert outputs[-1].finished and all(not o.finished for o in outputs[:-1])
    return [t for o in outputs for t in o.new_token_ids]


def _requests() -> list[GenerationRequest]:
    prompts = [b"The same tokens", b"through a process boundary", b"as on a thread", b"x" * 90]
    return [
        GenerationRequest(
            f"r{i}", tuple(p), GREEDY, RequestClass.BULK if i % 2 else RequestClass.INTERACTIVE
        )
        for i, p in enumerate(prompts)
    ]


@pytest.mark.anyio
async def test_greedy_outputs_equal_the_in_thread_engines(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The client makes its socket folder in a temp dir of this test's own: /tmp is shared with
    # the other xdist workers, whose engine cores make and remove theirs meanwhile (CI, stop 35).
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    in_thread = AsyncEngine(LLMEngine(tiny_model_dir, CONFIG))
    await in_thread.start()
    try:
        expected = await asyncio.gather(*(_tokens(in_thread, r) for r in _requests()))
    finally:
        await in_thread.stop()
    async with core_client(tiny_model_dir) as client:
        # The socket files are gone once the child is ready (a SIGKILLed gateway leaves none),
        # and the connections they made carry every request after.
        assert not list(tmp_path.glob("mixgate-engine-*"))
        got = await asyncio.gather(*(_tokens(client, r) for r in _requests()))
        load = client.load()
    assert got == expected and all(len(t) == GREEDY.max_tokens for t in got)
    # The load snapshot rode on the step messages: every block is free again.
    assert load.steps > 0 and load.num_free_blocks == CONFIG.num_kv_blocks
    # A fixed thread count is not reported as an adapted one.
    assert load.threads is None


@pytest.mark.anyio
async def test_an_engine_core_adapting_its_threads_says_how_many_and_keeps_the_tokens(
    tiny_model_dir: Path,
) -> None:
    # How many it picks depends on this machine's load; that it reports a count it may run
    # on, and that the tokens are the fixed count's (test_step_thread_count.py: the same bits
    # on any count), do not.
    config = dataclasses.replace(CONFIG, num_threads=2)
    in_thread = AsyncEngine(LLMEngine(tiny_model_dir, config))
    await in_thread.start()
    try:
        expected = await asyncio.gather(*(_tokens(in_thread, r) for r in _requests()))
    finally:
        await in_thread.stop()
    async with core_client(
        tiny_model_dir, dataclasses.replace(config, adapt_threads=True)
    ) as client:
        got = await asyncio.gather(*(_tokens(client, r) for r in _requests()))
        load = client.load()
    assert got == expected
    assert load.threads in (1, 2)


@pytest.mark.anyio
async def test_validation_abort_and_a_dead_child(tiny_model_dir: Path) -> None:
    async with core_client(tiny_model_dir) as client:
        assert client.engine is not None and client.engine.max_model_len > 0
        too_long = GenerationRequest("long", tuple(range(1, 2)), SamplingParams(max_tokens=10**6))
        with pytest.raises(RequestValidationError):
            await _tokens(client, too_long)
        # Leaving a stream early aborts the request in the child, which frees its blocks.
        stream = client.generate(GenerationRequest("abandoned", tuple(b"abc"), LONG))
        async for _ in stream:
            break
        await stream.aclose()  # type: ignore[attr-defined]
        deadline = time.monotonic() + 30
        while client.load().num_free_blocks != CONFIG.num_kv_blocks:
            assert time.monotonic() < deadline, client.load()
            await asyncio.sleep(0.01)

        pid = client.pid
        assert pid is not None
        # The child's OpenMP threads spin briefly, then sleep (engine/process/omp_wait.py).
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert f"GOMP_SPINCOUNT={ENGINE_GOMP_SPINCOUNT}".encode() in environ
        received = 0
        with pytest.raises(EngineDeadError):
            async for _ in client.generate(GenerationRequest("killed", tuple(b"abc"), LONG)):
                received += 1
                if received == 3:
                    os.kill(pid, signal.SIGKILL)
        assert not client.is_running and "code -9" in (client.death_reason or "")
        with pytest.raises(EngineDeadError):
            await _tokens(client, GenerationRequest("after", tuple(b"abc"), GREEDY))
    assert not alive(pid)


@pytest.mark.redis
@pytest.mark.slow
def test_engine_death_unready_streams_end_jobs_complete_once_after_restart(
    tiny_model_dir: Path, redis_server: str, tmp_path: Path
) -> None:
    prefix = cluster_prefix()
    envelope = small_envelope(tmp_path, max_active_seqs=4, reserved=1)
    server = replica(tiny_model_dir, redis_server, prefix, tmp_path, "V", envelope=envelope)
    server.start()
    store = redis_client(redis_server)
    try:
        model = model_name(server)
        jobs = submit_jobs(server, model, 6, 900, "dies")
        reader = SseReader(server, model, 900, "dies")
        reader.start()
        assert reader.first_token.wait(60) and reader.failure is None, reader.errors
        held = wait_until_running_on(store, prefix, jobs, "V")
        assert server.process is not None
        engine_pid = engine_child(server.process.pid)
        os.kill(engine_pid, signal.SIGKILL)
        killed_s = time.monotonic()

        # Not ready at once (bounded generously: the verdict is that it turns 503), and no
        # request is accepted afterwards.
        deadline = killed_s + 30
        while (ready := httpx.get(server.url + "/readyz", timeout=5)).status_code != 503:
            assert time.monotonic() < deadline, ready.text
            time.sleep(0.01)
        assert any("engine stopped" in r for r in ready.json()["reasons"]), ready.text
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(server.url + "/v1/chat/completions", json=body).status_code == 503
        assert httpx.post(server.url + "/v1/jobs", json=body).status_code == 503

        # The open stream ends with an error event, then [DONE].
        reader.join(60)
        assert not reader.is_alive() and reader.failure is None
        assert len(reader.errors) == 1 and reader.done, reader.errors
        assert reader.errors[0]["type"] == "server_error", reader.errors
        assert server.process.poll() is None  # the gateway lives on, not ready
    finally:
        server.stop()

    restarted = replica(tiny_model_dir, redis_server, prefix, tmp_path, "V2", envelope=envelope)
    restarted.start()
    try:
        done = wait_terminal(store, prefix, jobs, 120)
        assert {f["status"] for f in done.values()} == {"completed"}, restarted.logs()
        assert all(done[i]["replica"] == "V2" and done[i]["attempts"] == "2" for i in held)
        chats = [reader.job_id] if reader.job_id else []
        outcomes, twice = ledger(store, prefix, [*jobs, *chats])
        assert outcomes == {"completed": len(jobs), "failed": len(chats)} and twice == []
    finally:
        restarted.stop()
        store.close()
    assert wait_gone([engine_pid], 10) == []


@pytest.mark.anyio
async def test_a_child_that_cannot_load_the_model_fails_start_and_exits(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")  # no weights, no tokenizer
    client = EngineCoreClient(tmp_path, CONFIG)
    with pytest.raises(EngineDeadError, match="did not start|failed to start"):
        await client.start()
    assert client.pid is not None and wait_gone([client.pid], 10) == []
    assert not client.is_running
