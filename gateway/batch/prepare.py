"""Turning a batch's parsed lines into queued-job payloads, with the same checks as a request.

Each line's body goes through what `/v1/chat/completions` does before it queues a request:
the schema (a 400 there is an ``invalid_body``-style line error with the same message), the
model name, tokenization with the chat template, the bulk class's length limits (admission's
own check) and the engine's limits. A line that fails any of them becomes a line error; the
others become entries of the batch's todo list. Runs in a worker thread (tokenizing 50,000
lines takes a while), reading only state that does not change while the service runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.errors import RequestValidationError
from gateway.admission.intake import build_payload
from gateway.admission.service import FALLBACK_DECODE_TOKENS_PER_S, FALLBACK_PREFILL_TOKENS_PER_S
from gateway.batch.feasibility import BatchWork
from gateway.batch.lines import InputLine, LineError, ParsedInput
from gateway.batch.result_lines import line_job_id
from gateway.batch.todo import TodoLine
from gateway.http.errors import APIError
from gateway.http.schemas import parse_chat_request
from gateway.http.state import GatewayState
from gateway.queue.payload import JobPayload
from policies.admission import (
    AdmissionConfig,
    EngineRates,
    QueueState,
    RequestShape,
    decide_admission,
)
from policies.request_class import RequestClass

__all__ = ["PreparedBatch", "prepare_lines"]


@dataclass(slots=True)
class PreparedBatch:
    todo: list[TodoLine] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0

    @property
    def work(self) -> BatchWork:
        return BatchWork(self.prompt_tokens, self.output_tokens)


def _error(line: InputLine, error: APIError) -> LineError:
    return LineError(line.line, error.code or "invalid_body", error.message, error.param,
                     line.custom_id)  # fmt: skip


def _length_error(state: GatewayState, line: InputLine, payload: JobPayload) -> LineError | None:
    """Admission's length check for the bulk class (the queue and deadline parts are moot)."""
    envelope = state.envelope
    queues = {c: QueueState(0, 0, max(1, envelope.queue_limit(c))) for c in RequestClass}
    rates = EngineRates(FALLBACK_PREFILL_TOKENS_PER_S, FALLBACK_DECODE_TOKENS_PER_S, 0, 0, False)
    shape = RequestShape(
        RequestClass.BULK, len(payload.prompt_token_ids), payload.sampling.max_tokens, None
    )
    decision = decide_admission(
        shape, envelope.length_limits_by_class(), queues, rates, AdmissionConfig()
    )
    rejection = decision.rejection
    if rejection is None or rejection.status_code == 429:
        return None
    return LineError(line.line, rejection.code, rejection.message, rejection.param, line.custom_id)


def _prepare_one(state: GatewayState, batch_id: str, line: InputLine) -> TodoLine | LineError:
    assert state.engine is not None
    try:
        body = parse_chat_request(line.body)
        if body.model != state.model_name:
            message = f"The model `{body.model[:64]}` does not exist."
            return LineError(line.line, "model_not_found", message, "body.model", line.custom_id)
        if body.stream:
            message = "Batch lines do not stream: leave out 'stream' or set it to false."
            return LineError(line.line, "invalid_body", message, "body.stream", line.custom_id)
        payload = build_payload(state, body, RequestClass.BULK)
    except APIError as error:
        return _error(line, error)
    too_long = _length_error(state, line, payload)
    if too_long is not None:
        return too_long
    job_id = line_job_id(batch_id, line.line)
    try:
        state.engine.engine.validate(payload.generation_request(job_id, RequestClass.BULK, None))
    except RequestValidationError as error:
        return LineError(line.line, error.code, str(error), error.param, line.custom_id)
    prompt_tokens = len(payload.prompt_token_ids)
    return TodoLine(
        line.line, line.custom_id, payload.to_json(), prompt_tokens, payload.cost_tokens
    )


def prepare_lines(state: GatewayState, batch_id: str, parsed: ParsedInput) -> PreparedBatch:
    prepared = PreparedBatch(errors=list(parsed.errors))
    for line in parsed.lines:
        outcome = _prepare_one(state, batch_id, line)
        if isinstance(outcome, LineError):
            prepared.errors.append(outcome)
            continue
        prepared.todo.append(outcome)
        prepared.prompt_tokens += outcome.prompt_tokens
        prepared.output_tokens += outcome.cost_tokens - outcome.prompt_tokens
    prepared.errors.sort(key=lambda e: e.line)
    return prepared
