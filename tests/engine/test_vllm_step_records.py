"""The vLLM scheduler's per-class step records, and the channel that carries them (no vLLM:
requests are stand-ins with vLLM `Request`'s attributes; the channel is real ZeroMQ)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest

from engine.backends.vllm.step_channel import (
    SEND_QUEUE_RECORDS,
    StepReceiver,
    StepSender,
    cancel_quietly,
)
from engine.backends.vllm.step_records import StepRecorder, tokens_by_kind
from engine.core.step_record import StepRecord
from policies.request_class import RequestClass

INTER, BULK = RequestClass.INTERACTIVE, RequestClass.BULK


@dataclass
class FakeVllmRequest:
    """What StepRecorder reads of vLLM's Request, as it stands once schedule() returned."""

    priority: int
    num_prompt_tokens: int
    num_output_tokens: int
    # Already advanced by this step's tokens, as vLLM's _update_after_schedule leaves it.
    num_computed_tokens: int

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens


def test_a_prompt_chunk_is_prefill_and_its_last_chunk_too() -> None:
    requests = {
        # 128 of a 300-token prompt, the first chunk.
        "first": FakeVllmRequest(1, 300, 0, num_computed_tokens=128),
        # The last 44 tokens of a 300-token prompt: they sample its first token, still prefill.
        "last": FakeVllmRequest(0, 300, 0, num_computed_tokens=300),
    }
    counts = tokens_by_kind({"first": 128, "last": 44}, requests)
    assert counts == {(BULK, "prefill"): 128, (INTER, "prefill"): 44}


def test_a_decode_is_one_token_and_a_recompute_after_preemption_is_prefill() -> None:
    requests = {
        "decoding": FakeVllmRequest(0, 50, 7, num_computed_tokens=57),
        # Preempted after 20 outputs: it recomputes prompt and outputs, 64 tokens this step.
        "resumed": FakeVllmRequest(1, 100, 20, num_computed_tokens=64),
        # ... and its last recompute chunk ends on its newest token, which samples the next.
        "resumed_last": FakeVllmRequest(1, 100, 20, num_computed_tokens=120),
    }
    counts = tokens_by_kind({"decoding": 1, "resumed": 64, "resumed_last": 56}, requests)
    assert counts == {(INTER, "decode"): 1, (BULK, "prefill"): 64 + 55, (BULK, "decode"): 1}


def test_requests_gone_or_given_nothing_count_for_nothing() -> None:
    requests = {"here": FakeVllmRequest(1, 10, 3, num_computed_tokens=13)}
    assert tokens_by_kind({"gone": 5, "here": 0}, requests) == {}


def _schedule(recorder: StepRecorder, started_s: float, tokens: dict[str, int]) -> None:
    requests = {
        "chat": FakeVllmRequest(0, 20, 1, num_computed_tokens=21),
        "job": FakeVllmRequest(1, 500, 0, num_computed_tokens=tokens.get("job", 0)),
    }
    recorder.scheduled(
        started_s=started_s,
        scheduled_tokens=tokens,
        requests=requests,
        running=list(requests.values()),
        waiting=[FakeVllmRequest(1, 9, 0, num_computed_tokens=0)],
        kv_usage=0.25,
        num_preemptions=0,
    )


def test_each_step_is_recorded_from_its_schedule_to_its_output_in_order() -> None:
    recorder = StepRecorder()
    # Two steps scheduled before the first one's output (a batch queue), then one with nothing.
    _schedule(recorder, 10.0, {"chat": 1, "job": 128})
    _schedule(recorder, 10.5, {"chat": 1})
    _schedule(recorder, 11.0, {})
    first, second = recorder.ended(10.75), recorder.ended(11.25)
    assert recorder.ended(11.5) is None  # the empty step: no record
    assert recorder.ended(12.0) is None  # no step pending
    assert first is not None and second is not None
    assert (first.step_index, first.started_s, first.duration_s) == (0, 10.0, 0.75)
    assert first.tokens_by_kind == {(INTER, "decode"): 1, (BULK, "prefill"): 128}
    assert first.running_by_class == {INTER: 1, BULK: 1}
    assert first.waiting_by_class == {INTER: 0, BULK: 1}
    assert first.kv_usage == 0.25
    assert (second.step_index, second.duration_s) == (1, 0.75)
    assert second.tokens_by_kind == {(INTER, "decode"): 1}


def _record(index: int) -> StepRecord:
    return StepRecord(
        step_index=index,
        started_s=100.0 + index,
        duration_s=0.01,
        tokens_by_kind={(INTER, "prefill"): 40 + index, (BULK, "decode"): 3},
        running_by_class={INTER: 1, BULK: 3},
        waiting_by_class={INTER: 0, BULK: 0},
        kv_usage=0.5,
        num_preemptions=0,
    )


@contextlib.asynccontextmanager
async def _channel(on_record: Callable[[StepRecord], None]) -> AsyncIterator[StepSender]:
    """A receiver reading into `on_record`, and a sender connected to it."""
    receiver = StepReceiver()
    task = asyncio.create_task(receiver.run(on_record))
    sender = StepSender(receiver.address)
    try:
        yield sender
    finally:
        sender.close()
        await cancel_quietly(task)
        receiver.close()


@pytest.mark.anyio
async def test_records_sent_from_the_engine_core_arrive_whole_and_in_order() -> None:
    got: list[StepRecord] = []
    all_in = asyncio.Event()

    def on_record(record: StepRecord) -> None:
        got.append(record)
        if len(got) == 50:
            all_in.set()

    async with _channel(on_record) as sender:
        sent = [_record(i) for i in range(50)]
        for record in sent:
            sender.send(record)
        await asyncio.wait_for(all_in.wait(), timeout=30)
        assert got == sent
        assert sender.dropped == 0


def test_a_step_never_waits_for_a_gateway_that_is_not_reading(tmp_path: object) -> None:
    # Nobody reads: ZeroMQ queues up to the send queue's size, and the sender drops the rest
    # instead of blocking the step.
    sender = StepSender(f"ipc://{tmp_path}/nobody")
    try:
        for index in range(SEND_QUEUE_RECORDS + 10):
            sender.send(_record(index))
        assert sender.dropped == 10
    finally:
        sender.close()


@pytest.mark.anyio
async def test_a_failing_reader_of_one_record_does_not_stop_the_next() -> None:
    got: list[StepRecord] = []
    both_in = asyncio.Event()

    def on_record(record: StepRecord) -> None:
        if record.step_index == 0:
            raise RuntimeError("a listener's bug")
        got.append(record)
        both_in.set()

    async with _channel(on_record) as sender:
        sender.send(_record(0))
        sender.send(_record(1))
        await asyncio.wait_for(both_in.wait(), timeout=30)
        assert got == [_record(1)]
        # The reader is still running: a third record gets through too.
        both_in.clear()
        sender.send(_record(2))
        await asyncio.wait_for(both_in.wait(), timeout=30)
        assert got == [_record(1), _record(2)]
