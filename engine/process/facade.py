"""The parent's stand-in for LLMEngine: what the gateway reads of `async_engine.engine`."""

from __future__ import annotations

import time

from engine.core.request import GenerationRequest
from engine.core.request_limits import check_request_limits
from engine.process.messages import EngineReady
from engine.text.tokenizer import Tokenizer


class EngineFacade:
    """Tokenizer, clock, limits and validation, kept in the gateway's process.

    NOTE: the clock is time.monotonic, as in the child: CLOCK_MONOTONIC is one clock for every
    process on a Linux machine, so arrival times stamped here compare with the engine's.
    """

    def __init__(self, tokenizer: Tokenizer, ready: EngineReady) -> None:
        self.tokenizer = tokenizer
        self.clock = time.monotonic
        self.max_model_len = ready.max_model_len
        self.kv_capacity_tokens = ready.kv_capacity_tokens
        self.vocab_size = ready.vocab_size
        self.eos_token_ids = tuple(ready.eos_token_ids)

    def validate(self, request: GenerationRequest) -> None:
        check_request_limits(
            request,
            max_model_len=self.max_model_len,
            kv_capacity_tokens=self.kv_capacity_tokens,
            vocab_size=self.vocab_size,
        )
