"""The engine core's thread governor: CPU share and wall time are handed in, so every verdict
here is about the rule, not about how busy this machine is."""

from __future__ import annotations

import pytest

from engine.process.thread_governor import ThreadGovernor, ThreadGovernorSettings

SETTINGS = ThreadGovernorSettings(
    contended_ratio=0.5, window_s=0.02, first_retry_s=0.25, max_retry_s=1.0
)
STEP_S = 0.005  # four steps make a window
STEP_TOKENS = 128  # enough work to be judged


class Steps:
    """Feeds steps of STEP_S at a given CPU share into a governor, on a clock it advances."""

    def __init__(self, governor: ThreadGovernor) -> None:
        self.governor = governor
        self.now_s = 0.0
        self.threads_seen: list[int] = []

    def run(self, count: int, share: float, tokens: int = STEP_TOKENS) -> None:
        """`count` steps of `tokens`, each getting `share` of threads x wall as CPU."""
        for _ in range(count):
            threads = self.governor.threads
            self.threads_seen.append(threads)
            self.now_s += STEP_S
            self.governor.record(self.now_s, share * threads * STEP_S, STEP_S, tokens)

    def idle(self, seconds: float) -> None:
        self.now_s += seconds


def test_quiet_steps_keep_every_thread() -> None:
    steps = Steps(ThreadGovernor(2, SETTINGS))
    steps.run(400, share=0.9)
    assert set(steps.threads_seen) == {2}
    assert steps.governor.drops == 0


def test_a_contended_window_drops_one_thread_and_no_sooner() -> None:
    steps = Steps(ThreadGovernor(4, SETTINGS))
    steps.run(3, share=0.4)  # 15 ms: not a whole window yet
    assert steps.governor.threads == 4
    steps.run(1, share=0.4)
    assert steps.governor.threads == 3
    assert steps.governor.drops == 1


def test_one_contended_step_in_a_quiet_window_is_not_enough() -> None:
    steps = Steps(ThreadGovernor(2, SETTINGS))
    # 0.3, 0.9, 0.9, 0.9 over equal walls: 0.75 for the window, above 0.5.
    steps.run(1, share=0.3)
    steps.run(3, share=0.9)
    assert steps.governor.threads == 2


def test_after_a_drop_it_tries_one_more_thread_and_keeps_it_when_the_cores_are_back() -> None:
    steps = Steps(ThreadGovernor(2, SETTINGS))
    steps.run(4, share=0.4)
    assert steps.governor.threads == 1
    steps.run(40, share=1.0)  # 0.2 s at one thread: before the first retry
    assert steps.governor.threads == 1
    steps.run(10, share=1.0)  # past 0.25 s: the try starts
    assert steps.governor.threads == 2 and steps.governor.tries == 1
    steps.run(8, share=0.9)  # the tried window is quiet: kept
    steps.run(200, share=0.9)
    assert steps.governor.threads == 2
    assert steps.governor.tries == 1


def test_a_failed_try_goes_back_down_and_waits_twice_as_long_up_to_the_cap() -> None:
    steps = Steps(ThreadGovernor(2, SETTINGS))
    steps.run(4, share=0.4)
    retry_waits = []
    for _ in range(4):
        dropped_at = steps.now_s
        while steps.governor.threads == 1:
            steps.run(1, share=1.0)
        retry_waits.append(steps.now_s - dropped_at)
        steps.run(4, share=0.4)  # the tried window is contended too
        assert steps.governor.threads == 1
    # 0.25, 0.5, 1.0, then the 1.0 cap (each to within a step).
    assert retry_waits == pytest.approx([0.25, 0.5, 1.0, 1.0], abs=STEP_S + 1e-9)
    assert steps.governor.drops == 1 and steps.governor.tries == 4


def test_a_kept_try_resets_the_wait() -> None:
    steps = Steps(ThreadGovernor(2, SETTINGS))
    steps.run(4, share=0.4)
    for share in (0.4, 0.4):  # two failed tries: the wait is 1.0 s now
        while steps.governor.threads == 1:
            steps.run(1, share=1.0)
        steps.run(4, share=share)
    while steps.governor.threads == 1:
        steps.run(1, share=1.0)
    steps.run(4, share=0.9)  # kept
    steps.run(4, share=0.4)  # contended again: dropped, and the next try comes after 0.25 s
    dropped_at = steps.now_s
    while steps.governor.threads == 1:
        steps.run(1, share=1.0)
    assert steps.now_s - dropped_at == pytest.approx(0.25, abs=STEP_S + 1e-9)


def test_it_climbs_back_one_thread_per_kept_try() -> None:
    steps = Steps(ThreadGovernor(3, SETTINGS))
    steps.run(4, share=0.4)
    steps.run(4, share=0.4)
    assert steps.governor.threads == 1
    while steps.governor.threads < 3:
        steps.run(1, share=0.95)
    assert steps.governor.tries == 2


def test_steps_of_few_tokens_are_not_judged() -> None:
    # A few decodes are mostly the main thread's Python: a low share there says nothing.
    steps = Steps(ThreadGovernor(2, SETTINGS))
    steps.run(100, share=0.4, tokens=SETTINGS.min_judged_tokens - 1)
    assert steps.governor.threads == 2 and steps.governor.drops == 0
    steps.run(4, share=0.4, tokens=SETTINGS.min_judged_tokens)
    assert steps.governor.threads == 1


def test_a_single_thread_engine_never_changes() -> None:
    steps = Steps(ThreadGovernor(1, SETTINGS))
    steps.run(100, share=0.2)
    assert set(steps.threads_seen) == {1}


def test_an_idle_gap_does_not_count_as_a_step() -> None:
    # Waiting for work is not contention: only stepping time is judged.
    steps = Steps(ThreadGovernor(2, SETTINGS))
    steps.run(2, share=0.9)
    steps.idle(5.0)
    steps.run(2, share=0.9)
    assert steps.governor.threads == 2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"contended_ratio": 0.0},
        {"contended_ratio": 1.0},
        {"window_s": 0.0},
        {"first_retry_s": 0.0},
        {"first_retry_s": 2.0, "max_retry_s": 1.0},
        {"min_judged_tokens": -1},
    ],
)
def test_settings_out_of_range_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ThreadGovernorSettings(**kwargs)


def test_no_threads_is_refused() -> None:
    with pytest.raises(ValueError):
        ThreadGovernor(0)
