"""The asyncio face of the engine: a step loop on its own thread, deltas on asyncio queues.

The event loop never runs a forward: `generate()` posts the request to the engine thread and
awaits deltas that the thread hands back with `call_soon_threadsafe`. Leaving the iterator
early (client gone, task cancelled) aborts the request, which frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.core.errors import EngineDeadError, RequestValidationError
from engine.core.request import GenerationRequest, RequestOutput
from engine.core.step_record import LoadSnapshot
from engine.process.request_streams import RequestStreams

if TYPE_CHECKING:
    # NOTE: for annotations only: importing this module (the gateway does, for the type) must
    # not import torch, whose unloading alone adds ~0.4 s to every exit of `mixgate serve`.
    from engine.core.llm_engine import LLMEngine


@dataclass(frozen=True, slots=True)
class _Add:
    request: GenerationRequest


@dataclass(frozen=True, slots=True)
class _Abort:
    request_id: str


class AsyncEngine:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._commands: queue.SimpleQueue[_Add | _Abort] = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._streams = RequestStreams()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._error: BaseException | None = None
        self._snapshot = engine.load()

    @property
    def tokenizer(self) -> object:
        return self.engine.tokenizer

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._error is None

    async def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the engine is already started")
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="mixgate-engine", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stopping = True
        self._wakeup.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    def load(self) -> LoadSnapshot:
        return self._snapshot

    def abort(self, request_id: str) -> None:
        self._commands.put(_Abort(request_id))
        self._wakeup.set()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[RequestOutput]:
        """Yield the request's deltas; the last one has `finished` set."""
        # NOTE: after stop() the thread is gone; a request queued now would wait forever.
        if self._error is not None or self._loop is None or self._stopping:
            raise EngineDeadError("the engine is not running") from self._error
        self.engine.validate(request)

        def submit() -> None:
            self._commands.put(_Add(request))
            self._wakeup.set()

        async for output in self._streams.consume(request.request_id, submit, self.abort):
            yield output

    # -- the engine thread -------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._apply_commands()
                if not self.engine.has_unfinished_requests():
                    self._snapshot = self.engine.load()
                    self._wakeup.wait()
                    self._wakeup.clear()
                    continue
                outputs = self.engine.step()
                self._snapshot = self.engine.load()
                if outputs:
                    self._post(outputs)
            # Stopped with requests in flight: their consumers must not wait forever.
            self._post_error(EngineDeadError("the engine stopped before the request finished"))
        except BaseException as error:  # noqa: BLE001 - every stream must hear of it
            self._error = error
            self._post_error(EngineDeadError(f"engine step failed: {error!r}"))
            raise

    def _apply_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, _Abort):
                output = self.engine.abort_request(command.request_id)
                if output is not None:
                    self._post([output])
                continue
            try:
                self.engine.add_request(command.request)
            except RequestValidationError as error:
                self._post_to(command.request.request_id, error)

    def _post(self, outputs: list[RequestOutput]) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._deliver, outputs)

    def _post_to(self, request_id: str, error: BaseException) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._deliver_error, request_id, error)

    def _post_error(self, error: BaseException) -> None:
        if self._loop is not None and not self._loop.is_closed():
            for request_id in self._streams.ids():
                self._loop.call_soon_threadsafe(self._deliver_error, request_id, error)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            self._streams.put(output.request_id, output)

    def _deliver_error(self, request_id: str, error: BaseException) -> None:
        self._streams.put(request_id, error)
