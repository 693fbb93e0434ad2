"""Whether a step counts interactive work as present, for the bulk prefill cap.

The cap on bulk prefill per step (policies/step_budget.py) bounds how long a chat waits for the
step under way when it arrives. With no interactive sequence in the engine the cap is off, so
that bulk alone runs full-budget steps. But a chat arriving in a gap between chats then waits
for a whole uncapped step: under the `chat-over-backlog` load (2 chats/s, ~1 s each) about one
chat in seven arrives into such a gap, and those made the phase's TTFT tail (native engine,
three runs: slowest chat arriving in a gap 84/111/104 ms, arriving beside another chat
60/70/52 ms, alone 50 ms).

So the cap stays on for `linger_s` after interactive work was last seen: a Poisson stream of
chats keeps its steps short through its gaps, and bulk alone gets full steps `linger_s` after
the last chat. Clock injected (`now_s`): the simulator runs it in virtual time.
"""

from __future__ import annotations

__all__ = ["InteractivePresence"]


class InteractivePresence:
    def __init__(self, linger_s: float) -> None:
        if linger_s < 0:
            raise ValueError("linger_s must be non-negative")
        self.linger_s = linger_s
        self._last_seen_s: float | None = None

    def observe(self, present_now: bool, now_s: float) -> bool:
        """Record this step's presence; whether to treat interactive work as present."""
        if present_now:
            self._last_seen_s = now_s
            return True
        return self._last_seen_s is not None and now_s - self._last_seen_s < self.linger_s
