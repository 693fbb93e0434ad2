"""GET /v1/engine/steps: the engine's recent steps, each with when it ran and what it carried.

/metrics sums the steps up (tokens and seconds by class and kind); this lists them one by one,
so that a chat's wait can be laid against the steps it waited on: a streamed chat's timings
(`x-mixgate-timings: 1`) carry ``handed_at_s`` and ``first_token_at_s`` on the same clock as
``started_s`` here (the host's monotonic clock, which the engine's process and this one both
read). `mixgate bench breakdown` reads it to name the steps behind each slow chat.

The list is the window the gateway keeps (gateway.http.metrics.engine_step_records: up to
4,096 steps); ``after_step`` returns only the steps after one already read, so a reader that
comes back within the window misses none (``first_step`` says where the window starts).
No API key: like /metrics, it says how busy the engine is, nothing about any tenant's work.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.core.step_record import StepRecord
from gateway.http.errors import APIError
from gateway.http.metrics import engine_step_records
from gateway.http.state import GatewayState

__all__ = ["engine_steps", "step_object"]


def step_object(record: StepRecord) -> dict[str, Any]:
    """One step as the endpoint lists it: tokens by class, then kind."""
    tokens: dict[str, dict[str, int]] = {}
    for (request_class, kind), count in record.tokens_by_kind.items():
        tokens.setdefault(request_class.value, {})[kind] = count
    return {
        "step_index": record.step_index,
        "started_s": record.started_s,
        "duration_s": record.duration_s,
        "tokens": tokens,
        "running": {c.value: n for c, n in record.running_by_class.items()},
        "waiting": {c.value: n for c, n in record.waiting_by_class.items()},
        "kv_usage": record.kv_usage,
        "preemptions": record.num_preemptions,
    }


def _after_step(request: Request) -> int:
    raw = request.query_params.get("after_step", "-1")
    try:
        after = int(raw)
    except ValueError:
        after = -2
    if after < -1:
        raise APIError.invalid_request(
            "after_step must be an integer >= -1 (a step_index already read)", param="after_step"
        )
    return after


async def engine_steps(request: Request) -> Response:
    after = _after_step(request)
    state: GatewayState = request.app.state.gw
    records = engine_step_records(state.engine)
    listed = [step_object(r) for r in records if r.step_index > after]
    return JSONResponse(
        {
            "object": "list",
            "clock": "monotonic",
            "data": listed,
            "first_step": records[0].step_index if records else None,
            "last_step": records[-1].step_index if records else None,
        }
    )
