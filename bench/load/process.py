"""Part of a load run's classes sent from a process of its own: the chat clients.

NOTE: why a process. The chat clients used to share the load generator's event loop with the
bulk submissions, their polls and the /metrics sampler. Whatever held that loop (a burst of
400 submissions, httpx's pool bookkeeping, JSON of job pages) was measured as chat latency:
in `bench compare`'s `mixed` run three chats got their first token 5.5 s after their send
while the server's own queue delay for them was 32 ms, and the chats planned during the stall
were not sent until it ended. Here the chat clients have a loop, a client and a CPU scheduler
entry of their own; the one seeded load is kept (each class sends exactly the requests it has
in the whole workload, on one t0 of the system's monotonic clock, which every process reads
alike), and the records come back to the parent, so the run writes one folder as before.

Transport: a socketpair carrying pickles through `multiprocessing.connection.Connection`
(stdlib; no port, no authentication needed for a private pair). The child is a fresh
interpreter that imports this module, not multiprocessing's spawn, which re-imports the
parent's `__main__` (`python -m mixgate` would run the command again).

    part = await ClassProcess.start(spec)      # the child is up and its client made
    part.go(t0, listener)                      # both sides now send on one schedule
    result = await part.result(timeout_s)      # its records, after its own drain
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from bench.load.client import LOAD_ERRORS, LoadClient, client_timeout, warm_up
from bench.load.drive import LoadDriver
from bench.load.frozen_heap import heap_frozen
from bench.load.http_clients import HttpSender, Recorder, RecordListener
from bench.load.records import RequestRecord
from bench.load.workload import PlannedRequest, Workload
from engine.process.parent_death import die_with_parent, die_with_parent_preexec
from policies.request_class import RequestClass

__all__ = [
    "CLIENT_TIMEOUT",
    "ClassProcess",
    "PartResult",
    "PartSpec",
    "abandon",
    "run_part",
]

# Streams may sit in a queue for long; the drain, not a read timeout, bounds a run.
CLIENT_TIMEOUT = client_timeout(connect_s=30.0, read_s=600.0)
# NOTE: the module imported by its name, not run as __main__: what the child pickles back
# (PartResult, RequestRecord) must name classes the parent can find.
_CHILD_MAIN = (
    "import sys; from bench.load.process import main; raise SystemExit(main(sys.argv[1:]))"
)
# Importing aiohttp and the bench modules, then making the client: well under this.
_READY_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class PartSpec:
    """What the child needs to send its classes as the parent would (all picklable)."""

    base_url: str
    headers: dict[str, str]
    workload: Workload
    classes: frozenset[RequestClass]
    model: str
    # Must be importable by its qualified name (a module-level class): the child imports it.
    sender_class: type[HttpSender]
    sender_options: dict[str, Any] = field(default_factory=dict)
    job_poll_s: float = 0.5
    drain_s: float = 10.0


@dataclass(frozen=True, slots=True)
class PartResult:
    records: list[RequestRecord]
    # Every request the part handed to its sender, in send order.
    issued: list[PlannedRequest]


async def abandon(client: LoadClient, recorder: Recorder) -> None:
    """Record what is left as incomplete and DELETE its jobs (a backlog outlives the run on
    purpose; the next run must not inherit it)."""

    async def delete(job_id: str) -> None:
        # A failed DELETE leaves the job queued; the record says incomplete either way.
        with contextlib.suppress(*LOAD_ERRORS):
            await client.delete(f"/v1/jobs/{job_id}")

    left = recorder.abandon_all()
    await asyncio.gather(*(delete(job_id) for _, job_id in left if job_id is not None))


async def run_part(
    driver: LoadDriver,
    sender: HttpSender,
    client: LoadClient,
    recorder: Recorder,
    drain_s: float,
) -> None:
    """The schedule, the drain, and on any exit: cancel what is left and record it."""
    try:
        await driver.run_schedule()
        await driver.drain(drain_s)
    finally:
        # On an error too: no request task may outlive the client it uses.
        await driver.drain(0.0)
        await sender.jobs.close()
        await abandon(client, recorder)


def check_importable(sender_class: type[HttpSender]) -> None:
    if "<locals>" in sender_class.__qualname__:
        raise ValueError(
            f"{sender_class.__qualname__}: a sender that runs in the chat process must be a "
            "module-level class (or pass chat_process=False)"
        )


class ClassProcess:
    """The parent's handle on one child process that sends some classes of the load."""

    def __init__(self, proc: subprocess.Popen[bytes], conn: Connection) -> None:
        self._proc = proc
        self._conn = conn
        self._reader: threading.Thread | None = None
        self._result: asyncio.Future[PartResult] | None = None

    @property
    def pid(self) -> int:
        return self._proc.pid

    @classmethod
    async def start(cls, spec: PartSpec) -> ClassProcess:
        check_importable(spec.sender_class)
        mine, theirs = socket.socketpair()
        # The child imports this very tree, whatever the parent's working directory is.
        root = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD_MAIN, str(theirs.fileno()), str(os.getpid())],
                pass_fds=(theirs.fileno(),),
                env=env,
                preexec_fn=die_with_parent_preexec(os.getpid()),  # noqa: PLW1509 - prctl only
            )  # fmt: skip
        finally:
            theirs.close()
        conn = Connection(mine.detach())
        part = cls(proc, conn)
        try:
            conn.send(spec)
            message = await asyncio.to_thread(_recv_within, conn, _READY_TIMEOUT_S)
            if message[0] != "ready":
                raise RuntimeError(f"the chat client process failed to start:\n{message[1]}")
        except BaseException:
            part.close()
            raise
        return part

    def go(self, t0: float, listener: RecordListener | None) -> None:
        """Start the child's schedule at `t0` (time.monotonic); relay its records' progress
        to `listener` on the caller's loop."""
        loop = asyncio.get_running_loop()
        self._result = loop.create_future()
        self._conn.send(("go", t0))
        self._reader = threading.Thread(
            target=self._read, args=(loop, listener, self._result), daemon=True
        )
        self._reader.start()

    def _read(
        self,
        loop: asyncio.AbstractEventLoop,
        listener: RecordListener | None,
        result: asyncio.Future[PartResult],
    ) -> None:
        """The reader thread: progress events to the listener, then the result (or the error)."""

        def settle(value: PartResult | None, error: BaseException | None) -> None:
            if result.done():
                return
            if error is not None:
                result.set_exception(error)
            else:
                assert value is not None
                result.set_result(value)

        while True:
            try:
                kind, *rest = self._conn.recv()
            except Exception as error:  # noqa: BLE001 - whatever ends the pipe ends the part
                failure = RuntimeError(f"the chat client process ended early: {error!r}")
                loop.call_soon_threadsafe(settle, None, failure)
                return
            if kind in ("started", "finished"):
                if listener is not None:
                    loop.call_soon_threadsafe(getattr(listener, kind), rest[0])
            elif kind == "done":
                loop.call_soon_threadsafe(settle, rest[0], None)
                return
            else:  # "error"
                failure = RuntimeError(f"the chat client process failed:\n{rest[0]}")
                loop.call_soon_threadsafe(settle, None, failure)
                return

    async def result(self, timeout_s: float) -> PartResult:
        assert self._result is not None, "go() first"
        return await asyncio.wait_for(asyncio.shield(self._result), timeout_s)

    def close(self) -> None:
        """The child is done (or is ended now); nothing of it is left running."""
        if self._proc.poll() is None:
            # After "done" the child exits by itself; otherwise (an error here) end it.
            try:
                self._proc.wait(5.0 if self._result is not None and self._result.done() else 0)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10.0)
        self._conn.close()
        if self._reader is not None:
            self._reader.join(5.0)


