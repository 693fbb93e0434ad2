"""Redis replies as text, whichever way the client was made (decode_responses or not)."""

from __future__ import annotations

from typing import Any


def redis_text(value: Any) -> str:
    """A reply value as str: bytes decoded, None (a missing field) as ""."""
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)
