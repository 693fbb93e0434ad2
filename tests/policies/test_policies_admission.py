"""Admission: length limits, queue bounds and deadline feasibility, with hand-worked numbers.

Reference engine: prefill 1000 tokens/s, decode 100 tokens/s in aggregate, 1 interactive and 2
bulk sequences running, so one more sequence decodes at 100 / (1 + 2 + 1) = 25 tokens/s. Its
bulk chunk and slot bound are off (0) unless a test sets them.
"""

from __future__ import annotations

import dataclasses

import pytest

from policies.admission import (
    AdmissionConfig,
    AdmissionDecision,
    EngineRates,
    LengthLimits,
    QueueState,
    Rejection,
    RequestShape,
    decide_admission,
)
from policies.request_class import RequestClass

INTERACTIVE = RequestClass.INTERACTIVE
BULK = RequestClass.BULK
LIMITS = {
    INTERACTIVE: LengthLimits(
        max_prompt_tokens=4096, max_output_tokens=1024, max_context_tokens=8192
    ),
    BULK: LengthLimits(max_prompt_tokens=8192, max_output_tokens=4096, max_context_tokens=8192),
}
RATES = EngineRates(
    prefill_tokens_per_s=1000.0,
    decode_tokens_per_s=100.0,
    running_interactive_seqs=1,
    running_bulk_seqs=2,
    measured=False,
)
EXACT = AdmissionConfig(
    interactive_ttft_target_s=2.0, bulk_default_deadline_s=3600.0, safety_factor=1.0
)
EMPTY = {INTERACTIVE: QueueState(0, 0, 64), BULK: QueueState(0, 0, 10_000)}


def queues(
    interactive: QueueState | None = None, bulk: QueueState | None = None
) -> dict[RequestClass, QueueState]:
    return {INTERACTIVE: interactive or EMPTY[INTERACTIVE], BULK: bulk or EMPTY[BULK]}


def test_interactive_accept_with_predictions() -> None:
    # Queue ahead: 200 prompt tokens at 1000/s = 0.2 s; its 100 output tokens decode beside this
    # request's prefill, so they do not delay its first token. Own prefill: 500 / 1000 = 0.5 s
    # -> TTFT 0.7 s <= 2 s. Finish: 0.7 + 50 / 25 = 2.7 s.
    ahead = QueueState(depth=2, queued_tokens=300, queue_limit=64, queued_prompt_tokens=200)
    shape = RequestShape(INTERACTIVE, prompt_tokens=500, max_tokens=50)
    decision = decide_admission(shape, LIMITS, queues(interactive=ahead), RATES, EXACT)
    assert decision.accepted
    assert decision.rejection is None
    assert decision.predicted_start_s == pytest.approx(0.2)
    assert decision.predicted_ttft_s == pytest.approx(0.7)
    assert decision.predicted_finish_s == pytest.approx(2.7)
    assert decision.deadline_s == 2.0
    assert decision.rates_measured is False


def test_safety_factor_turns_a_close_call_into_a_reject() -> None:
    # 1200 prompt tokens ahead (1.2 s) + own 0.5 s = 1.7 s; x 1.25 = 2.125 s > 2 s. The start
    # must fall to 2 / 1.25 - 0.5 = 1.1 s, i.e. 0.1 s of draining, x 1.25 -> Retry-After 1.
    ahead = QueueState(depth=2, queued_tokens=1300, queue_limit=64, queued_prompt_tokens=1200)
    shape = RequestShape(INTERACTIVE, prompt_tokens=500, max_tokens=50)
    cfg = dataclasses.replace(EXACT, safety_factor=1.25)
    decision = decide_admission(shape, LIMITS, queues(interactive=ahead), RATES, cfg)
    assert decision.rejection is not None
    assert decision.rejection.code == "deadline_unmeetable"
    assert decision.rejection.retry_after_s == 1
    # The reported predictions stay unscaled.
    assert decision.predicted_ttft_s == pytest.approx(1.7)


