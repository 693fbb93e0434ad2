"""Bulk intake's slots on the event loop: fewer while a chat waits for its first token.

Job submissions share the gateway's one event loop with chats. Every step of a submission
(parse, tokenize, admit, answer) is a callback that a chat's own steps queue behind, so a chat
that arrives during a burst of submissions pays for each of its loop hops (handler, admit's
Redis reply, the job task, the engine's answer, the SSE write) a lap of the loop that grows
with the submissions in flight. Measured on the 2-vCPU AMD EPYC (`small`, `mixed`: 400 jobs
posted at once, their intake on the server from ~0.3 to ~0.7 s), the chats sent at 0.42 s
spent 10-56 ms in the hand-off to the engine and 6-13 ms in the SSE write (`bench breakdown`),
~1 ms each for other chats.

So bulk intake runs `limit` submissions at once while no chat waits and `limit_while_chats_wait`
while any does. A chat counts as waiting from its admission to its first text written
(`ChatTicket.release`), or for `max_chat_wait_s` at most (the setting `chat_intake_hold_max_s`:
a ticket that is never released, say of a stream whose client left before its body began,
cannot hold intake down). Submissions already in flight finish; no new one starts past the
lower limit. Slots are handed over in arrival order. `bench compare --workload mixed
--policies mixgate`, 16 slots throughout against 2 while a chat waits, three alternated runs
each: chat TTFT p99 under the backlog 76 / 49 / 85 ms against 54 / 50 / 59 ms (÷ alone 1.41 /
1.33 / 1.82 against 1.25 / 1.09 / 1.28), bulk tokens per busy second the same within noise.

Since then the lower limit is 0 by default: while a chat waits, bulk intake starts nothing new
but one parked submission every `trickle_interval_s` (the setting `job_intake_trickle_s`), so
that a flood of chats (some chat always waiting) slows intake to that trickle and never stops
it. Intake's CPU is what a chat's prefill competes with on two cores (the engine's threads,
the gateway's loop): `bench breakdown --workload mixed --engine vllm`, two alternated runs
each, the six chats sent during the burst's intake had a mean TTFT of 42 / 37 ms against 57 /
54 ms at 2 slots, their worst 59 / 40 against 85 / 83 ms, bulk tokens/s the same.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator

__all__ = ["ChatTicket", "IntakeLane"]


class ChatTicket:
    """One chat waiting for its first text; `release` is idempotent."""

    def __init__(self, lane: IntakeLane, max_wait_s: float) -> None:
        self._lane = lane
        self.released = False
        self._timer: asyncio.TimerHandle | None = None
        with contextlib.suppress(RuntimeError):  # no running loop (a sync caller): no expiry
            self._timer = asyncio.get_running_loop().call_later(max_wait_s, self.release)

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        if self._timer is not None:
            self._timer.cancel()
        self._lane._chat_done()  # noqa: SLF001 - the lane's own ticket


class IntakeLane:
    def __init__(
        self,
        limit: int,
        limit_while_chats_wait: int,
        max_chat_wait_s: float = 1.0,
        trickle_interval_s: float = 0.02,
    ) -> None:
        if limit < 1:
            raise ValueError("the intake limit must be at least 1")
        if limit_while_chats_wait < 0:
            raise ValueError("the intake limit while chats wait must be at least 0")
        if max_chat_wait_s <= 0 or trickle_interval_s <= 0:
            raise ValueError("max_chat_wait_s and trickle_interval_s must be positive")
        self.limit = limit
        # Never more than the full limit (a setting above it means "no lower limit").
        self.limit_while_chats_wait = min(limit_while_chats_wait, limit)
        self.max_chat_wait_s = max_chat_wait_s
        self.trickle_interval_s = trickle_interval_s
        self.in_flight = 0
        self.chats_waiting = 0
        self._parked: collections.deque[asyncio.Future[None]] = collections.deque()
        # The timer of the next trickled start, while submissions are parked behind chats.
        self._trickle: asyncio.TimerHandle | None = None

    def current_limit(self) -> int:
        return self.limit_while_chats_wait if self.chats_waiting else self.limit

    @property
    def parked(self) -> int:
        return sum(1 for future in self._parked if not future.done())

    def chat_arrived(self) -> ChatTicket:
        """Count a chat as waiting until its ticket is released (or `max_chat_wait_s`)."""
        self.chats_waiting += 1
        return ChatTicket(self, self.max_chat_wait_s)

    @contextlib.asynccontextmanager
    async def bulk(self) -> AsyncIterator[None]:
        """Hold one bulk intake slot for the block (parked in arrival order until one frees)."""
        await self._acquire()
        try:
            yield
        finally:
            self.in_flight -= 1
            self._hand_over()

    async def _acquire(self) -> None:
        if not self._parked and self.in_flight < self.current_limit():
            self.in_flight += 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._parked.append(future)
        self._arm_trickle()
        try:
            await future  # a slot handed over: in_flight counts it already
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                # Handed a slot in the same turn it was cancelled: give it on.
                self.in_flight -= 1
                self._hand_over()
            raise

    def _chat_done(self) -> None:
        self.chats_waiting -= 1
        self._hand_over()

    def _hand_over(self) -> None:
        while self._parked and self.in_flight < self.current_limit():
            self._start_next()
        self._arm_trickle()

    def _start_next(self) -> bool:
        """Start the first parked submission; False where its waiter was cancelled."""
        future = self._parked.popleft()
        if future.done():  # its waiter was cancelled
            return False
        self.in_flight += 1
        future.set_result(None)
        return True

    def _room(self) -> bool:
        return self.in_flight < self.limit

    def _arm_trickle(self) -> None:
        """While chats hold intake below what is parked, start one more every interval."""
        # A full lane arms nothing: the slot that frees hands over (and re-arms) itself.
        if self._trickle is None and self._parked and self.chats_waiting and self._room():
            loop = asyncio.get_running_loop()
            self._trickle = loop.call_later(self.trickle_interval_s, self._trickle_one)

    def _trickle_one(self) -> None:
        self._trickle = None
        # Past the lower limit, never past the full one.
        while self._parked and self._room() and not self._start_next():
            pass  # a cancelled waiter skipped: try the next
        self._arm_trickle()
