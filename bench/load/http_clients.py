"""Sending one planned request the way users do: a chat stream over SSE, or a job that is
submitted and polled. Each request becomes one RequestRecord."""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from bench.load.client import LOAD_ERRORS, LoadClient, LoadResponse, LoadStream
from bench.load.jobs import JobWatcher
from bench.load.records import CANCELLED, ERROR, EXPIRED, INCOMPLETE, OK, REJECTED, RequestRecord
from bench.load.workload import PlannedRequest, prompt_messages, request_rng
from policies.request_class import RequestClass

__all__ = ["HttpSender", "Recorder", "RecordListener"]

DEADLINE_HEADER = "X-Mixgate-Deadline-Ms"
TIMINGS_HEADER = "X-Mixgate-Timings"
# A request that fails in transport or answers something unreadable is recorded as an error.
_SEND_ERRORS: tuple[type[BaseException], ...] = (*LOAD_ERRORS, ValueError, KeyError)
# How long a client planned to give up "before the first token" waits before it closes.
_CANCEL_BEFORE_FIRST_TOKEN_MAX_S = 0.05


class RecordListener(Protocol):
    def started(self, record: RequestRecord) -> None: ...
    def finished(self, record: RequestRecord) -> None: ...


@dataclass
class Recorder:
    """Records of a run: finished ones, and those in flight (incomplete if the run ends)."""

    finished: list[RequestRecord] = field(default_factory=list)
    in_flight: dict[str, RequestRecord] = field(default_factory=dict)
    # request_id -> server job id of bulk jobs not yet terminal, for the end-of-run DELETE.
    job_ids: dict[str, str] = field(default_factory=dict)
    listener: RecordListener | None = None

    def start(self, record: RequestRecord) -> None:
        self.in_flight[record.request_id] = record
        if self.listener is not None:
            self.listener.started(record)

    def finish(self, record: RequestRecord) -> None:
        self.in_flight.pop(record.request_id, None)
        self.job_ids.pop(record.request_id, None)
        self.finished.append(record)
        if self.listener is not None:
            self.listener.finished(record)

    def abandon_all(self) -> list[tuple[RequestRecord, str | None]]:
        """Mark what is still in flight incomplete; returns (record, job id to DELETE)."""
        left = [(rec, self.job_ids.get(rid)) for rid, rec in list(self.in_flight.items())]
        for record, _ in left:
            record.outcome = INCOMPLETE
            self.finish(record)
        return left


def _error_code(body: bytes) -> str | None:
    try:
        error = json.loads(body).get("error") or {}
    except (ValueError, AttributeError):
        return None
    code = error.get("code") if isinstance(error, dict) else None
    return str(code) if code is not None else None


def _refused(record: RequestRecord, response: LoadResponse | LoadStream, body: bytes) -> None:
    """A non-success answer: 429 is an admission rejection, anything else an error."""
    record.status_code = response.status_code
    record.error_code = _error_code(body)
    if response.status_code == 429:
        record.outcome = REJECTED
        retry_after = response.headers.get("retry-after")
        try:
            record.retry_after_s = float(retry_after) if retry_after is not None else None
        except ValueError:
            record.retry_after_s = None
    else:
        record.outcome = ERROR


@dataclass
class _Stream:
    """What one chat stream has shown so far (client clock)."""

    sent: float
    cancel_after: int | None
    last: float | None = None
    content_chunks: int = 0