def test_interactive_deadline_reject_retry_after_worked_by_hand() -> None:
    # Ahead: 21 200 prompt tokens / 1000 = 21.2 s; TTFT = 21.7 s > 2 s.
    # Start must fall to 2 - 0.5 = 1.5 s: 21.2 - 1.5 = 19.7 s of draining -> Retry-After 20.
    ahead = QueueState(depth=20, queued_tokens=23_200, queue_limit=64, queued_prompt_tokens=21_200)
    shape = RequestShape(INTERACTIVE, prompt_tokens=500, max_tokens=50)
    decision = decide_admission(shape, LIMITS, queues(interactive=ahead), RATES, EXACT)
    rejection = decision.rejection
    assert rejection is not None
    assert (rejection.status_code, rejection.code, rejection.error_type) == (
        429,
        "deadline_unmeetable",
        "rate_limit_error",
    )
    assert rejection.retry_after_s == 20
    assert rejection.param is None
    assert "first token" in rejection.message
    # With a 1.25 safety factor: the start must fall to 1.6 - 0.5 = 1.1 s -> 20.1 s x 1.25
    # = 25.125 s -> 26.
    cfg = dataclasses.replace(EXACT, safety_factor=1.25)
    scaled = decide_admission(shape, LIMITS, queues(interactive=ahead), RATES, cfg).rejection
    assert scaled is not None
    assert scaled.retry_after_s == 26


def test_request_deadline_replaces_the_ttft_target() -> None:
    ahead = QueueState(depth=20, queued_tokens=23_200, queue_limit=64, queued_prompt_tokens=21_200)
    shape = RequestShape(INTERACTIVE, prompt_tokens=500, max_tokens=50, deadline_s=30.0)
    decision = decide_admission(shape, LIMITS, queues(interactive=ahead), RATES, EXACT)
    assert decision.accepted
    assert decision.deadline_s == 30.0


def test_bulk_waits_for_interactive_work_too() -> None:
    # Interactive ahead: 1000 prompt tokens -> 1 s. Bulk ahead: 40 000 prompt (40 s) + 10 000
    # output (100 s) -> 140 s. Start 141 s; own prefill 2000 / 1000 = 2 s; decode 1000 / 25
    # = 40 s; finish 183 s, well inside the default 3600 s.
    interactive = QueueState(1, 1000, 64, queued_prompt_tokens=1000)
    bulk = QueueState(10, 50_000, 10_000, queued_prompt_tokens=40_000)
    shape = RequestShape(BULK, prompt_tokens=2000, max_tokens=1000)
    decision = decide_admission(shape, LIMITS, queues(interactive, bulk), RATES, EXACT)
    assert decision.accepted
    assert decision.predicted_start_s == pytest.approx(141.0)
    assert decision.predicted_ttft_s == pytest.approx(143.0)
    assert decision.predicted_finish_s == pytest.approx(183.0)
    assert decision.deadline_s == 3600.0


def test_bulk_deadline_reject_retry_after_worked_by_hand() -> None:
    # As above with a 150 s deadline: finish 183 s > 150 s. Own work is 42 s, so the start must
    # fall to 150 - 42 = 108 s: 141 - 108 = 33 s -> Retry-After 33.
    interactive = QueueState(1, 1000, 64, queued_prompt_tokens=1000)
    bulk = QueueState(10, 50_000, 10_000, queued_prompt_tokens=40_000)
    shape = RequestShape(BULK, prompt_tokens=2000, max_tokens=1000, deadline_s=150.0)
    rejection = decide_admission(shape, LIMITS, queues(interactive, bulk), RATES, EXACT).rejection
    assert rejection is not None
    assert rejection.code == "deadline_unmeetable"
    assert rejection.retry_after_s == 33
    assert "completion" in rejection.message


def test_interactive_start_ignores_the_bulk_queue() -> None:
    huge_bulk = QueueState(9_999, 10_000_000, 10_000)
    shape = RequestShape(INTERACTIVE, prompt_tokens=100, max_tokens=10)
    decision = decide_admission(shape, LIMITS, queues(bulk=huge_bulk), RATES, EXACT)
    assert decision.accepted
    assert decision.predicted_start_s == 0.0


