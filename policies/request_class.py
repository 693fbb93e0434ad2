"""The two traffic classes every layer speaks of."""

from __future__ import annotations

from enum import StrEnum


class RequestClass(StrEnum):
    """Interactive: a person waits on a stream (TTFT, ITL). Bulk: throughput and a deadline."""

    INTERACTIVE = "interactive"
    BULK = "bulk"