def _recv_within(conn: Connection, timeout_s: float) -> tuple[Any, ...]:
    if not conn.poll(timeout_s):
        return ("error", f"no answer within {timeout_s:.0f} s")
    message: tuple[Any, ...] = conn.recv()
    return message


# ---- the child ---------------------------------------------------------------------------


class _Relay:
    """The child's RecordListener: each record's start and end go to the parent's bar."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def started(self, record: RequestRecord) -> None:
        self._conn.send(("started", record))

    def finished(self, record: RequestRecord) -> None:
        self._conn.send(("finished", record))


async def _child(conn: Connection, spec: PartSpec) -> None:
    async with LoadClient(spec.base_url, headers=spec.headers, timeout=CLIENT_TIMEOUT) as client:
        await warm_up(client)
        # Frozen before the ready, so that its collection is not paid after the go; the
        # child's whole life is then the run.
        with heap_frozen():
            conn.send(("ready",))
            # Blocking on purpose: nothing runs on this loop before the go.
            kind, t0 = conn.recv()
            assert kind == "go"
            recorder = Recorder(listener=_Relay(conn))
            sender = spec.sender_class(
                client,
                recorder,
                model=spec.model,
                seed=spec.workload.seed,
                clock=time.monotonic,
                sleep=asyncio.sleep,
                t0=t0,
                job_poll_s=spec.job_poll_s,
                **spec.sender_options,
            )
            driver = LoadDriver(
                spec.workload,
                sender,
                clock=time.monotonic,
                sleep=asyncio.sleep,
                t0=t0,
                classes=spec.classes,
            )
            await run_part(driver, sender, client, recorder, spec.drain_s)
    conn.send(("done", PartResult(recorder.finished, driver.issued)))


def main(argv: list[str]) -> int:
    fd, parent_pid = int(argv[0]), int(argv[1])
    die_with_parent(parent_pid)
    conn = Connection(fd)
    try:
        spec: PartSpec = conn.recv()
        asyncio.run(_child(conn, spec))
    except BaseException:
        with contextlib.suppress(OSError):
            conn.send(("error", traceback.format_exc()))
        return 1
    finally:
        conn.close()
    return 0