def test_interactive_counts_one_bulk_chunk_when_bulk_work_exists() -> None:
    # The step in flight may carry a 128-token bulk chunk: 128 / 1000 = 0.128 s, whatever the
    # size of the backlog behind it. TTFT = 0.128 + 100 / 1000 = 0.228 s.
    rates = dataclasses.replace(RATES, bulk_step_tokens=128)
    shape = RequestShape(INTERACTIVE, prompt_tokens=100, max_tokens=10)
    for depth in (1, 48, 9_999):
        backlog = QueueState(depth, depth * 1_000, 10_000, depth * 900)
        decision = decide_admission(shape, LIMITS, queues(bulk=backlog), rates, EXACT)
        assert decision.accepted
        assert decision.predicted_start_s == pytest.approx(0.128)
        assert decision.predicted_ttft_s == pytest.approx(0.228)
    # No bulk queued or running: no chunk to wait for.
    idle = dataclasses.replace(rates, running_bulk_seqs=0)
    decision = decide_admission(shape, LIMITS, EMPTY, idle, EXACT)
    assert decision.predicted_start_s == 0.0


def test_the_issue_backlog_no_longer_refuses_chats() -> None:
    # Rates as a mixed phase measures them (prefill charged whole bulk-chunk steps; the decode
    # rate low because every decode step also carries a bulk chunk), 28 bulk and 6 chats
    # running, 48 bulk jobs queued, one chat (180 prompt + 32 output tokens) admitted just ahead.
    # Counted before: 180 / 400 + 32 / 20 + 200 / 400 = 2.55 s -> refused at the 2 s target.
    # Counted now: (128 (one chunk) + 180 + 200) / 400 = 1.27 s; x 1.25 = 1.59 s: admitted.
    rates = EngineRates(400.0, 20.0, 6, 28, measured=True, bulk_step_tokens=128)
    chat_ahead = QueueState(1, 212, 64, queued_prompt_tokens=180)
    backlog = QueueState(48, 48 * 1_300, 10_000, queued_prompt_tokens=48 * 1_172)
    shape = RequestShape(INTERACTIVE, prompt_tokens=200, max_tokens=32)
    decision = decide_admission(
        shape, LIMITS, queues(chat_ahead, backlog), rates, AdmissionConfig()
    )
    assert decision.accepted
    assert decision.predicted_ttft_s == pytest.approx((128 + 180 + 200) / 400)


def test_interactive_waits_for_a_slot_only_when_interactive_fills_them() -> None:
    # 4 interactive slots, 3 chats running, 1 queued (100 prompt + 400 output tokens): every
    # slot is taken, so the 400 output tokens ahead drain 4 at a time, one per 0.05 s step:
    # 400 / 4 x 0.05 = 5 s, plus 100 / 1000 of prefill ahead = 5.1 s -> refused at 2 s.
    rates = dataclasses.replace(
        RATES, running_interactive_seqs=3, interactive_slots=4, recent_step_s=0.05
    )
    ahead = QueueState(1, 500, 64, queued_prompt_tokens=100)
    shape = RequestShape(INTERACTIVE, prompt_tokens=100, max_tokens=10)
    decision = decide_admission(shape, LIMITS, queues(interactive=ahead), rates, EXACT)
    assert decision.predicted_start_s == pytest.approx(5.1)
    assert decision.rejection is not None
    assert decision.rejection.code == "deadline_unmeetable"
    # A free slot: only the prefill ahead counts.
    free = dataclasses.replace(rates, running_interactive_seqs=2)
    decision = decide_admission(shape, LIMITS, queues(interactive=ahead), free, EXACT)
    assert decision.accepted
    assert decision.predicted_start_s == pytest.approx(0.1)


