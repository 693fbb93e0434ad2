"""Whether a step counts interactive work as present, for the bulk prefill cap.

The cap on bulk prefill per step (policies/step_budget.py) bounds how long a chat waits for the
step under way when it arrives. Lifting it while no interactive work is in the engine lets bulk
alone run full-budget steps; a chat that then arrives into the lull waits for one whole
uncapped step. `linger_s` sets how long after interactive work was last seen the cap lifts:
0 (the default, EngineConfig's) at once; None never.

Measured end to end, `mixgate bench compare --workload chat-over-backlog` (native engine,
`small`, 2 threads, chunk 256, three repeats each): the slowest chat after the phase's first
was 63-107 ms with the cap lifting at once (two runs), 77-91 ms with a 2 s linger, 63-74 ms with
the cap never lifting: within the runs' noise. The phase's first chat (no chat before it, 48 job
submissions under way) took 84-130 ms under all three; its time is the gateway's and the
engine's under the submission burst, not an uncapped step. Bulk alone drained 959 output tokens
per busy second with the lift, 863 with the cap always on (vllm-priority in the same runs: 851,
813). So the lift stays the default and the linger an option: a device whose full-budget step
is long (a GPU's 8k-token prefill) is where a lull's chat would feel it.
Clock injected (`now_s`): the simulator runs it in virtual time.
"""

from __future__ import annotations

__all__ = ["DEFAULT_LINGER_S", "InteractivePresence"]

# EngineConfig's default and the vLLM scheduler's when the knob is absent: lift at once.
DEFAULT_LINGER_S = 0.0


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
