"""When a bulk job admitted now starts: behind the queue and this replica's bulk jobs in flight,
at the bulk prefill pace the engine measured, worked by hand.

Reference steps as in test_step_cost.py: 7 ms fixed + 0.1 ms per token; 128 bulk prefill tokens
and 32 bulk sequences a step.
"""

from __future__ import annotations

import dataclasses

import pytest

from policies.admission import QueueState, RequestShape, decide_admission
from policies.bulk_prefill_pace import BulkPrefillPace
from policies.in_flight_work import InFlightWork
from policies.request_class import RequestClass
from tests.policies.test_step_cost import EXACT, LIMITS, WITH_FIT

BULK = RequestClass.BULK
# The reference rates and limits of test_step_cost.py (a step fit, 32 bulk slots).
RATES = WITH_FIT
EMPTY = QueueState(0, 0, 10_000)


def test_prompts_in_flight_are_prefilled_before_a_new_job_starts() -> None:
    # 8 jobs claimed here, none started: 8,000 prompt tokens = 62.5 steps (0.4375 s), their
    # 800 outputs ride along (room for 2,000 in those steps): 8,800 tokens x 0.1 ms = 0.88 s.
    # 8 jobs hold 8 of 32 slots, so no output bounds the start.
    flight = dataclasses.replace(RATES, bulk_in_flight=InFlightWork(8, 8_000, 800))
    assert flight.bulk_start_s(EMPTY) == pytest.approx(0.4375 + 0.88)
    assert RATES.bulk_start_s(EMPTY) == 0.0
    # decide_admission's bulk start is this one (no interactive queue ahead).
    queues = {RequestClass.INTERACTIVE: EMPTY, BULK: EMPTY}
    shape = RequestShape(BULK, prompt_tokens=1000, max_tokens=100)
    decision = decide_admission(shape, LIMITS, queues, flight, EXACT)
    assert decision.predicted_start_s == pytest.approx(1.3175)


def test_with_every_slot_held_a_new_job_waits_for_outputs_that_free_one() -> None:
    # 32 jobs decoding here (100 tokens left each) and 4 queued of 100 + 100 tokens: 36 jobs
    # ahead, of which the last 31 may still run beside the new one, so 5 jobs' share of the
    # 3,600 outputs (500) must be made first: 15.625 steps at 32 a step, against 3.125 for the
    # 400 prompt tokens. 15.625 x 7 ms + 900 tokens x 0.1 ms = 0.199375 s; the steps are full
    # with those 500 decodes, so the other outputs add nothing.
    queue = QueueState(4, 800, 10_000, queued_prompt_tokens=400)
    full = dataclasses.replace(RATES, bulk_in_flight=InFlightWork(32, 0, 3_200))
    assert full.bulk_start_s(queue) == pytest.approx(0.109375 + 0.09)
    # The same queue with no slot held waits only for its prompts: 3.125 steps, its 400
    # outputs fill what room those steps have (100).
    assert RATES.bulk_start_s(queue) == pytest.approx(0.021875 + 0.05)


def test_the_measured_bulk_prefill_pace_replaces_the_fit_and_the_envelopes_chunk() -> None:
    # 10 queued jobs of 1,000 + 100 tokens. By the fit at the envelope's 128 a step: 78.125
    # steps (0.546875 s) + 11,000 tokens (1.1 s). The engine measured 400 bulk prompt tokens a
    # step in steps of 30 ms while bulk had prompts (no chat holds the cap down): 25 steps,
    # 0.75 s. Its own 1,000-token prompt then takes 2.5 such steps (the per-kind prefill rate
    # said 0.2 s).
    queue = QueueState(10, 11_000, 10_000, queued_prompt_tokens=10_000)
    assert RATES.bulk_start_s(queue) == pytest.approx(0.546875 + 1.1)
    measured = dataclasses.replace(RATES, bulk_prefill=BulkPrefillPace(400.0, 0.030))
    assert measured.bulk_start_s(queue) == pytest.approx(0.75)
    queues = {RequestClass.INTERACTIVE: EMPTY, BULK: queue}
    shape = RequestShape(BULK, prompt_tokens=1000, max_tokens=100)
    decision = decide_admission(shape, LIMITS, queues, measured, EXACT)
    assert decision.predicted_ttft_s == pytest.approx(0.75 + 0.075)
    # With every slot held, the outputs that free one bound it at the same pace: 32 jobs
    # decoding (3,200 tokens left) and the 10 queued: 11 jobs' share of 4,200 outputs (1,100)
    # at 32 a step = 34.375 steps, above the prompts' 25: 1.03125 s.
    full = dataclasses.replace(measured, bulk_in_flight=InFlightWork(32, 0, 3_200))
    assert full.bulk_start_s(queue) == pytest.approx(34.375 * 0.030)


@pytest.mark.parametrize(("tokens", "step_s"), [(0.0, 0.01), (10.0, 0.0), (float("nan"), 1.0)])
def test_a_nonsense_pace_raises(tokens: float, step_s: float) -> None:
    with pytest.raises(ValueError):
        BulkPrefillPace(tokens, step_s)


def test_outputs_beside_a_drain_fill_only_the_room_its_steps_have() -> None:
    cost = RATES.step_cost
    assert cost is not None
    # 1,280 prompt tokens at 128 a step: 10 steps with room for 320 decodes.
    plain = cost.drain_s(1_280, 0, prefill_tokens_per_step=128, seqs_per_step=32)
    beside = cost.drain_s(
        1_280, 0, prefill_tokens_per_step=128, seqs_per_step=32, output_tokens_beside=1_000
    )
    assert beside - plain == pytest.approx(320 * 0.0001)
    with pytest.raises(ValueError):
        cost.drain_s(1, 0, prefill_tokens_per_step=128, seqs_per_step=32, output_tokens_beside=-1)