def test_interactive_counts_prompts_waiting_in_the_engine() -> None:
    # 300 prompt tokens claimed into the engine but not yet scheduled: 0.3 s ahead.
    rates = dataclasses.replace(RATES, waiting_interactive_prompt_tokens=300)
    shape = RequestShape(INTERACTIVE, prompt_tokens=100, max_tokens=10)
    decision = decide_admission(shape, LIMITS, EMPTY, rates, EXACT)
    assert decision.predicted_start_s == pytest.approx(0.3)
    assert decision.predicted_ttft_s == pytest.approx(0.4)


def test_interactive_queue_output_tokens_do_not_delay_the_first_token() -> None:
    # 2000 output tokens queued ahead, no slot bound: they decode beside this prefill.
    ahead = QueueState(depth=2, queued_tokens=2100, queue_limit=64, queued_prompt_tokens=100)
    shape = RequestShape(INTERACTIVE, prompt_tokens=100, max_tokens=10)
    decision = decide_admission(shape, LIMITS, queues(interactive=ahead), RATES, EXACT)
    assert decision.predicted_start_s == pytest.approx(0.1)


def test_deadline_missed_on_an_idle_queue_still_says_retry_in_one_second() -> None:
    # 4000 tokens at 25 tokens/s = 160 s of decoding alone > a 100 s deadline: no queue to
    # wait for, only a lighter running load could help.
    shape = RequestShape(BULK, prompt_tokens=100, max_tokens=4000, deadline_s=100.0)
    rejection = decide_admission(shape, LIMITS, EMPTY, RATES, EXACT).rejection
    assert rejection is not None
    assert rejection.code == "deadline_unmeetable"
    assert rejection.retry_after_s == 1


def test_queue_full_retry_after_worked_by_hand() -> None:
    # 66 pending, limit 64: 3 must leave. 6600 output tokens drain in 66 s; 3/66 of that is 3 s.
    full = QueueState(depth=66, queued_tokens=6600, queue_limit=64)
    shape = RequestShape(INTERACTIVE, prompt_tokens=10, max_tokens=10)
    rejection = decide_admission(shape, LIMITS, queues(interactive=full), RATES, EXACT).rejection
    assert rejection is not None
    assert (rejection.status_code, rejection.code) == (429, "queue_full")
    assert rejection.retry_after_s == 3
    assert "66 of 64" in rejection.message


def test_bulk_queue_full_counts_interactive_work_ahead() -> None:
    # Interactive ahead 100 output tokens (1 s) + 1/10 000 of 1 000 000 output tokens (1 s).
    interactive = QueueState(1, 100, 64)
    full = QueueState(depth=10_000, queued_tokens=1_000_000, queue_limit=10_000)
    shape = RequestShape(BULK, prompt_tokens=10, max_tokens=10)
    rejection = decide_admission(shape, LIMITS, queues(interactive, full), RATES, EXACT).rejection
    assert rejection is not None
    assert rejection.code == "queue_full"
    assert rejection.retry_after_s == 2


@pytest.mark.parametrize(
    ("request_class", "prompt_tokens", "max_tokens", "status_code", "code", "param"),
    [
        (INTERACTIVE, 4097, 10, 413, "prompt_too_long", "messages"),
        (INTERACTIVE, 10, 1025, 400, "max_tokens_too_large", "max_tokens"),
        (BULK, 8000, 1000, 413, "context_length_exceeded", "messages"),
        (BULK, 8193, 1, 413, "prompt_too_long", "messages"),
    ],
)
def test_length_limits(
    request_class: RequestClass,
    prompt_tokens: int,
    max_tokens: int,
    status_code: int,
    code: str,
    param: str,
) -> None:
    # Lengths are checked before the (full) queue: retrying a too-long request cannot help.
    full = {c: QueueState(100_000, 0, 1) for c in RequestClass}
    shape = RequestShape(request_class, prompt_tokens, max_tokens)
    rejection = decide_admission(shape, LIMITS, full, RATES, EXACT).rejection
    assert rejection is not None
    assert (rejection.status_code, rejection.code, rejection.param) == (status_code, code, param)
    assert rejection.error_type == "invalid_request_error"
    assert rejection.retry_after_s is None


