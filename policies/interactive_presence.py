"""Whether a step counts interactive work as present, for the bulk prefill cap.

The cap on bulk prefill per step (policies/step_budget.py) bounds how long a chat waits for the
step under way when it arrives. Lifting it while no interactive work is in the engine lets bulk
alone run full-budget steps; a chat that then arrives into the lull waits for one whole
uncapped step. `linger_s` sets how long bulk must have had the engine to itself before the cap
lifts: since interactive work was last seen, or since the engine's current busy stretch began
(its first step after `linger_s` or more without one), whichever is later. 0: at once; None:
never; 2 s by default (EngineConfig's).

Why a busy stretch starts capped: work that lands on an idle engine says nothing yet about
whether chats come with it, and a backlog's first steps are its most expensive (admission: a
whole 512-token prefill budget a step). Counted from the last chat ever seen instead, a backlog
that arrived after a quiet spell ran full-budget steps at once, and a chat that came a moment
after it waited for one: on the 2-vCPU AMD EPYC (`small`) the chat sent 0.26 s into
`chat-over-backlog`'s mixed phase was that phase's slowest in three of four mixgate-vllm runs
(queueing 76-119 ms behind a 95-97 ms step, TTFT p99 under the backlog 2.1x its value alone),
and in a run where a chat reached the engine before the backlog's first job, so that the cap
held from the start, TTFT p99 under the backlog was 1.46x (an engine-core trace: bulk drained
in the same 12 s as alone, ~14 bulk sequences decoding beside 128-token chunks). With the
stretch's start counted (`bench compare --workload chat-over-backlog --policies
vllm-priority,mixgate,mixgate-vllm --repeats 3`, load 1.2-1.8), that chat took 80-100 ms on
mixgate-vllm and was no longer the slowest: TTFT p99 under the backlog / alone 2.13x -> 2.00x
(mixgate-vllm) and 1.45x -> 1.30x (native); on `mixed` (one run) 2.85x -> 1.75x on
mixgate-vllm. A bulk-only stretch pays `linger_s` of capped steps at its start.

Measured end to end, `mixgate bench compare --workload chat-over-backlog` (native engine,
`small`, 2 threads, chunk 256, three repeats each) on the 2-vCPU Xeon: the slowest chat after
the phase's first was 63-107 ms with the cap lifting at once (two runs), 77-91 ms with a 2 s
linger, 63-74 ms with the cap never lifting: within the runs' noise there. On the 2-vCPU AMD
EPYC (AVX2), where steps take about twice as long, a lull's full-budget step (512 bulk prefill
tokens beside the bulk decodes) took 50-110 ms, and the chats that arrived into one waited
for it in the gateway's queue (queue delay 45-87 ms, against 1-20 ms for the others): they
were the slowest chats of the mixed phase. Same command, `--policies mixgate --repeats 3`,
one after the other (load 0.4-0.9), chat TTFT p99 under the backlog (x alone) and bulk output
tokens per busy second, lifting at once vs a 2 s linger: chunk 128 168 ms (2.57x), 440 vs
133 ms (2.27x), 489; chunk 64 134 ms (2.31x), 505 vs 105 ms (1.45x), 490. So the default
lingers 2 s: with chats arriving a few a second the cap stays on through the gaps between
them, and bulk alone still gets full-budget steps 2 s after the last chat (a chat arriving
after a longer lull waits for one such step).

That one step is the slowest chat of a `chat-over-backlog` mixed phase on the AMD EPYC, on both
engines: the phase begins after a lull, so its first bulk steps run the full 512-token budget
(95-97 ms, an engine-process trace), and the phase's first chat (sent 0.26 s in) waited for one
(`bench breakdown`'s slowest chats: queueing 76-119 ms; TTFT 95-176 ms against a p50 of ~30).
What lifting buys is bulk's decode batch: with prefill capped at 64 tokens a step, admission
keeps ~7 bulk sequences decoding instead of 32. The native engine in-process, 24 bulk requests
of that workload drained alone, paired rounds: never lifting 0.68-0.74x the output tokens/s of
lifting at once; lifting to a 256-token budget instead of 512, 0.92x (0.79-1.06). Clean step
times on that CPU (`small`, 2 threads, medians): a prefill chunk costs 0.11 ms a token at 64 or
512 tokens, 30 decodes over 100-1,500-token contexts 9.2 ms a step, and the two add up.
Clock injected (`now_s`): the simulator runs it in virtual time.
"""

from __future__ import annotations

__all__ = ["DEFAULT_LINGER_S", "InteractivePresence"]

# EngineConfig's default and the vLLM scheduler's when the knob is absent.
DEFAULT_LINGER_S = 2.0


class InteractivePresence:
    def __init__(self, linger_s: float | None) -> None:
        if linger_s is not None and linger_s < 0:
            raise ValueError("linger_s must be non-negative")
        self.linger_s = linger_s
        # When interactive work was last seen, or the current busy stretch began if later.
        self._last_seen_s: float | None = None
        # When the last step ended (`step_ended`); None before the first.
        self._last_step_end_s: float | None = None

    def observe(self, present_now: bool, now_s: float) -> bool:
        """Record this step's presence; whether to treat interactive work as present.

        Call as each step is planned, and `step_ended` as it ends: a step planned `linger_s`
        or more after the last one ended (the engine was idle: steps run only while there is
        work), or the engine's first, starts a busy stretch."""
        idle_before = self._last_step_end_s is None or (
            self.linger_s is not None and now_s - self._last_step_end_s >= self.linger_s
        )
        if present_now or idle_before:
            self._last_seen_s = now_s
        if present_now or self.linger_s is None:
            return True
        assert self._last_seen_s is not None  # set by the first step at the latest
        return now_s - self._last_seen_s < self.linger_s

    def step_ended(self, now_s: float) -> None:
        self._last_step_end_s = now_s
