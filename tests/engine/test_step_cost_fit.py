"""The step-cost fit: it recovers a known linear cost, its running sums agree with fitting the
window afresh through evictions, and it gives nothing where the window cannot separate the
fixed part from the per-token one. Step times are synthetic (no clock)."""

from __future__ import annotations

import random

import pytest

from engine.core.step_cost_fit import MIN_STEPS, StepCostFit
from engine.core.step_record import StepHistory, StepRecord
from policies.request_class import RequestClass

FIXED_S, TOKEN_S = 0.007, 0.0001


def step_s(tokens: int) -> float:
    return FIXED_S + TOKEN_S * tokens


def record(index: int, prefill: int, decode: int, duration_s: float) -> StepRecord:
    tokens = {}
    if prefill:
        tokens[(RequestClass.BULK, "prefill")] = prefill
    if decode:
        tokens[(RequestClass.INTERACTIVE, "decode")] = decode
    return StepRecord(index, 0.0, duration_s, tokens, {}, {}, 0.0, 0)


def test_a_linear_cost_is_recovered() -> None:
    fit = StepCostFit()
    rng = random.Random(3)
    for _ in range(200):
        tokens = rng.choice([0, 64, 128, 300]) + rng.randint(0, 32)
        fit.add(tokens, step_s(tokens))
    cost = fit.fit()
    assert cost is not None
    assert cost.fixed_s == pytest.approx(FIXED_S, rel=1e-6)
    assert cost.token_s == pytest.approx(TOKEN_S, rel=1e-6)


def test_the_history_fits_its_window_of_both_kinds_through_evictions() -> None:
    history = StepHistory(capacity=64)
    rng = random.Random(5)
    steps = []
    for index in range(300):
        prefill, decode = rng.choice([0, 128, 512]), rng.randint(0, 40)
        duration_s = step_s(prefill + decode) * rng.uniform(0.8, 1.3)
        steps.append((prefill + decode, duration_s))
        history.add(record(index, prefill, decode, duration_s))
    fresh = StepCostFit()
    for tokens, duration_s in steps[-64:]:
        fresh.add(tokens, duration_s)
    expected, got = fresh.fit(), history.step_cost()
    assert expected is not None and got is not None
    assert got.fixed_s == pytest.approx(expected.fixed_s, rel=1e-6)
    assert got.token_s == pytest.approx(expected.token_s, rel=1e-6)


def test_too_few_steps_give_no_fit() -> None:
    fit = StepCostFit()
    for index in range(MIN_STEPS - 1):
        tokens = 64 * (index % 3) + index % 7
        fit.add(tokens, step_s(tokens))
    assert fit.fit() is None


def test_steps_of_one_size_give_no_fit_before_any_other_window_did() -> None:
    fit = StepCostFit()
    for index in range(100):
        tokens = 144 + index % 3  # a bulk chunk and ~16 decodes, step after step
        fit.add(tokens, step_s(tokens))
    assert fit.fit() is None


def test_a_window_that_fits_a_negative_cost_gives_no_fit() -> None:
    # Bigger steps that ran faster (a busy machine's first steps): the token would cost < 0.
    fit = StepCostFit()
    for index in range(100):
        tokens = 64 * (index % 5)
        fit.add(tokens, 0.04 - 0.0001 * tokens)
    assert fit.fit() is None


def test_the_fit_and_the_bulk_pace_cross_the_engine_process_boundary_as_data() -> None:
    from engine.core.step_record import LoadSnapshot
    from engine.process.messages import StepOutputs, output_decoder, output_encoder
    from policies.bulk_prefill_pace import BulkPrefillPace
    from policies.step_cost import StepCost

    load = LoadSnapshot(
        running_by_class={RequestClass.BULK: 3},
        waiting_by_class={RequestClass.BULK: 1},
        kv_usage=0.25,
        num_free_blocks=10,
        recent_step_s=0.02,
        prefill_tokens_per_s=5000.0,
        decode_tokens_per_s=600.0,
        total_preemptions=0,
        steps=100,
        step_cost=StepCost(FIXED_S, TOKEN_S),
        bulk_prefill=BulkPrefillPace(81.3, 0.0113),
    )
    message = StepOutputs(outputs=[], rejections=[], load=load, steps=[])
    assert output_decoder.decode(output_encoder.encode(message)) == message


def test_steps_of_one_size_keep_the_last_per_token_cost_through_their_mean() -> None:
    # A backlog's steady steps (one chunk, a full batch) cannot show the per-token cost; the
    # one fit before them is kept, the fixed part re-anchored on their mean step.
    fit = StepCostFit()
    for index in range(100):
        tokens = 32 * (index % 8)
        fit.add(tokens, step_s(tokens))
    assert fit.fit() is not None
    steady = StepCostFit()  # the same steps with no earlier window
    for index in range(100):
        fit.add(32 * (index % 8), step_s(32 * (index % 8)), sign=-1)
        fit.add(150, 0.030)  # slower than the old line predicts for 150 tokens
        steady.add(150, 0.030)
    assert steady.fit() is None  # nothing to go on without an earlier window
    cost = fit.fit()
    assert cost is not None
    assert cost.token_s == pytest.approx(TOKEN_S, rel=1e-6)
    assert cost.fixed_s + cost.token_s * 150 == pytest.approx(0.030, rel=1e-6)