class HttpSender:
    """The `send` of a live run: one shared client, records into `recorder`."""

    def __init__(
        self,
        client: LoadClient,
        recorder: Recorder,
        *,
        model: str,
        seed: int,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
        t0: float,
        job_poll_s: float,
    ) -> None:
        self._client = client
        self._recorder = recorder
        self._model = model
        self._seed = seed
        self._clock = clock
        self._sleep = sleep
        self._t0 = t0
        self.jobs = JobWatcher(client, sleep, job_poll_s)

    async def __call__(self, request: PlannedRequest) -> float:
        cls = request.request_class
        record = RequestRecord(
            request_id=f"{cls.value}-{request.index}",
            request_class=cls.value,
            prompt_tokens=request.prompt_tokens,
            max_tokens=request.max_tokens,
            scheduled_s=request.at_s,
            sent_s=self._clock() - self._t0,
            cancel_plan=request.cancel.when if request.cancel is not None else None,
        )
        self._recorder.start(record)
        rng = request_rng(self._seed, cls, request.index)
        body: dict[str, Any] = {
            "model": self._model,
            "messages": prompt_messages(rng, request.prompt_tokens),
            "max_tokens": request.max_tokens,
            "temperature": 0,
            # Output lengths must hold whatever a random-weight model samples.
            "ignore_eos": True,
            **self._class_fields(cls),
        }
        try:
            if cls is RequestClass.INTERACTIVE:
                await self._chat(request, record, body, rng)
            else:
                await self._bulk(request, record, body, rng)
        except _SEND_ERRORS as exc:
            record.outcome, record.error_code = ERROR, type(exc).__name__
        self._recorder.finish(record)
        if record.outcome == REJECTED:
            return record.retry_after_s or 1.0
        return 0.0

    def _class_fields(self, request_class: RequestClass) -> dict[str, Any]:
        """Extra body fields per class (none for mixgate: the route decides the class)."""
        return {}

    async def _bulk(
        self,
        request: PlannedRequest,
        record: RequestRecord,
        body: dict[str, Any],
        rng: random.Random,
    ) -> None:
        """How a bulk request is sent: a mixgate job, submitted and polled."""
        await self._job(request, record, body, rng)

    # ---- interactive: SSE ----------------------------------------------------------------

    async def _chat(
        self,
        request: PlannedRequest,
        record: RequestRecord,
        body: dict[str, Any],
        rng: random.Random,
    ) -> None:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
        headers = {TIMINGS_HEADER: "1"}
        if request.deadline_s is not None:
            headers[DEADLINE_HEADER] = str(round(request.deadline_s * 1000))
        cancel = request.cancel
        state = _Stream(
            sent=self._clock(),
            cancel_after=cancel.after_tokens if cancel and cancel.when == "mid_stream" else None,
        )
        path = "/v1/chat/completions"
        async with self._client.stream("POST", path, json=body, headers=headers) as response:
            if response.status_code != 200:
                _refused(record, response, await response.aread())
                return
            record.status_code = 200
            if cancel is not None and cancel.when == "before_first_token":
                await self._sleep(rng.uniform(0.0, _CANCEL_BEFORE_FIRST_TOKEN_MAX_S))
                # Leaving the block closes the connection: the server sees the client go.
                record.outcome = CANCELLED
                return
            await self._read_stream(response, record, state)
        if record.output_tokens == 0:
            record.output_tokens = state.content_chunks

    async def _read_stream(
        self, response: LoadStream, record: RequestRecord, state: _Stream
    ) -> None:
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                record.e2e_s = self._clock() - state.sent
                record.outcome = OK
                return
            chunk = json.loads(data)
            if "error" in chunk:
                code = (chunk["error"] or {}).get("code")
                record.error_code = code
                record.outcome = EXPIRED if code == "deadline_expired" else ERROR
                return
            if self._on_chunk(chunk, record, state):
                record.outcome = CANCELLED
                return
        record.outcome, record.error_code = ERROR, "stream_ended_without_done"

    def _on_chunk(self, chunk: dict[str, Any], record: RequestRecord, state: _Stream) -> bool:
        """Account one chunk; True when the planned mid-stream cancel is due."""
        choices = chunk.get("choices") or []
        content = choices[0].get("delta", {}).get("content") if choices else None
        if content:
            now = self._clock()
            if state.last is None:
                record.ttft_s = now - state.sent
            else:
                record.itls_s.append(now - state.last)
            state.last = now
            state.content_chunks += 1
        usage = chunk.get("usage")
        if usage:
            record.output_tokens = int(usage.get("completion_tokens", 0))
        timings = chunk.get("mixgate_timings")
        if isinstance(timings, dict) and timings.get("queue_s") is not None:
            record.queue_delay_s = float(timings["queue_s"])
            record.server_dispatch_s = timings.get("dispatch_s")
            record.server_accept_s = timings.get("accept_s")
            record.server_handed_at_s = timings.get("handed_at_s")
            record.server_first_token_at_s = timings.get("first_token_at_s")
        return state.cancel_after is not None and state.content_chunks >= state.cancel_after

    # ---- bulk: submit and poll -----------------------------------------------------------

    async def _job(
        self,
        request: PlannedRequest,
        record: RequestRecord,
        body: dict[str, Any],
        rng: random.Random,
    ) -> None:
        if request.deadline_s is not None:
            body["deadline_s"] = request.deadline_s
        response = await self._client.post("/v1/jobs", json=body)
        if response.status_code != 202:
            _refused(record, response, response.content)
            return
        record.status_code = 202
        job_id = str(response.json()["id"])
        self._recorder.job_ids[record.request_id] = job_id
        cancel = request.cancel
        if cancel is not None and cancel.when == "before_first_token":
            await self._delete(job_id, record)
            return
        submitted = self._clock()

        def settled(job: dict[str, Any]) -> bool:
            status = job.get("status")
            return status not in ("queued", "running") or (
                cancel is not None and status == "running"
            )

        job = await self.jobs.wait(job_id, settled)
        if not _job_finished(job, record, self._clock() - submitted):
            await self._delete(job_id, record)  # the planned mid-run cancellation

    async def _delete(self, job_id: str, record: RequestRecord) -> None:
        response = await self._client.delete(f"/v1/jobs/{job_id}")
        record.status_code = response.status_code
        record.outcome = CANCELLED


def _job_finished(job: dict[str, Any], record: RequestRecord, age_s: float) -> bool:
    """Fill `record` from a terminal job; False while it is queued or running."""
    status = job.get("status")
    if status == "completed":
        record.outcome = OK
        timings = job.get("timings") or {}
        record.ttft_s = timings.get("ttft_s")
        record.queue_delay_s = timings.get("queue_s")
        record.server_dispatch_s = timings.get("dispatch_s")
        record.server_accept_s = timings.get("accept_s")
        # The server's e2e is exact; the client's is quantized by the poll interval.
        record.e2e_s = timings.get("e2e_s", age_s)
        usage = (job.get("response") or {}).get("usage") or {}
        record.output_tokens = int(usage.get("completion_tokens", 0))
        return True
    if status in ("expired", "failed", "cancelled"):
        record.outcome = {"expired": EXPIRED, "failed": ERROR, "cancelled": CANCELLED}[status]
        error = job.get("error") or {}
        record.error_code = error.get("code") if isinstance(error, dict) else None
        return True
    return False
