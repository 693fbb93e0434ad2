"""The asyncio bridge: streaming deltas, the step thread, cancellation, aborts, shutdown."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from pathlib import Path

import pytest

from engine.core.config import EngineConfig
from engine.core.errors import EngineDeadError, RequestValidationError
from engine.core.llm_engine import LLMEngine
from engine.core.request import GenerationRequest, RequestOutput
from engine.core.sampling_params import SamplingParams
from engine.process.async_engine import AsyncEngine

pytestmark = pytest.mark.anyio

PROMPT = tuple(b"Streaming tokens to a client")
# Long enough that a consumer acting after a few deltas always catches it mid-stream.
LONG = SamplingParams(max_tokens=900, temperature=0.0, ignore_eos=True)


@pytest.fixture
def engine(tiny_model_dir: Path) -> LLMEngine:
    # One torch thread: see the NOTE in test_engine_requests.py.
    config = EngineConfig(device="cpu", num_kv_blocks=128, num_threads=1)
    return LLMEngine(tiny_model_dir, config)


@asynccontextmanager
async def running(engine: LLMEngine) -> AsyncIterator[AsyncEngine]:
    async_engine = AsyncEngine(engine)
    await async_engine.start()
    try:
        yield async_engine
    finally:
        await asyncio.wait_for(async_engine.stop(), timeout=10)


async def _collect(async_engine: AsyncEngine, request: GenerationRequest) -> list[RequestOutput]:
    return [output async for output in async_engine.generate(request)]


async def _poll(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Bounded polling for a condition another thread makes true."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


def _all_blocks_free(engine: LLMEngine) -> Callable[[], bool]:
    manager = engine.block_manager
    return lambda: manager.num_free_blocks == manager.num_blocks


def _record_aborts(engine: LLMEngine, monkeypatch: pytest.MonkeyPatch) -> list[RequestOutput]:
    """Instrument (not replace) abort_request: keep what each real abort returned."""
    aborted: list[RequestOutput] = []
    real_abort = engine.abort_request

    def abort_request(request_id: str) -> RequestOutput | None:
        output = real_abort(request_id)
        if output is not None:
            aborted.append(output)
        return output

    monkeypatch.setattr(engine, "abort_request", abort_request)
    return aborted


async def test_streamed_deltas_concatenate_to_the_sync_greedy_output(
    engine: LLMEngine, tiny_model_dir: Path
) -> None:
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    request = GenerationRequest("stream", PROMPT, params)

    reference = LLMEngine(tiny_model_dir, engine.config)
    reference.add_request(request)
    sync_outputs: list[RequestOutput] = []
    while reference.has_unfinished_requests():
        sync_outputs.extend(reference.step())

    async with running(engine) as async_engine:
        deltas = await asyncio.wait_for(_collect(async_engine, request), timeout=30)

    assert len(deltas) > 1  # streamed, not one lump
    assert [d.finished for d in deltas] == [False] * (len(deltas) - 1) + [True]
    assert deltas[-1].finish_reason == "length"
    tokens = [t for d in deltas for t in d.new_token_ids]
    assert tokens == [t for o in sync_outputs for t in o.new_token_ids]
    assert len(tokens) == 40
    assert "".join(d.new_text for d in deltas) == "".join(o.new_text for o in sync_outputs)
    assert _all_blocks_free(engine)()


async def test_steps_run_off_the_event_loop_which_keeps_running(
    engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    step_threads: set[tuple[int, str]] = set()
    in_step = threading.Event()
    loop_ran_during_step = threading.Event()
    real_step = engine.step

    def step() -> list[RequestOutput]:
        step_threads.add((threading.get_ident(), threading.current_thread().name))
        if not loop_ran_during_step.is_set():
            # Hold this step until the event loop proves it is alive. Were the step on the
            # loop's thread, this would time out and kill the engine (and fail the test).
            in_step.set()
            if not loop_ran_during_step.wait(timeout=10):
                raise RuntimeError("the event loop did not run while a step was in progress")
        return real_step()

    monkeypatch.setattr(engine, "step", step)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            if in_step.is_set():
                loop_ran_during_step.set()
            await asyncio.sleep(0.001)

    params = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
    ticks_at_delta: list[int] = []
    async with running(engine) as async_engine:
        ticker_task = asyncio.create_task(ticker())
        try:
            request = GenerationRequest("long", PROMPT, params)
            async for _ in async_engine.generate(request):
                ticks_at_delta.append(ticks)
        finally:
            ticker_task.cancel()

    assert loop_ran_during_step.is_set()
    assert len(ticks_at_delta) == 200
    assert ticks_at_delta[-1] > ticks_at_delta[0]  # the loop ran between deltas too
    loop_thread = threading.get_ident()
    assert step_threads and all(ident != loop_thread for ident, _ in step_threads)
    assert {name for _, name in step_threads} == {"mixgate-engine"}


async def test_cancelling_the_consumer_aborts_and_frees_blocks(
    engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    aborted = _record_aborts(engine, monkeypatch)
    three_deltas = asyncio.Event()

    async def consume(async_engine: AsyncEngine) -> None:
        count = 0
        async for _ in async_engine.generate(GenerationRequest("cancelled", PROMPT, LONG)):
            count += 1
            if count == 3:
                three_deltas.set()

    async with running(engine) as async_engine:
        task = asyncio.create_task(consume(async_engine))
        await asyncio.wait_for(three_deltas.wait(), timeout=30)
        assert engine.block_manager.num_free_blocks < engine.block_manager.num_blocks
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await _poll(_all_blocks_free(engine), timeout_s=1.0)
        assert await _poll(lambda: bool(aborted), timeout_s=1.0)
        assert not engine.has_unfinished_requests()

    assert [(o.request_id, o.finish_reason) for o in aborted] == [("cancelled", "abort")]
    assert 3 <= aborted[0].num_output_tokens < LONG.max_tokens
    engine.block_manager.check_invariants()


async def test_breaking_out_of_the_stream_aborts_and_frees_blocks(
    engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    aborted = _record_aborts(engine, monkeypatch)
    async with running(engine) as async_engine:
        request = GenerationRequest("left", PROMPT, LONG)
        async with aclosing(async_engine.generate(request)) as stream:
            async for output in stream:
                assert not output.finished
                break
        assert await _poll(_all_blocks_free(engine), timeout_s=1.0)
        assert await _poll(lambda: bool(aborted), timeout_s=1.0)
        # The id is free again once the stream is closed.
        short = GenerationRequest("left", PROMPT, SamplingParams(max_tokens=3))
        outputs = await asyncio.wait_for(_collect(async_engine, short), timeout=30)
        assert sum(len(o.new_token_ids) for o in outputs) == 3

    assert aborted[0].finish_reason == "abort"
    assert aborted[0].num_output_tokens < LONG.max_tokens


async def test_abort_from_outside_ends_the_stream_with_abort(engine: LLMEngine) -> None:
    async with running(engine) as async_engine:
        deltas: list[RequestOutput] = []

        async def consume() -> None:
            async for output in async_engine.generate(GenerationRequest("victim", PROMPT, LONG)):
                deltas.append(output)
                if len(deltas) == 2:
                    async_engine.abort("victim")

        await asyncio.wait_for(consume(), timeout=30)
        assert await _poll(_all_blocks_free(engine), timeout_s=1.0)

    final = deltas[-1]
    assert (final.finished, final.finish_reason) == (True, "abort")
    assert final.new_token_ids == []
    assert 2 <= final.num_output_tokens < LONG.max_tokens
    assert final.metrics is not None and final.metrics.finished_s is not None


async def test_validation_errors_raise_at_generate_before_anything_runs(
    engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = 0
    real_step = engine.step

    def step() -> list[RequestOutput]:
        nonlocal steps
        steps += 1
        return real_step()

    monkeypatch.setattr(engine, "step", step)
    too_long = GenerationRequest("too-long", (65,) * 1024)
    async with running(engine) as async_engine:
        with pytest.raises(RequestValidationError) as caught:
            await async_engine.generate(too_long).__anext__()
        assert caught.value.code == "context_length_exceeded"
        with pytest.raises(RequestValidationError, match=r"\[0, 259\)"):
            await async_engine.generate(GenerationRequest("oov", (300,))).__anext__()
        assert steps == 0
        assert not engine.has_unfinished_requests()

        # A duplicate of a running id is refused while the first stream goes on unharmed.
        request = GenerationRequest("twice", PROMPT, SamplingParams(max_tokens=30))
        async with aclosing(async_engine.generate(request)) as first:
            head = await first.__anext__()
            with pytest.raises(RequestValidationError) as duplicate:
                await async_engine.generate(request).__anext__()
            assert duplicate.value.code == "duplicate_id"
            rest = [output async for output in first]
        assert rest[-1].finished
        assert len(head.new_token_ids) + sum(len(o.new_token_ids) for o in rest) == 30


async def test_many_concurrent_generations_all_finish(engine: LLMEngine) -> None:
    requests = [
        GenerationRequest(
            f"c{i}",
            tuple((i * 13 + j) % 256 for j in range(5 + 3 * i)),
            SamplingParams(max_tokens=8 + i, temperature=0.0 if i % 2 else 1.0, ignore_eos=True),
        )
        for i in range(16)
    ]
    async with running(engine) as async_engine:
        results = await asyncio.wait_for(
            asyncio.gather(*(_collect(async_engine, r) for r in requests)), timeout=60
        )
        assert await _poll(_all_blocks_free(engine), timeout_s=1.0)

    for request, outputs in zip(requests, results, strict=True):
        assert all(o.request_id == request.request_id for o in outputs)
        assert outputs[-1].finished and outputs[-1].finish_reason == "length"
        assert sum(len(o.new_token_ids) for o in outputs) == request.sampling.max_tokens
    assert engine.history.total_steps > 0
    engine.block_manager.check_invariants()


async def test_stop_joins_the_engine_thread(engine: LLMEngine) -> None:
    async_engine = AsyncEngine(engine)
    with pytest.raises(EngineDeadError):
        await async_engine.generate(GenerationRequest("early", PROMPT)).__anext__()
    threads_before = set(threading.enumerate())
    await async_engine.start()
    assert async_engine.is_running
    [thread] = [t for t in threading.enumerate() if t not in threads_before]
    assert thread.name == "mixgate-engine"
    outputs = await asyncio.wait_for(
        _collect(async_engine, GenerationRequest("one", PROMPT, SamplingParams(max_tokens=4))),
        timeout=30,
    )
    assert outputs[-1].finished
    await asyncio.wait_for(async_engine.stop(), timeout=10)
    assert not thread.is_alive()
    assert not async_engine.is_running
    # A stopped engine refuses work instead of queueing it for a thread that is gone.
    with pytest.raises(EngineDeadError):
        await asyncio.wait_for(
            async_engine.generate(GenerationRequest("late", PROMPT)).__anext__(), timeout=5
        )
