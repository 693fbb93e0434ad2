"""Redis commands per streamed chat, counted at the server, for `mixgate bench gateway`.

`INFO commandstats` before and after a run of chats one after another, minus what the replica
issues when idle over the same time (health pings, depth reads, dispatcher waits), measured just
before on the same server, divided by the chats. The INFO calls of this counter itself are left
out. Several chats, not one: the idle loops issue their commands in bursts about a second apart,
so over one chat's ~0.3 s the idle rate's correction was off by a whole burst (3 commands) or
none. Over eight chats it was still off by up to half a command per chat (11.6-12.5 measured
for a chat whose three scripts run exactly 12 commands); over 32, after an idle window of two
health-check periods, by about a tenth.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

__all__ = ["ChatCommands", "count_chat_commands", "total_commands"]


def total_commands(client: redis.Redis) -> int:
    """Calls of every command so far, without INFO (the counter's own)."""
    stats = client.info("commandstats")
    return sum(
        int(entry["calls"])
        for name, entry in stats.items()
        if isinstance(entry, dict) and name != "cmdstat_info"
    )


@dataclass(frozen=True, slots=True)
class ChatCommands:
    per_chat: float
    idle_per_s: float
    # Over all `chats` chats together.
    raw_during_chat: int
    chat_s: float
    chats: int


def count_chat_commands(
    redis_url: str, run_chat: Callable[[], None], idle_window_s: float = 10.0, chats: int = 32
) -> ChatCommands:
    """Commands one `run_chat()` costs: the raw count of `chats` runs minus the idle rate over
    their duration, per chat."""
    if chats < 1:
        raise ValueError(f"chats must be >= 1, got {chats}")
    client = redis.Redis.from_url(redis_url)
    try:
        start_idle = total_commands(client)
        t0 = time.perf_counter()
        time.sleep(idle_window_s)  # a measurement window, not synchronisation
        idle_per_s = (total_commands(client) - start_idle) / (time.perf_counter() - t0)
        before = total_commands(client)
        t1 = time.perf_counter()
        for _ in range(chats):
            run_chat()
        chat_s = time.perf_counter() - t1
        raw = total_commands(client) - before
    finally:
        client.close()
    return ChatCommands(
        per_chat=max(0.0, raw - idle_per_s * chat_s) / chats,
        idle_per_s=idle_per_s,
        raw_during_chat=raw,
        chat_s=chat_s,
        chats=chats,
    )
