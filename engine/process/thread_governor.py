"""How many threads the engine core's next step runs on: fewer while other work holds its cores.

Every parallel op of a step (torch's and the C kernels') ends at a barrier, so a step on N
threads runs at the pace of the thread that waits longest for a core. When the gateway, the
tokenizers or a client on the same machine take one of the cores the engine spans, each op
waits for the preempted thread, many times a step. Measured on the 2-vCPU Xeon (`small`, one
busy-looping process beside the engine, /tmp probe): 2-thread steps went from 1.06 to 7.73 ms
(B=8 decode) and from 8.0 to 32.4 ms (a 128-token prefill chunk beside 8 decodes), while
1-thread steps stayed at 1.50 and 11.6 ms. In a `mixed` run the 400-job intake's first second
showed the same: B=1 decode steps of 6.4 ms (0.7 ms quiet), 128-token bulk chunks of 30-94 ms
(~12 ms quiet), and the chats that arrived then waited behind them.

The signal is the engine's own: CPU time the process got over a step divided by threads x the
step's wall time. A step whose threads all had a core spends ~0.9-1.0 of it (spinning at the
barriers counts); the contended steps above measured 0.50. Below `contended_ratio` over a
window of steps the governor drops one thread; a step on fewer threads cannot show whether the
cores came back (its ratio is ~1.0 either way), so after a while it tries one more thread for a
window, keeps it if that window is not contended, and otherwise waits twice as long before the
next try. The threshold is where one thread fewer starts to win. Measured in a served engine
under `bulk-only` (400 jobs polled 4 times a second each, the load generator on the same 2
vCPUs), 2-thread bulk prefill steps by their ratio: 14.9k tokens/s at >= 0.9, 11.6k at 0.7-0.8,
9.7k at 0.6-0.7, 8.6k at 0.5-0.6, 6.9k at 0.4-0.5, 5.3k below; 1-thread steps in the same run
made 8.8k. A first threshold of 0.65 dropped to one thread in windows where two still won
(bulk -10% in `bench compare`).

Pure logic: the caller measures CPU and wall time and applies the thread count.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ThreadGovernor", "ThreadGovernorSettings"]


@dataclass(frozen=True, slots=True)
class ThreadGovernorSettings:
    # A window's CPU / (threads x wall) below this: the threads were waiting for cores.
    contended_ratio: float = 0.5
    # Wall time of steps judged together (one step of a few ms is too noisy to act on).
    window_s: float = 0.02
    # How long after a drop it first tries one more thread; doubled after each failed try.
    first_retry_s: float = 0.25
    max_retry_s: float = 4.0
    # Steps with fewer scheduled tokens are not judged: a step of a few decodes is mostly the
    # main thread's Python (the others wait), so its share reads low on idle cores too
    # (0.4-0.6 for B=1 decodes of `small` with chats alone).
    min_judged_tokens: int = 64

    def __post_init__(self) -> None:
        if not 0.0 < self.contended_ratio < 1.0:
            raise ValueError(f"contended_ratio must be in (0, 1), got {self.contended_ratio}")
        if self.window_s <= 0 or self.first_retry_s <= 0:
            raise ValueError("window_s and first_retry_s must be positive")
        if self.max_retry_s < self.first_retry_s:
            raise ValueError("max_retry_s must be >= first_retry_s")
        if self.min_judged_tokens < 0:
            raise ValueError("min_judged_tokens must be >= 0")


class ThreadGovernor:
    """Threads for the next step, from the CPU share the last steps got.

    `threads` is what the next step should run on; after it,
    `record(now_s, cpu_s, wall_s, tokens)`.
    """

    def __init__(self, max_threads: int, settings: ThreadGovernorSettings | None = None) -> None:
        if max_threads < 1:
            raise ValueError(f"max_threads must be >= 1, got {max_threads}")
        self.max_threads = max_threads
        self.settings = settings or ThreadGovernorSettings()
        self.threads = max_threads
        self._cpu_s = 0.0
        self._wall_s = 0.0
        self._retry_s = self.settings.first_retry_s
        # When to try one more thread (None: at max_threads, nothing to try).
        self._retry_at_s: float | None = None
        # Whether the current window runs on a thread count being tried.
        self._trying = False
        # Drops and tries so far (for the engine's log and tests).
        self.drops = 0
        self.tries = 0

    def record(self, now_s: float, cpu_s: float, wall_s: float, tokens: int) -> None:
        """One step of `tokens` scheduled tokens ran on `self.threads` threads: `cpu_s` of
        process CPU in `wall_s`."""
        if wall_s <= 0 or tokens < self.settings.min_judged_tokens:
            return
        self._cpu_s += cpu_s
        self._wall_s += wall_s
        if self._wall_s >= self.settings.window_s:
            contended = self._cpu_s / (self.threads * self._wall_s) < self.settings.contended_ratio
            self._cpu_s = self._wall_s = 0.0
            self._judge(now_s, contended)
        elif self._retry_at_s is not None and not self._trying and now_s >= self._retry_at_s:
            self._try_one_more()

    def _judge(self, now_s: float, contended: bool) -> None:
        s = self.settings
        if contended and self.threads > 1:
            if self._trying:
                self._retry_s = min(2 * self._retry_s, s.max_retry_s)
            else:
                self.drops += 1
            self.threads -= 1
            self._trying = False
            self._retry_at_s = now_s + self._retry_s
            return
        if self._trying:
            # The tried count held up: keep it, and try the next one up after the first wait.
            self._trying = False
            self._retry_s = s.first_retry_s
            self._retry_at_s = None if self.threads == self.max_threads else now_s + self._retry_s
            return
        if self._retry_at_s is not None and now_s >= self._retry_at_s:
            self._try_one_more()

    def _try_one_more(self) -> None:
        self.threads += 1
        self.tries += 1
        self._trying = True
        self._cpu_s = self._wall_s = 0.0
