"""The path every generation request takes before it is queued, shared by chat and jobs:
auth and rate limit, classification, tokenization, sampling settings, admission, enqueue."""

from __future__ import annotations

import asyncio
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import structlog
from starlette.requests import Request

from engine.core.errors import RequestValidationError
from engine.core.sampling_params import SamplingParams
from engine.text.tokenizer import GIL_RELEASE_MIN_CHARS
from gateway.http.auth import Principal
from gateway.http.errors import APIError
from gateway.http.schemas import (
    ChatCompletionRequest,
    effective_max_tokens,
    messages_as_dicts,
    stop_list,
)
from gateway.http.schemas_sampling import SamplingRequest
from gateway.http.state import GatewayState
from gateway.queue import AdmitStatus, NewJob
from gateway.queue.payload import JobPayload
from policies.admission import RequestShape
from policies.classify import CLASS_HEADER, classify
from policies.request_class import RequestClass
from policies.scheduling_policy import SchedulingPolicy

DEADLINE_HEADER = "x-mixgate-deadline-ms"
# Worker threads for bulk tokenizing: HF tokenizers' Rust runs beside the loop; more threads
# than cores would only contend for the GIL the template rendering needs.
TOKENIZE_THREADS = 2
# Admission's predicted TTFT in ms, on every admitted chat stream and job submission.
PREDICTED_TTFT_HEADER = "x-mixgate-predicted-ttft-ms"
log = structlog.get_logger("mixgate.intake")


@dataclass(frozen=True, slots=True)
class Admitted:
    job_id: str
    request_class: RequestClass
    payload: JobPayload
    enqueue_ms: int
    deadline_ms: int
    # Admission's predicted TTFT (seconds from admission), for `x-mixgate-predicted-ttft-ms`.
    predicted_ttft_s: float | None = None

    @property
    def prediction_headers(self) -> dict[str, str]:
        if self.predicted_ttft_s is None:
            return {}
        return {PREDICTED_TTFT_HEADER: f"{self.predicted_ttft_s * 1000:.1f}"}


def require_ready(state: GatewayState) -> None:
    reasons = state.not_ready_reasons()
    if reasons:
        raise APIError.service_unavailable("the service is not ready: " + "; ".join(reasons))


def require_model(state: GatewayState, model: str) -> None:
    if model != state.model_name:
        raise APIError.not_found(
            f"The model `{model}` does not exist.", param="model", code="model_not_found"
        )


def authenticate(request: Request, state: GatewayState) -> Principal:
    principal = state.auth.authenticate(request.headers.get("authorization"))
    structlog.contextvars.bind_contextvars(tenant=principal.tenant, key_id=principal.key_id)
    wait_s = state.limiter.check(principal, time.monotonic())
    if wait_s is not None:
        raise APIError.rate_limit(
            f"rate limit of {principal.rate_limit_per_s} requests/s exceeded for this key", wait_s
        )
    return principal


def request_class(
    request: Request, endpoint_default: RequestClass, service_tier: str | None, principal: Principal
) -> RequestClass:
    result = classify(
        endpoint_default, service_tier, request.headers.get(CLASS_HEADER), principal.allowed_classes
    )
    if result.error is not None:
        err = result.error
        raise APIError(err.status_code, err.message, err.error_type, err.code, err.param)
    assert result.request_class is not None
    return result.request_class


def build_payload(
    state: GatewayState, body: ChatCompletionRequest, request_class: RequestClass
) -> JobPayload:
    """Tokenize with the chat template and settle the decoding settings (400 on nonsense)."""
    assert state.tokenizer is not None
    prompt = _encode(state, messages_as_dicts(body))
    return payload_for_prompt(state, body, request_class, prompt)


async def build_payload_off_loop(
    state: GatewayState, body: ChatCompletionRequest, request_class: RequestClass
) -> JobPayload:
    """`build_payload` with the chat template and tokenizer run on a worker thread.

    NOTE: bulk intake only: a burst of job submissions must not hold the event loop for the
    tokenizer of each (a chat's are on the loop: one thread hop fewer for it). Only a long
    prompt goes to the worker: a short one's encode keeps the GIL for its whole (sub-ms) run
    (`engine.text.tokenizer.GIL_RELEASE_MIN_CHARS`), as the template's rendering always does,
    so on a worker it would hold the loop just the same and add the hop (two thread switches
    and a wake-up of the loop).
    """
    messages = messages_as_dicts(body)
    # The messages' text is the bulk of the rendered prompt.
    if sum(len(m["content"]) for m in messages) < GIL_RELEASE_MIN_CHARS:
        prompt = _encode(state, messages)
    else:
        loop = asyncio.get_running_loop()
        prompt = await loop.run_in_executor(_tokenize_pool(), _encode, state, messages)
    return payload_for_prompt(state, body, request_class, prompt)


_POOL: ThreadPoolExecutor | None = None


def _tokenize_pool() -> ThreadPoolExecutor:
    global _POOL  # noqa: PLW0603 - one pool per process, made on first use
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=TOKENIZE_THREADS, thread_name_prefix="tokenize")
    return _POOL


