"""The step-cost model of draining queued work, and admission's bulk prediction by it, worked
by hand.

Reference steps: 7 ms fixed + 0.1 ms per token (about what vLLM's CPU backend measures with
`small`).
"""

from __future__ import annotations

import dataclasses

import pytest

from policies.admission import (
    AdmissionConfig,
    EngineRates,
    LengthLimits,
    QueueState,
    RequestShape,
    decide_admission,
)
from policies.request_class import RequestClass
from policies.step_cost import StepCost

COST = StepCost(fixed_s=0.007, token_s=0.0001)
INTERACTIVE = RequestClass.INTERACTIVE
BULK = RequestClass.BULK
LIMITS = dict.fromkeys(
    RequestClass,
    LengthLimits(max_prompt_tokens=8192, max_output_tokens=4096, max_context_tokens=8192),
)
EXACT = AdmissionConfig(
    interactive_ttft_target_s=2.0, bulk_default_deadline_s=3600.0, safety_factor=1.0
)
# Measured after a chat-only stretch: a few sequences a step, so decode looks slow.
CHAT_ERA_RATES = EngineRates(
    prefill_tokens_per_s=5000.0,
    decode_tokens_per_s=150.0,
    running_interactive_seqs=0,
    running_bulk_seqs=0,
    measured=True,
    bulk_step_tokens=128,
    interactive_slots=40,
)
WITH_FIT = dataclasses.replace(CHAT_ERA_RATES, step_cost=COST, step_token_budget=512, bulk_slots=32)


def test_prefill_bound_work_pays_the_fixed_part_once_per_chunk() -> None:
    # 400 jobs of 1,280 prompt and 128 output tokens at 128 prefill tokens and 32 sequences a
    # step: 4,000 steps for the prompts, 1,600 for the outputs, so 4,000 steps of 7 ms = 28 s,
    # + 563,200 tokens x 0.1 ms = 56.32 s: 84.32 s.
    drain_s = COST.drain_s(512_000, 51_200, prefill_tokens_per_step=128, seqs_per_step=32)
    assert drain_s == pytest.approx(84.32)


def test_decode_bound_work_takes_as_many_steps_as_its_outputs_need() -> None:
    # 64 jobs of 16 prompt and 512 output tokens: 8 steps of prefill, 1,024 steps of decode at
    # 32 a step: 1,024 x 7 ms + 33,792 tokens x 0.1 ms = 10.5472 s.
    drain_s = COST.drain_s(1_024, 32_768, prefill_tokens_per_step=128, seqs_per_step=32)
    assert drain_s == pytest.approx(7.168 + 3.3792)


def test_a_bulk_backlog_is_predicted_by_the_step_fit_not_the_per_kind_rates() -> None:
    # The same 400-job backlog queued ahead. Per-kind rates: 512,000 / 5,000 = 102.4 s of
    # prefill then 51,200 / 150 = 341.3 s of decode. By the fit: 84.32 s (above).
    backlog = QueueState(400, 563_200, 10_000, queued_prompt_tokens=512_000)
    queues = {INTERACTIVE: QueueState(0, 0, 64), BULK: backlog}
    shape = RequestShape(BULK, prompt_tokens=1280, max_tokens=128)
    by_rates = decide_admission(shape, LIMITS, queues, CHAT_ERA_RATES, EXACT)
    by_fit = decide_admission(shape, LIMITS, queues, WITH_FIT, EXACT)
    assert by_rates.predicted_start_s == pytest.approx(102.4 + 51_200 / 150)
    assert by_fit.predicted_start_s == pytest.approx(84.32)
    # A 5-minute deadline: refused by the per-kind rates (start alone 443.7 s), kept by the fit.
    tight = dataclasses.replace(shape, deadline_s=300.0)
    refused = decide_admission(tight, LIMITS, queues, CHAT_ERA_RATES, EXACT).rejection
    assert refused is not None and refused.code == "deadline_unmeetable"
    assert decide_admission(tight, LIMITS, queues, WITH_FIT, EXACT).accepted


def test_interactive_work_ahead_of_bulk_drains_at_the_step_budget() -> None:
    # 2 chats queued: 600 prompt tokens at 512 a step (1.17 steps), 64 outputs over 40 slots
    # (1.6 steps, the slower side): 1.6 x 7 ms + 664 tokens x 0.1 ms = 77.6 ms ahead of an
    # empty bulk queue (steps counted fractionally: a backlog's average).
    interactive = QueueState(2, 664, 64, queued_prompt_tokens=600)
    queues = {INTERACTIVE: interactive, BULK: QueueState(0, 0, 10_000)}
    shape = RequestShape(BULK, prompt_tokens=100, max_tokens=10)
    decision = decide_admission(shape, LIMITS, queues, WITH_FIT, EXACT)
    assert decision.predicted_start_s == pytest.approx(0.0112 + 0.0664)


def test_without_a_fit_or_a_per_step_limit_the_per_kind_rates_stay() -> None:
    backlog = QueueState(10, 50_000, 10_000, queued_prompt_tokens=40_000)
    per_kind = 40_000 / 5000.0 + 10_000 / 150.0
    assert CHAT_ERA_RATES.drain_s(backlog, BULK) == pytest.approx(per_kind)
    no_slots = dataclasses.replace(WITH_FIT, bulk_slots=0)
    assert no_slots.drain_s(backlog, BULK) == pytest.approx(per_kind)


@pytest.mark.parametrize(
    "build",
    [
        lambda: StepCost(-0.001, 0.0),
        lambda: StepCost(0.0, float("nan")),
        lambda: StepCost(0.0, 0.0),
        lambda: COST.drain_s(1, 1, prefill_tokens_per_step=0, seqs_per_step=1),
        lambda: dataclasses.replace(WITH_FIT, bulk_slots=-1),
    ],
)
def test_nonsense_values_raise(build: object) -> None:
    with pytest.raises(ValueError):
        build()  # type: ignore[operator]


def test_a_bulk_jobs_own_decode_takes_one_recent_step_per_token() -> None:
    # Empty queues, 20 ms steps: 1,280 prompt tokens at 5,000/s = 0.256 s, then 128 tokens at
    # one a step = 2.56 s. By the shared decode rate (150 / 1 running) it was 128 / 150 s.
    measured = dataclasses.replace(WITH_FIT, recent_step_s=0.02)
    queues = {INTERACTIVE: QueueState(0, 0, 64), BULK: QueueState(0, 0, 10_000)}
    shape = RequestShape(BULK, prompt_tokens=1280, max_tokens=128)
    decision = decide_admission(shape, LIMITS, queues, measured, EXACT)
    assert decision.predicted_finish_s == pytest.approx(0.256 + 2.56)
    unmeasured = decide_admission(shape, LIMITS, queues, WITH_FIT, EXACT)
    assert unmeasured.predicted_finish_s == pytest.approx(0.256 + 128 / 150)
