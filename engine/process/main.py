"""The engine core process: `python -m engine.process.main ...`, started by EngineCoreClient.

It loads the model, says EngineReady, then runs the step loop: while there is work it takes
whatever inputs have arrived without blocking, steps, and sends one StepOutputs per step; when
idle it blocks on its input socket. Nothing here touches HTTP or Redis.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import zmq

from engine.core.config import EngineConfig
from engine.core.errors import RequestValidationError
from engine.core.llm_engine import LLMEngine
from engine.core.request import RequestOutput
from engine.process.io_handoff import yield_to_io_thread
from engine.process.messages import (
    AbortRequest,
    AddRequest,
    EngineFailed,
    EngineReady,
    Rejection,
    Shutdown,
    StepOutputs,
    input_decoder,
    output_encoder,
)
from engine.process.parent_death import die_with_parent, parent_alive
from engine.process.startup_heap import freeze_startup_heap
from engine.process.thread_governor import ThreadGovernor

# While idle, wake this often to check that the parent is still there (pdeathsig's backup).
IDLE_POLL_MS = 1000


def _log(event: str, level: str, **fields: object) -> None:
    # One JSON line on the inherited stderr, next to the gateway's own log lines.
    line = {"event": event, "level": level, "logger": "mixgate.engine_core", **fields}
    sys.stderr.write(json.dumps(line) + "\n")
    sys.stderr.flush()


@dataclass(slots=True)
class _Pending:
    """Inputs applied since the last message: what they produced, and whether to stop."""

    outputs: list[RequestOutput] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    shutdown: bool = False


class EngineCore:
    def __init__(self, engine: LLMEngine, inputs: zmq.Socket[bytes], outputs: zmq.Socket[bytes]):
        self.engine = engine
        self._inputs = inputs
        self._outputs = outputs
        self._parent_pid = os.getppid()
        # Fewer threads while other work holds the cores (EngineConfig.adapt_threads).
        self.governor = (
            ThreadGovernor(torch.get_num_threads()) if engine.config.adapt_threads else None
        )

    def ready(self) -> None:
        engine = self.engine
        manager = engine.block_manager
        message = EngineReady(
            pid=os.getpid(),
            max_model_len=engine.max_model_len,
            kv_capacity_tokens=manager.num_blocks * manager.block_size,
            vocab_size=engine.model_config.vocab_size,
            eos_token_ids=sorted(engine._eos_ids),
            load=engine.load(),
        )
        self._outputs.send(output_encoder.encode(message))

    def run(self) -> None:
        """The step loop, until Shutdown (or the parent is gone)."""
        engine = self.engine
        while True:
            busy = engine.has_unfinished_requests()
            pending = self._take_inputs(block=not busy)
            if pending is None:
                return  # the parent is gone
            if pending.shutdown:
                return
            steps_before = engine.history.total_steps
            outputs = pending.outputs
            stepped = engine.has_unfinished_requests()
            timing: tuple[float, float, float] | None = None
            if stepped:
                stepped_outputs, timing = self._step()
                outputs = outputs + stepped_outputs
            if not (stepped or outputs or pending.rejections):
                continue
            new_steps = engine.history.total_steps - steps_before
            # NOTE: from the deque's end (O(new_steps)), not a copy of the whole window per step.
            history = engine.history.records
            records = [history[-i] for i in range(min(new_steps, len(history)), 0, -1)]
            load = engine.load()
            if self.governor is not None:
                if timing is not None and records:
                    self.governor.record(*timing, records[-1].num_tokens)
                load = dataclasses.replace(load, threads=self.governor.threads)
            message = StepOutputs(outputs, pending.rejections, load, records)
            self._outputs.send(output_encoder.encode(message))
            # Or the message waits for the next step to end (engine/process/io_handoff.py).
            yield_to_io_thread()

    def _step(self) -> tuple[list[RequestOutput], tuple[float, float, float] | None]:
        """The step's outputs and, where the governor adapts threads, its (end, process CPU,
        wall) seconds, handed to the governor beside the step's record."""
        governor = self.governor
        if governor is None:
            return self.engine.step(), None
        if torch.get_num_threads() != governor.threads:
            # Every kernel reads the count per call (torch.get_num_threads()).
            torch.set_num_threads(governor.threads)
        # Process CPU time: every thread of this process (the step's, and zmq's I/O thread,
        # which is idle during a step).
        wall_s, cpu_s = time.perf_counter(), time.process_time()
        outputs = self.engine.step()
        now_s = time.perf_counter()
        return outputs, (now_s, time.process_time() - cpu_s, now_s - wall_s)

    def _take_inputs(self, *, block: bool) -> _Pending | None:
        pending = _Pending()
        if block:
            while not self._inputs.poll(IDLE_POLL_MS):
                if not parent_alive(self._parent_pid):
                    return None
        while True:
            try:
                raw = self._inputs.recv(zmq.NOBLOCK)
            except zmq.Again:
                return pending
            self._apply(input_decoder.decode(raw), pending)

    def _apply(self, message: AddRequest | AbortRequest | Shutdown, pending: _Pending) -> None:
        if isinstance(message, Shutdown):
            pending.shutdown = True
        elif isinstance(message, AbortRequest):
            output = self.engine.abort_request(message.request_id)
            if output is not None:
                pending.outputs.append(output)
        else:
            request = message.request
            try:
                self.engine.add_request(request)
            except RequestValidationError as error:
                pending.rejections.append(
                    Rejection(request.request_id, str(error), error.code, error.param)
                )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.process.main")
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--config-json", required=True, help="EngineConfig's fields as JSON")
    parser.add_argument("--input", required=True, help="zmq address to PULL inputs from")
    parser.add_argument("--output", required=True, help="zmq address to PUSH outputs to")
    parser.add_argument("--parent-pid", type=int, required=True)
    args = parser.parse_args(argv)
    die_with_parent(args.parent_pid)
    context = zmq.Context()
    inputs = context.socket(zmq.PULL)
    inputs.connect(args.input)
    outputs = context.socket(zmq.PUSH)
    outputs.connect(args.output)
    code = 0
    try:
        engine = LLMEngine(args.model_dir, EngineConfig(**json.loads(args.config_json)))
        core = EngineCore(engine, inputs, outputs)
        frozen = freeze_startup_heap()
        core.ready()
        _log("engine_core_ready", "info", pid=os.getpid(), gc_frozen_objects=frozen)
        core.run()
    except Exception as error:  # noqa: BLE001 - the parent must hear why before we exit
        _log("engine_core_failed", "error", pid=os.getpid(), error=repr(error))
        outputs.send(output_encoder.encode(EngineFailed(repr(error))))
        code = 1
    # Let queued messages out (bounded), then leave without the interpreter's teardown:
    # unloading torch takes ~0.4 s and there is nothing here to flush.
    inputs.close(linger=0)
    outputs.close(linger=2000)
    context.term()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
