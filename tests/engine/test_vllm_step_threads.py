"""`StepThreads`: the vLLM worker's forwards timed and their thread count set, with injected
clocks and setter (no vLLM needed)."""

from __future__ import annotations

from engine.backends.vllm.step_threads import StepThreads
from engine.process.thread_governor import ThreadGovernorSettings

SETTINGS = ThreadGovernorSettings(
    contended_ratio=0.5, window_s=0.02, first_retry_s=0.25, max_retry_s=4.0, min_judged_tokens=64
)


class Clocks:
    def __init__(self) -> None:
        self.wall_s = 100.0
        self.cpu_s = 0.0

    def wall(self) -> float:
        return self.wall_s

    def cpu(self) -> float:
        return self.cpu_s


def _threads(clocks: Clocks, applied: list[int]) -> StepThreads:
    return StepThreads(2, applied.append, SETTINGS, wall_clock=clocks.wall, cpu_clock=clocks.cpu)


def _step(threads: StepThreads, clocks: Clocks, wall_s: float, cpu_s: float, tokens: int) -> None:
    threads.step_started()
    clocks.wall_s += wall_s
    clocks.cpu_s += cpu_s
    threads.step_ended(tokens)


def test_contended_forwards_drop_a_thread_and_a_clear_window_later_brings_it_back() -> None:
    clocks, applied = Clocks(), []
    threads = _threads(clocks, applied)
    # Threads that had their cores: 2 x 25 ms of CPU in a 25 ms forward. Nothing changes.
    _step(threads, clocks, 0.025, 0.050, 128)
    assert (threads.threads, applied) == (2, [])
    # Contended: 2 threads got 20 ms of CPU in a 25 ms forward (0.4 of their share).
    _step(threads, clocks, 0.025, 0.020, 128)
    assert (threads.threads, applied) == (1, [1])
    # On one thread the share reads full either way; after the first retry wait the governor
    # tries two again, and keeps them when that window is clear.
    clocks.wall_s += SETTINGS.first_retry_s
    _step(threads, clocks, 0.025, 0.025, 128)
    assert (threads.threads, applied) == (2, [1, 2])
    _step(threads, clocks, 0.025, 0.050, 128)
    assert (threads.threads, applied) == (2, [1, 2])


def test_small_forwards_and_an_unmatched_end_are_not_judged() -> None:
    clocks, applied = Clocks(), []
    threads = _threads(clocks, applied)
    # A few decodes: mostly one thread's Python, its share low on idle cores too.
    for _ in range(10):
        _step(threads, clocks, 0.025, 0.010, 8)
    # The CPU that passes between forwards (the worker waiting for its next step) is not a
    # step's: an end without a start is ignored.
    clocks.wall_s += 1.0
    threads.step_ended(512)
    assert (threads.threads, applied) == (2, [])
