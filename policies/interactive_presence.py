"""Whether a step counts interactive work as present, for the bulk prefill cap.

The cap on bulk prefill per step (policies/step_budget.py) bounds how long a chat waits for the
step under way when it arrives. Lifting it while no interactive work is in the engine lets bulk
alone run full-budget steps, but then a chat that arrives into a lull waits for a whole
uncapped step. Under `chat-over-backlog` (2 chats/s, ~1 s each, native engine, three runs)
those chats made the TTFT tail: arriving between chats 84/111/104 ms, beside another chat
60/70/52, alone 50; and with a linger of 2 s the phase's first chat, which has no chat before
it, still took 102/110/130 ms, 50 of them waiting for a 512-token bulk step.

The lift pays only where a step's fixed cost is a large part of it. On the native engine it is
not any more: 48 bulk prompts of 769-1,519 tokens x 128 tokens alone on `small` (2 threads,
medians of 3) drained at 1,002 output tokens/s in steps of 288 tokens (256 prefill + 32 decodes)
and 969 in steps of 512; steps of 160 cost 7% (904). So the lift is an option (`linger_s`: lift
that long after interactive work was last seen), and None, the cap never lifts, is the default.
Clock injected (`now_s`): the simulator runs it in virtual time.
"""

from __future__ import annotations

__all__ = ["InteractivePresence"]


class InteractivePresence:
    def __init__(self, linger_s: float | None) -> None:
        if linger_s is not None and linger_s < 0:
            raise ValueError("linger_s must be non-negative")
        self.linger_s = linger_s
        self._last_seen_s: float | None = None

    def observe(self, present_now: bool, now_s: float) -> bool:
        """Record this step's presence; whether to treat interactive work as present."""
        if present_now:
            self._last_seen_s = now_s
            return True
        if self.linger_s is None:
            return True
        return self._last_seen_s is not None and now_s - self._last_seen_s < self.linger_s
