"""POST /v1/completions: OpenAI's legacy completions (vllm bench serve's default endpoint).

The same path as chat (`gateway.http.generation_stream`): classification, admission, queues,
envelope limits, delivery, SSE format and usage chunk; only the prompt (text tokenized with
the model's special tokens, or token ids as given) and the JSON shapes are this endpoint's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway.admission.intake import Admitted, payload_for_prompt
from gateway.http.errors import APIError
from gateway.http.generation_stream import accept_request, admit_and_answer
from gateway.http.schemas_completions import (
    CompletionRequest,
    completion_body,
    completion_chunk_body,
    parse_completion_request,
    prompt_text_or_ids,
)
from gateway.http.state import GatewayState


class CompletionShape:
    """`text_completion` bodies and chunks (no role chunk: the first chunk is text)."""

    endpoint = "completions"

    def first_chunk(self, admitted: Admitted) -> dict[str, Any] | None:
        return None

    def text_chunk(self, admitted: Admitted, text: str) -> dict[str, Any]:
        payload = admitted.payload
        return completion_chunk_body(admitted.job_id, payload.created_s, payload.model, text, None)

    def finish_chunk(self, admitted: Admitted, finish_reason: str) -> dict[str, Any]:
        payload = admitted.payload
        return completion_chunk_body(
            admitted.job_id, payload.created_s, payload.model, "", finish_reason
        )

    def usage_chunk(self, admitted: Admitted, usage: Mapping[str, int]) -> dict[str, Any]:
        payload = admitted.payload
        return completion_chunk_body(
            admitted.job_id, payload.created_s, payload.model, "", None, usage
        )

    def whole_body(
        self, admitted: Admitted, text: str, finish_reason: str, usage: Mapping[str, int]
    ) -> dict[str, Any]:
        payload = admitted.payload
        return completion_body(
            admitted.job_id, payload.created_s, payload.model, text, finish_reason, usage
        )


def _prompt_ids(state: GatewayState, body: CompletionRequest) -> list[int]:
    prompt = prompt_text_or_ids(body)
    if not isinstance(prompt, str):
        return prompt  # the engine checks the ids against the vocabulary (400 `prompt`)
    assert state.tokenizer is not None
    ids = state.tokenizer.encode(prompt, add_special_tokens=True)
    if not ids:
        raise APIError.invalid_request("the prompt encodes to no tokens", param="prompt")
    return ids


async def completions(request: Request) -> Response:
    accepted = await accept_request(request, parse_completion_request)
    prompt = _prompt_ids(accepted.state, accepted.body)
    payload = payload_for_prompt(accepted.state, accepted.body, accepted.request_class, prompt)
    return await admit_and_answer(request, accepted, payload, CompletionShape(), id_prefix="cmpl-")
