"""Driving a plain vLLM server the way its users would, with the same seeded workload.

Interactive requests stream chat completions over SSE (as against mixgate); bulk requests
are concurrent non-streamed chat completions, with `priority: 1` when the server schedules by
priority (vLLM refuses a priority under fcfs). Records are the same `RequestRecord`s, so the
summary, report and plots read both alike. vLLM has no queue and no admission: every request
is in flight until it is answered.
"""

from __future__ import annotations

import random
from typing import Any

from bench.load.http_clients import HttpSender, _refused
from bench.load.records import OK, RequestRecord
from bench.load.workload import PlannedRequest
from policies.request_class import RequestClass

__all__ = ["VllmSender"]

_PRIORITY = {RequestClass.INTERACTIVE: 0, RequestClass.BULK: 1}


class VllmSender(HttpSender):
    """`HttpSender` with bulk as plain chat completions and the class as vLLM's priority."""

    def __init__(self, *args: Any, use_priority: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._use_priority = use_priority

    def _class_fields(self, request_class: RequestClass) -> dict[str, Any]:
        return {"priority": _PRIORITY[request_class]} if self._use_priority else {}

    async def _bulk(
        self,
        request: PlannedRequest,
        record: RequestRecord,
        body: dict[str, Any],
        rng: random.Random,
    ) -> None:
        await self._completion(record, body)

    async def _completion(self, record: RequestRecord, body: dict[str, Any]) -> None:
        sent = self._clock()
        response = await self._client.post("/v1/chat/completions", json=body)
        if response.status_code != 200:
            _refused(record, response, response.content)
            return
        record.status_code = 200
        record.e2e_s = self._clock() - sent
        usage = response.json().get("usage") or {}
        record.output_tokens = int(usage.get("completion_tokens", 0))
        record.outcome = OK
