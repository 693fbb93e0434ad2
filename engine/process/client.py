"""`EngineCoreClient`: AsyncEngine's interface over an engine core child process.

Inputs go out on a PUSH socket, one StepOutputs per engine step comes back on a PULL socket
(both bound by this side on ipc:// paths in a private temp folder; the child connects). The
child is watched through a pidfd: the moment it exits, `is_running` turns False and every
open `generate()` raises EngineDeadError.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path

import structlog
import zmq
import zmq.asyncio

from engine.core.config import EngineConfig
from engine.core.errors import EngineDeadError, RequestValidationError
from engine.core.request import GenerationRequest, RequestOutput
from engine.core.step_record import LoadSnapshot
from engine.process.facade import EngineFacade
from engine.process.messages import (
    AbortRequest,
    AddRequest,
    EngineFailed,
    EngineReady,
    Shutdown,
    StepOutputs,
    input_encoder,
    output_decoder,
)
from engine.process.omp_wait import engine_child_environment
from engine.process.parent_death import die_with_parent_preexec
from engine.process.request_streams import RequestStreams
from engine.text.tokenizer import Tokenizer

log = structlog.get_logger("mixgate.engine")

# Hears every StepOutputs as it arrives (after its deltas went to their streams).
StepListener = Callable[[StepOutputs], None]


class EngineCoreClient:
    def __init__(
        self,
        model_dir: Path,
        config: EngineConfig,
        *,
        ready_timeout_s: float = 600.0,
        stop_timeout_s: float = 5.0,
    ) -> None:
        self._model_dir = Path(model_dir)
        self._config = config
        self._ready_timeout_s = ready_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._streams = RequestStreams()
        self._listeners: list[StepListener] = []
        self._snapshot: LoadSnapshot | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._tmp_dir: Path | None = None
        self._context: zmq.Context[zmq.Socket[bytes]] | None = None
        self._push: zmq.Socket[bytes] | None = None
        self._pull: zmq.asyncio.Socket | None = None
        self._reader: asyncio.Task[None] | None = None
        self._exited = asyncio.Event()
        self._ready = False
        self._stopping = False
        self._death: str | None = None
        self.engine: EngineFacade | None = None  # set when the child is ready

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def is_running(self) -> bool:
        return self._ready and self._death is None and not self._stopping

    @property
    def death_reason(self) -> str | None:
        """Why the child is gone, when it died rather than being stopped."""
        return self._death

    async def wait_dead(self) -> None:
        await self._exited.wait()

    def add_step_listener(self, listener: StepListener) -> None:
        self._listeners.append(listener)

    async def start(self) -> None:
        """Start the child (from this, the event-loop thread: see parent_death), await ready."""
        if self._process is not None:
            raise RuntimeError("the engine is already started")
        self._tmp_dir = Path(tempfile.mkdtemp(prefix="mixgate-engine-"))
        input_addr = f"ipc://{self._tmp_dir / 'input'}"
        output_addr = f"ipc://{self._tmp_dir / 'output'}"
        self._context = zmq.Context()
        self._push = self._context.socket(zmq.PUSH)
        self._push.setsockopt(zmq.SNDHWM, 0)  # never drop or block an add/abort
        self._push.bind(input_addr)
        self._pull = zmq.asyncio.Context.shadow(self._context).socket(zmq.PULL)
        self._pull.setsockopt(zmq.RCVHWM, 0)
        self._pull.bind(output_addr)
        config_json = json.dumps(dataclasses.asdict(self._config))
        tokenizer = asyncio.create_task(
            asyncio.to_thread(Tokenizer.from_pretrained, self._model_dir)
        )
        self._process = subprocess.Popen(
            [
                *(sys.executable, "-m", "engine.process.main"),
                *("--model-dir", str(self._model_dir), "--config-json", config_json),
                *("--input", input_addr, "--output", output_addr),
                *("--parent-pid", str(os.getpid())),
            ],
            env=engine_child_environment(os.environ),
            preexec_fn=die_with_parent_preexec(os.getpid()),
        )
        log.info("engine_core_started", pid=self._process.pid)
        self._watch_exit(self._process)
        try:
            ready = await self._await_ready()
        except BaseException:
            tokenizer.cancel()
            await asyncio.gather(tokenizer, return_exceptions=True)
            raise
        try:
            self.engine = EngineFacade(await tokenizer, ready)
        except BaseException:
            await self._shutdown_process()  # no child may outlive a failed start
            raise
        # Both sides are connected (the child connects before it loads the model, and its
        # EngineReady came over one of them): the socket files have done their part. Removing
        # them now means that a gateway SIGKILLed later leaves no folder behind in /tmp (one
        # per killed server, before: 39 of them here after a few test runs).
        self._remove_socket_folder()
        self._snapshot = ready.load
        self._ready = True
        self._reader = asyncio.create_task(self._read_outputs(), name="engine-core-reader")

    async def _await_ready(self) -> EngineReady:
        assert self._pull is not None
        receive = asyncio.ensure_future(self._pull.recv())
        exited = asyncio.ensure_future(self._exited.wait())
        try:
            done, _ = await asyncio.wait(
                {receive, exited}, timeout=self._ready_timeout_s, return_when="FIRST_COMPLETED"
            )
        finally:
            exited.cancel()
        if receive not in done:
            receive.cancel()
            await self._shutdown_process()
            raise EngineDeadError(f"the engine core did not start: {self._death or 'timeout'}")
        message = output_decoder.decode(receive.result())
        if not isinstance(message, EngineReady):
            await self._shutdown_process()
            raise EngineDeadError(f"the engine core failed to start: {message}")
        return message

    async def stop(self) -> None:
        self._stopping = True
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        self._fail_streams(EngineDeadError("the engine stopped before the request finished"))
        await self._shutdown_process()

    async def _shutdown_process(self) -> None:
        self._stopping = True
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(zmq.ZMQError):
                self._send(Shutdown())
            try:
                await asyncio.wait_for(self._exited.wait(), self._stop_timeout_s)
            except TimeoutError:
                log.warning("engine_core_killed_at_stop", pid=self._process.pid)
                self._process.kill()
                await self._exited.wait()
        for sock in (self._push, self._pull):
            if sock is not None:
                sock.close(linger=0)
        if self._context is not None:
            self._context.term()
            self._context = None
        self._remove_socket_folder()

    def _remove_socket_folder(self) -> None:
        if self._tmp_dir is not None:
            shutil.rmtree(self._tmp_dir, ignore_errors=True)
            self._tmp_dir = None

    # -- the engine's interface --------------------------------------------------------------

    def load(self) -> LoadSnapshot:
        if self._snapshot is None:
            raise RuntimeError("the engine is not started")
        return self._snapshot

    def abort(self, request_id: str) -> None:
        if self._death is None and self._push is not None and not self._push.closed:
            self._send(AbortRequest(request_id))

    async def generate(self, request: GenerationRequest) -> AsyncIterator[RequestOutput]:
        """Yield the request's deltas; the last one has `finished` set."""
        if not self.is_running or self.engine is None:
            raise EngineDeadError(f"the engine is not running: {self._death or 'stopped'}")
        self.engine.validate(request)
        submit = partial(self._send, AddRequest(request))
        async for output in self._streams.consume(request.request_id, submit, self.abort):
            yield output

    # -- plumbing ----------------------------------------------------------------------------

    def _send(self, message: AddRequest | AbortRequest | Shutdown) -> None:
        assert self._push is not None
        # NOTE: a plain (not asyncio) socket with no high-water mark: send only queues the
        # bytes for zmq's I/O thread, so it never blocks the event loop.
        self._push.send(input_encoder.encode(message), zmq.NOBLOCK)

    async def _read_outputs(self) -> None:
        assert self._pull is not None
        while True:
            raw = await self._pull.recv()
            self._handle(output_decoder.decode(raw))

    def _handle(self, message: object) -> None:
        if isinstance(message, StepOutputs):
            self._snapshot = message.load
            for output in message.outputs:
                self._streams.put(output.request_id, output)
            for rejection in message.rejections:
                error = RequestValidationError(
                    rejection.message, code=rejection.code, param=rejection.param
                )
                self._streams.put(rejection.request_id, error)
            for listener in self._listeners:
                listener(message)
        elif isinstance(message, EngineFailed):
            self._death = f"engine step failed: {message.message}"

    def _drain_outputs(self) -> None:
        """What the child sent before it died still counts (a request may have finished)."""
        if self._pull is None or self._pull.closed or not self._ready:
            return
        # A plain shadow of the same socket: a non-blocking read right here, not a future.
        pull: zmq.Socket[bytes] = zmq.Socket.shadow(self._pull.underlying)
        while True:
            try:
                raw = pull.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._handle(output_decoder.decode(raw))

    def _watch_exit(self, process: subprocess.Popen[bytes]) -> None:
        loop = asyncio.get_running_loop()
        try:
            pidfd = os.pidfd_open(process.pid)
        except (AttributeError, OSError):  # not Linux 5.3+: a thread waits instead
            waiter = loop.run_in_executor(None, process.wait)
            waiter.add_done_callback(lambda _: self._on_exit(process))
            return

        def readable() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            process.wait()
            self._on_exit(process)

        loop.add_reader(pidfd, readable)

    def _on_exit(self, process: subprocess.Popen[bytes]) -> None:
        if not self._stopping:
            self._drain_outputs()
            if self._death is None:
                self._death = f"the engine process exited with code {process.returncode}"
            log.error("engine_core_died", pid=process.pid, returncode=process.returncode)
            self._fail_streams(EngineDeadError(self._death))
        self._exited.set()

    def _fail_streams(self, error: BaseException) -> None:
        for request_id in self._streams.ids():
            self._streams.put(request_id, error)
