"""`StepThreads`: the native engine core's thread governor, applied to vLLM's engine core.

vLLM's CPU worker binds its OpenMP threads to cores 0..n-1 and runs every step on all of them
(`VLLM_CPU_OMP_THREADS_BIND`). When the gateway's intake, its tokenizers or a client on the same
machine take one of those cores, every parallel op of a step waits at its barrier for the
preempted thread (engine/process/thread_governor.py has the native engine's numbers). The
class-aware scheduler runs in vLLM's engine-core process, on the thread that runs the forward
(vLLM's CPU platform turns async scheduling off: schedule, execute and update follow one another
on one thread), so it can time each step and set the thread count the next forward uses, as the
native engine core does around its own steps.

The caller says when a step starts and ends; the CPU and wall clocks and the thread setter are
injected, so the logic is tested without vLLM.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.process.thread_governor import ThreadGovernor, ThreadGovernorSettings

__all__ = ["StepThreads"]


class StepThreads:
    """Times each step (process CPU and wall) and sets the threads of the next one."""

    def __init__(
        self,
        max_threads: int,
        set_threads: Callable[[int], None],
        settings: ThreadGovernorSettings | None = None,
        wall_clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] = time.process_time,
    ) -> None:
        self.governor = ThreadGovernor(max_threads, settings)
        self._set_threads = set_threads
        self._wall_clock = wall_clock
        self._cpu_clock = cpu_clock
        self._applied = max_threads
        # (wall, cpu) at the start of the step in progress; None between steps.
        self._started: tuple[float, float] | None = None

    @property
    def threads(self) -> int:
        """Threads the next step runs on."""
        return self._applied

    def step_started(self) -> None:
        self._started = (self._wall_clock(), self._cpu_clock())

    def step_ended(self, scheduled_tokens: int) -> None:
        """The step begun at `step_started` ran `scheduled_tokens`: judge it, and set the next
        step's threads if the governor moved them."""
        if self._started is None:
            return
        wall_start_s, cpu_start_s = self._started
        self._started = None
        now_s = self._wall_clock()
        cpu_s = self._cpu_clock() - cpu_start_s
        self.governor.record(now_s, cpu_s, now_s - wall_start_s, scheduled_tokens)
        if self.governor.threads != self._applied:
            self._set_threads(self.governor.threads)
            self._applied = self.governor.threads