def _encode(state: GatewayState, messages: list[dict[str, str]]) -> list[int]:
    assert state.tokenizer is not None
    try:
        return state.tokenizer.encode_chat(messages)
    except ValueError as error:
        raise APIError.invalid_request(
            f"could not render the chat template: {error}", param="messages"
        ) from error


def payload_for_prompt(
    state: GatewayState, body: SamplingRequest, request_class: RequestClass, prompt: list[int]
) -> JobPayload:
    """The job payload for a tokenized prompt: the body's decoding settings (400 on nonsense)."""
    limits = state.envelope.length_limits(request_class)
    room = max(1, min(limits.max_output_tokens, limits.max_context_tokens - len(prompt)))
    try:
        sampling = SamplingParams(
            max_tokens=effective_max_tokens(body, room),
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=-1 if body.top_k is None else body.top_k,
            seed=body.seed,
            stop=stop_list(body),
            stop_token_ids=tuple(body.stop_token_ids or ()),
            ignore_eos=bool(body.ignore_eos),
            min_tokens=body.min_tokens or 0,
            min_p=0.0 if body.min_p is None else body.min_p,
            repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
        )
    except ValueError as error:
        raise APIError.invalid_request(str(error)) from error
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return JobPayload(
        prompt_token_ids=tuple(prompt),
        sampling=sampling,
        model=body.model,
        created_s=int(time.time()),
        stream=bool(body.stream),
        include_usage=include_usage,
    )


def interactive_deadline_s(request: Request) -> float | None:
    raw = request.headers.get(DEADLINE_HEADER)
    if raw is None:
        return None
    try:
        deadline_ms = float(raw)
    except ValueError:
        deadline_ms = -1.0
    if not 0 < deadline_ms <= 86_400_000:
        raise APIError.invalid_request(
            f"{DEADLINE_HEADER} must be a positive number of milliseconds", param=DEADLINE_HEADER
        )
    return deadline_ms / 1000.0


async def admit(
    state: GatewayState,
    principal: Principal,
    request_class: RequestClass,
    payload: JobPayload,
    *,
    deadline_s: float | None,
    id_prefix: str,
    custom_id: str | None = None,
    metadata_json: str = "{}",
    batched: bool = False,
) -> Admitted:
    """Decide, then enqueue; raises APIError (413/400/429) when the request is refused.

    `batched`: the admit shares one script call with other submissions (bulk intake).
    """
    assert state.admission is not None and state.engine is not None
    prompt_tokens = len(payload.prompt_token_ids)
    if not SchedulingPolicy(state.settings.policy).admits_by_deadline:
        deadline_s = None  # the baselines have no deadline admission
    shape = RequestShape(request_class, prompt_tokens, payload.sampling.max_tokens, deadline_s)
    decision = await state.admission.decide(shape)
    if decision.rejection is not None:
        rejection = decision.rejection
        state.metrics.rejections.labels(request_class.value, rejection.code).inc()
        log.info(
            "rejected",
            code=rejection.code,
            predicted_ttft_s=decision.predicted_ttft_s,
            predicted_finish_s=decision.predicted_finish_s,
            deadline_s=decision.deadline_s,
        )
        if rejection.retry_after_s is not None:
            error = APIError.rate_limit(rejection.message, rejection.retry_after_s, rejection.code)
            error.param = rejection.param
            raise error
        raise APIError(
            rejection.status_code,
            rejection.message,
            rejection.error_type,
            rejection.code,
            rejection.param,
        )
    job_id = f"{id_prefix}{secrets.token_urlsafe(18)}"
    try:
        state.engine.engine.validate(payload.generation_request(job_id, request_class, None))
    except RequestValidationError as error:
        http_status = 413 if error.code == "context_length_exceeded" else 400
        raise APIError(
            http_status, str(error), "invalid_request_error", error.code, error.param
        ) from error
    enqueue_ms = int(time.time() * 1000)
    deadline_ms = enqueue_ms + int(decision.deadline_s * 1000)
    status = await state.admission.enqueue(
        NewJob(
            job_id=job_id,
            tenant=principal.tenant,
            request_class=request_class,
            request_json=payload.to_json(),
            enqueue_ms=enqueue_ms,
            cost_tokens=payload.cost_tokens,
            queue_limit=state.envelope.queue_limit(request_class),
            deadline_ms=deadline_ms,
            max_attempts=state.settings.max_attempts,
            custom_id=custom_id,
            metadata_json=metadata_json,
            model=payload.model,
            created_s=payload.created_s,
        ),
        prompt_tokens,
        batched=batched,
        # A lone admit (a chat) starts on this replica at once when it has a free slot.
        admit_one=None if state.dispatcher is None else state.dispatcher.admit_here,
    )
    if status is AdmitStatus.QUEUE_FULL:
        state.metrics.rejections.labels(request_class.value, "queue_full").inc()
        raise APIError.queue_full(f"The {request_class.value} queue is full.", 1.0)
    if status is not AdmitStatus.ADMITTED:
        log.error("enqueue_failed", status=str(status))
        raise APIError.internal()
    structlog.contextvars.bind_contextvars(job_id=job_id, request_class=request_class.value)
    return Admitted(
        job_id, request_class, payload, enqueue_ms, deadline_ms, decision.predicted_ttft_s
    )
