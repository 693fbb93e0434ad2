"""The checks every engine backend applies to a request before accepting it, in one place so that
the gateway's 400s read the same whichever engine runs."""

from __future__ import annotations

from engine.core.errors import RequestValidationError
from engine.core.request import GenerationRequest


def check_request_limits(
    request: GenerationRequest, *, max_model_len: int, kv_capacity_tokens: int, vocab_size: int
) -> None:
    """Raise RequestValidationError for a request the engine must not accept."""
    prompt_len = len(request.prompt_token_ids)
    total = prompt_len + request.sampling.max_tokens
    if prompt_len >= max_model_len:
        raise RequestValidationError(
            f"the prompt has {prompt_len} tokens; this model's context is "
            f"{max_model_len} tokens, including at least one output token",
            code="context_length_exceeded",
            param="messages",
        )
    if total > max_model_len:
        raise RequestValidationError(
            f"prompt ({prompt_len} tokens) + max_tokens ({request.sampling.max_tokens}) "
            f"exceeds the context of {max_model_len} tokens",
            code="context_length_exceeded",
            param="max_tokens",
        )
    if total > kv_capacity_tokens:
        raise RequestValidationError(
            f"the request needs up to {total} tokens of KV cache; the whole cache holds "
            f"{kv_capacity_tokens}",
            code="context_length_exceeded",
            param="max_tokens",
        )
    ids = request.prompt_token_ids  # never empty (GenerationRequest checks)
    # NOTE: min/max run in C: ~10x faster than a generator over a long prompt.
    if min(ids) < 0 or max(ids) >= vocab_size:
        raise RequestValidationError(
            f"prompt token ids must be in [0, {vocab_size})", param="prompt"
        )
