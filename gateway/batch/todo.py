"""A batch line waiting in the batch's todo list (Redis) to be fed to the bulk queue."""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = ["TodoLine"]


@dataclass(frozen=True, slots=True)
class TodoLine:
    """One valid line waiting to be fed to the bulk queue (stored as JSON in Redis)."""

    line: int
    custom_id: str
    # The JobPayload JSON, queued as is.
    request_json: str
    prompt_tokens: int
    # Prompt + max_tokens: what the line adds to the bulk queue's token count.
    cost_tokens: int

    def to_json(self) -> str:
        data = {
            "line": self.line,
            "custom_id": self.custom_id,
            "request": self.request_json,
            "prompt": self.prompt_tokens,
            "cost": self.cost_tokens,
        }
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> TodoLine:
        data = json.loads(text)
        return cls(
            int(data["line"]),
            str(data["custom_id"]),
            str(data["request"]),
            int(data["prompt"]),
            int(data["cost"]),
        )
