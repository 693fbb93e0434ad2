"""Step records from vLLM's engine-core process to the gateway: one ZeroMQ PUSH/PULL pair.

The class-aware scheduler runs in vLLM's engine-core process, which the gateway reaches only
through vLLM's own output stream, and that carries no field for mixgate's per-class step
composition. So the scheduler pushes each step's `StepRecord` (msgspec msgpack, as the native
engine's process boundary does, `engine.process.messages`) to a socket the gateway binds before
vLLM starts, and passes to it in `additional_config`.

A step must never wait for the gateway: the sender drops a record rather than block when the
gateway is not reading (it counts them), and a record lost so only thins the step history.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec
import structlog
import zmq
import zmq.asyncio

from engine.core.step_record import StepRecord

__all__ = ["StepNotice", "StepReceiver", "StepSender", "cancel_quietly"]

log = structlog.get_logger("mixgate.engine")

# Records the sender keeps queued for a slow (or not yet connected) reader before it drops new
# ones: ~10 s of steps.
SEND_QUEUE_RECORDS = 1024


@dataclass(frozen=True, slots=True)
class StepNotice:
    """What a step listener is handed: the `steps` of the native engine's `StepOutputs`, which
    `gateway.http.metrics.engine_step_records` reads from either engine."""

    steps: tuple[StepRecord, ...]


class StepSender:
    """The engine-core side: `send` never blocks."""

    def __init__(self, address: str) -> None:
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.SNDHWM, SEND_QUEUE_RECORDS)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.connect(address)
        self._encoder = msgspec.msgpack.Encoder()
        self.dropped = 0

    def send(self, record: StepRecord) -> None:
        try:
            self._socket.send(self._encoder.encode(record), zmq.NOBLOCK)
        except zmq.Again:
            self.dropped += 1

    def close(self) -> None:
        self._socket.close(linger=0)
        self._context.term()


class StepReceiver:
    """The gateway side: binds an ipc socket in a folder of its own; `run` hands each record to
    `on_record` on the event loop until the task is cancelled."""

    def __init__(self) -> None:
        self._folder = Path(tempfile.mkdtemp(prefix="mixgate-vllm-steps-"))
        self.address = f"ipc://{self._folder / 'steps'}"
        self._context = zmq.asyncio.Context()
        self._socket = self._context.socket(zmq.PULL)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(self.address)
        self._decoder = msgspec.msgpack.Decoder(StepRecord)

    async def run(self, on_record: Callable[[StepRecord], None]) -> None:
        while True:
            frame = await self._socket.recv()
            try:
                record = self._decoder.decode(frame)
            except msgspec.DecodeError:
                continue  # not a record (nothing else writes here): skip it, keep reading
            try:
                on_record(record)
            except Exception:
                # One bad listener must not end the records for every other reader.
                log.exception("vllm_step_record_failed", step_index=record.step_index)

    def close(self) -> None:
        self._socket.close(linger=0)
        self._context.term()
        shutil.rmtree(self._folder, ignore_errors=True)


async def cancel_quietly(task: asyncio.Task[None] | None) -> None:
    """Cancel a receiver's `run` task and wait for it to end."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
