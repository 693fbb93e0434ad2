"""One event of a request's token stream, and the ids that name it, wherever it travels.

An event goes to its reader either in-process (`gateway.dispatch.local_delivery`) or as an
entry of the request's Redis stream (`gateway.dispatch.token_stream`); both modules import this
one, neither the other's internals. Kinds, and the JSON each carries (`data`):
- `delta`: {"text": str, "token_ids": [int]}
- `end`:   {"finish_reason": str, "usage": {...}, "timings": {...}}   (the last event)
- `error`: {"status": int, "code": str, "message": str}              (the last event)

An event's id is a Redis stream id (`<ms>-<seq>`), and on a resumable stream it is the SSE
`id:` its frame carries, so a client's `Last-Event-ID` is where a resume reads the stream
from. Events written to Redis by whoever runs the job take Redis's own ids; a resumable
stream's events delivered in-process are numbered `0-1`, `0-2`, ... (`local_event_id`), the
ids they keep when the attempt writes them to Redis after its client left; other in-process
events have none (""). `0-n` sorts below any id Redis hands out, so the stream stays in order
when its last event is appended with `*`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

DELTA, END, ERROR = "delta", "end", "error"

# A Redis stream id: two unsigned 64-bit integers. Bounded in digits, so a hostile header is
# refused before it reaches Redis.
_STREAM_ID = re.compile(r"^(\d{1,20})-(\d{1,20})$")
_MAX_U64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class StreamEvent:
    kind: str
    data: dict[str, Any]
    # The event's id (a resumable stream's SSE `id:`); "" for one that has none (in-process on
    # a stream nobody can resume, or an error this replica made up, e.g. its reader failed).
    entry_id: str

    @property
    def is_last(self) -> bool:
        return self.kind in (END, ERROR)


def event_json(data: dict[str, Any]) -> str:
    # orjson: ~10x json.dumps; the same compact JSON (non-ASCII kept as UTF-8, not escaped).
    return orjson.dumps(data).decode()


def local_event_id(index: int) -> str:
    """The id of a stream's `index`-th in-process event (from 1; `0-0` is "before all")."""
    return f"0-{index}"


def parse_event_id(text: str) -> tuple[int, int] | None:
    """A stream id as (ms, seq); None when `text` is not one (a client's bad Last-Event-ID)."""
    match = _STREAM_ID.match(text.strip())
    if match is None:
        return None
    ms, seq = int(match.group(1)), int(match.group(2))
    if ms > _MAX_U64 or seq > _MAX_U64:
        return None
    return ms, seq