def test_exactly_at_the_limits_is_accepted() -> None:
    fast = dataclasses.replace(RATES, prefill_tokens_per_s=1e9, decode_tokens_per_s=1e9)
    for shape in (
        RequestShape(INTERACTIVE, 4096, 1024),
        RequestShape(BULK, 4096, 4096),  # prompt + output == max_context_tokens
    ):
        assert decide_admission(shape, LIMITS, EMPTY, fast, EXACT).accepted


def test_rates_flag_and_per_sequence_rate() -> None:
    assert RATES.per_sequence_decode_tokens_per_s == 25.0
    measured = dataclasses.replace(RATES, measured=True)
    shape = RequestShape(INTERACTIVE, prompt_tokens=10, max_tokens=10)
    assert decide_admission(shape, LIMITS, EMPTY, measured, EXACT).rates_measured is True


def test_missing_entries_are_a_caller_bug() -> None:
    bulk = RequestShape(BULK, prompt_tokens=10, max_tokens=10)
    interactive = RequestShape(INTERACTIVE, prompt_tokens=10, max_tokens=10)
    # Bulk waits for interactive work, so an absent interactive queue must not read as empty.
    with pytest.raises(ValueError, match="interactive"):
        decide_admission(bulk, LIMITS, {BULK: EMPTY[BULK]}, RATES, EXACT)
    with pytest.raises(ValueError, match="bulk"):
        decide_admission(interactive, LIMITS, {INTERACTIVE: EMPTY[INTERACTIVE]}, RATES, EXACT)
    with pytest.raises(ValueError, match=r"limits\[bulk\]"):
        decide_admission(bulk, {INTERACTIVE: LIMITS[INTERACTIVE]}, EMPTY, RATES, EXACT)


@pytest.mark.parametrize(
    "build",
    [
        lambda: RequestShape(INTERACTIVE, 0, 10),
        lambda: RequestShape(INTERACTIVE, 10, 0),
        lambda: RequestShape(INTERACTIVE, 10, 10, deadline_s=0.0),
        lambda: RequestShape(INTERACTIVE, 10, 10, deadline_s=float("nan")),
        lambda: LengthLimits(0, 1, 1),
        lambda: LengthLimits(10, 1, 5),
        lambda: LengthLimits(1, 10, 5),
        lambda: QueueState(-1, 0, 1),
        lambda: QueueState(0, 0, 0),
        lambda: QueueState(1, 10, 5, queued_prompt_tokens=11),
        lambda: EngineRates(0.0, 1.0, 0, 0, measured=True),
        lambda: EngineRates(1.0, float("inf"), 0, 0, measured=True),
        lambda: EngineRates(1.0, 1.0, -1, 0, measured=True),
        lambda: EngineRates(1.0, 1.0, 0, 0, measured=True, bulk_step_tokens=-1),
        lambda: EngineRates(1.0, 1.0, 0, 0, measured=True, interactive_slots=-1),
        lambda: EngineRates(1.0, 1.0, 0, 0, measured=True, waiting_interactive_prompt_tokens=-1),
        lambda: EngineRates(1.0, 1.0, 0, 0, measured=True, recent_step_s=0.0),
        lambda: AdmissionConfig(safety_factor=0.9),
        lambda: AdmissionConfig(interactive_ttft_target_s=0.0),
        lambda: Rejection(429, "rate_limit_error", "queue_full", "full", None, None),
        lambda: Rejection(413, "invalid_request_error", "queue_full", "x", None, 1),
        lambda: Rejection(413, "invalid_request_error", "prompt_too_long", "x", "messages", 5),
        lambda: AdmissionDecision(INTERACTIVE, 2.0, 1.0, 3.0, 2.0, False),
        lambda: AdmissionDecision(INTERACTIVE, 0.0, 1.0, 3.0, 0.0, False),
    ],
)
def test_nonsense_values_raise(build: object) -> None:
    assert callable(build)
    with pytest.raises(ValueError):
        build()
