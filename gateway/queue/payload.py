"""What a queued request carries through Redis: enough for any replica to run it."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import orjson

from engine.core.request import GenerationRequest
from engine.core.sampling_params import SamplingParams
from policies.request_class import RequestClass


@dataclass(frozen=True, slots=True)
class JobPayload:
    """The job hash's `request` field: the tokenized prompt and decoding settings.

    NOTE: the prompt travels tokenized, so the replica that runs it needs no chat template
    and admission counted exactly the tokens that will run.
    """

    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    # The model name the client asked for (echoed in responses).
    model: str
    # Wall-clock seconds when the gateway received the request (OpenAI's `created`).
    created_s: int
    stream: bool = False
    include_usage: bool = False
    # Anything else the HTTP layer wants echoed back (e.g. the client's `user`).
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        # NOTE: not dataclasses.asdict: it deep-copies every prompt token id one at a time, ~2 ms
        # of event loop for a 1k-token prompt, and a burst of job submissions stalled chats.
        sampling = {
            f.name: getattr(self.sampling, f.name)
            for f in fields(self.sampling)
            if f.name != "max_stop_strings"
        }
        data = {
            "prompt_token_ids": list(self.prompt_token_ids),
            "sampling": {k: list(v) if isinstance(v, tuple) else v for k, v in sampling.items()},
            "model": self.model,
            "created_s": self.created_s,
            "stream": self.stream,
            "include_usage": self.include_usage,
            "extra": self.extra,
        }
        # orjson: ~10x the stdlib's speed on a long list of token ids, on every submission.
        return orjson.dumps(data).decode()

    @classmethod
    def from_json(cls, text: str) -> JobPayload:
        data = orjson.loads(text)
        sampling = dict(data["sampling"])
        sampling["stop"] = tuple(sampling.get("stop", ()))
        sampling["stop_token_ids"] = tuple(sampling.get("stop_token_ids", ()))
        return cls(
            prompt_token_ids=tuple(data["prompt_token_ids"]),
            sampling=SamplingParams(**sampling),
            model=data["model"],
            created_s=int(data["created_s"]),
            stream=bool(data.get("stream", False)),
            include_usage=bool(data.get("include_usage", False)),
            extra=dict(data.get("extra", {})),
        )

    def generation_request(
        self,
        request_id: str,
        request_class: RequestClass,
        arrival_s: float | None,
        handed_s: float | None = None,
    ) -> GenerationRequest:
        return GenerationRequest(
            request_id=request_id,
            prompt_token_ids=self.prompt_token_ids,
            sampling=self.sampling,
            request_class=request_class,
            arrival_s=arrival_s,
            handed_s=handed_s,
        )

    @property
    def cost_tokens(self) -> int:
        """Prompt plus the most output it may produce: the work it adds to its queue."""
        return len(self.prompt_token_ids) + self.sampling.max_tokens
