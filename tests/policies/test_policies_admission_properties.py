"""Admission properties over random engines, queues and requests (hypothesis).

The hand-worked cases and their reference engine live in ``test_policies_admission.py``.
"""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from policies.admission import (
    AdmissionConfig,
    EngineRates,
    QueueState,
    RequestShape,
    decide_admission,
)
from policies.request_class import RequestClass
from tests.policies.test_policies_admission import INTERACTIVE, LIMITS, queues


def queue_states(limit: int) -> st.SearchStrategy[QueueState]:
    @st.composite
    def build(draw: st.DrawFn) -> QueueState:
        prompt_tokens = draw(st.integers(min_value=0, max_value=200_000))
        output_tokens = draw(st.integers(min_value=0, max_value=200_000))
        depth = draw(st.integers(min_value=0, max_value=limit + 5))
        return QueueState(depth, prompt_tokens + output_tokens, limit, prompt_tokens)

    return build()


def shrink(queue: QueueState, fraction: float) -> QueueState:
    prompt_tokens = int(queue.queued_prompt_tokens * fraction)
    output_tokens = int((queue.queued_tokens - queue.queued_prompt_tokens) * fraction)
    depth = int(queue.depth * fraction)
    return QueueState(depth, prompt_tokens + output_tokens, queue.queue_limit, prompt_tokens)


rates_st = st.builds(
    EngineRates,
    prefill_tokens_per_s=st.floats(min_value=1.0, max_value=1e6),
    decode_tokens_per_s=st.floats(min_value=1.0, max_value=1e5),
    running_interactive_seqs=st.integers(min_value=0, max_value=64),
    running_bulk_seqs=st.integers(min_value=0, max_value=64),
    measured=st.booleans(),
    bulk_step_tokens=st.integers(min_value=0, max_value=2048),
    interactive_slots=st.integers(min_value=0, max_value=64),
    waiting_interactive_prompt_tokens=st.integers(min_value=0, max_value=20_000),
    recent_step_s=st.one_of(st.none(), st.floats(min_value=1e-4, max_value=10.0)),
)
shapes_st = st.builds(
    RequestShape,
    request_class=st.sampled_from(list(RequestClass)),
    prompt_tokens=st.integers(min_value=1, max_value=8192),
    max_tokens=st.integers(min_value=1, max_value=4096),
    deadline_s=st.one_of(st.none(), st.floats(min_value=0.01, max_value=1e5)),
)
# Interactive requests within the interactive length limits (so only timing can refuse them).
chat_shapes_st = st.builds(
    RequestShape,
    request_class=st.just(INTERACTIVE),
    prompt_tokens=st.integers(min_value=1, max_value=4096),
    max_tokens=st.integers(min_value=1, max_value=1024),
    deadline_s=st.one_of(st.none(), st.floats(min_value=0.01, max_value=1e5)),
)
configs_st = st.builds(
    AdmissionConfig,
    interactive_ttft_target_s=st.floats(min_value=0.1, max_value=60.0),
    bulk_default_deadline_s=st.floats(min_value=1.0, max_value=1e5),
    safety_factor=st.floats(min_value=1.0, max_value=3.0),
)


@given(
    shape=shapes_st,
    interactive=queue_states(64),
    bulk=queue_states(10_000),
    rates=rates_st,
    cfg=configs_st,
    fraction=st.floats(min_value=0.0, max_value=1.0),
)
def test_a_feasible_request_stays_feasible_when_the_queue_ahead_shrinks(
    shape: RequestShape,
    interactive: QueueState,
    bulk: QueueState,
    rates: EngineRates,
    cfg: AdmissionConfig,
    fraction: float,
) -> None:
    before = decide_admission(shape, LIMITS, queues(interactive, bulk), rates, cfg)
    smaller = queues(shrink(interactive, fraction), shrink(bulk, fraction))
    after = decide_admission(shape, LIMITS, smaller, rates, cfg)
    assert after.predicted_start_s <= before.predicted_start_s
    if before.accepted:
        assert after.accepted


@given(
    shape=shapes_st,
    interactive=queue_states(64),
    bulk=queue_states(10_000),
    rates=rates_st,
    cfg=configs_st,
)
def test_every_decision_is_consistent(
    shape: RequestShape,
    interactive: QueueState,
    bulk: QueueState,
    rates: EngineRates,
    cfg: AdmissionConfig,
) -> None:
    decision = decide_admission(shape, LIMITS, queues(interactive, bulk), rates, cfg)
    bounded_s = (
        decision.predicted_ttft_s
        if shape.request_class is INTERACTIVE
        else decision.predicted_finish_s
    )
    if decision.accepted:
        # An accept is a promise: the scaled prediction fits the deadline.
        assert bounded_s * cfg.safety_factor <= decision.deadline_s
    else:
        assert decision.rejection is not None
        if decision.rejection.status_code == 429:
            assert decision.rejection.retry_after_s is not None
            assert decision.rejection.retry_after_s >= 1


@given(
    queued_prompt_tokens=st.integers(min_value=0, max_value=500_000),
    shape=shapes_st.filter(lambda s: s.request_class is INTERACTIVE),
    rates=rates_st,
    cfg=configs_st,
)
def test_retry_after_is_long_enough_for_the_queue_to_drain(
    queued_prompt_tokens: int, shape: RequestShape, rates: EngineRates, cfg: AdmissionConfig
) -> None:
    # One queued chat, no slot bound: what it holds ahead is its prompt, drained at prefill.
    rates = replace(rates, interactive_slots=0)
    ahead = QueueState(1, queued_prompt_tokens, 64, queued_prompt_tokens)
    decision = decide_admission(shape, LIMITS, queues(interactive=ahead), rates, cfg)
    rejection = decision.rejection
    if rejection is None or rejection.code != "deadline_unmeetable":
        return
    assert rejection.retry_after_s is not None
    # Real time runs safety_factor times slower than predicted: in retry_after_s seconds the
    # engine drains retry_after_s / safety_factor predicted seconds of the prompt tokens ahead.
    # (+2 tokens: a margin of at least one token, so float rounding cannot decide the test.)
    drained_s = rejection.retry_after_s / cfg.safety_factor
    drained_tokens = int(drained_s * rates.prefill_tokens_per_s) + 2
    left_tokens = max(0, queued_prompt_tokens - drained_tokens)
    later = QueueState(0, left_tokens, 64, left_tokens)
    retry = decide_admission(shape, LIMITS, queues(interactive=later), rates, cfg)
    own_ttft_s = retry.predicted_ttft_s - retry.predicted_start_s
    fixed_s = retry.predicted_start_s if later.queued_tokens == 0 else 0.0
    if (own_ttft_s + fixed_s) * cfg.safety_factor <= retry.deadline_s * (1 - 1e-9):
        # Feasible on an empty queue, so it is feasible once the queue has drained enough.
        assert retry.accepted


@given(
    prompt_tokens=st.integers(min_value=1, max_value=4096),
    bulk_step_tokens=st.integers(min_value=0, max_value=2048),
    headroom=st.floats(min_value=1.0001, max_value=1e3),
    bulk=queue_states(10_000),
    running_bulk_seqs=st.integers(min_value=0, max_value=64),
    decode_tokens_per_s=st.floats(min_value=0.01, max_value=1e5),
    cfg=configs_st,
)
def test_a_chat_over_any_bulk_backlog_with_idle_interactive_is_admitted(
    prompt_tokens: int,
    bulk_step_tokens: int,
    headroom: float,
    bulk: QueueState,
    running_bulk_seqs: int,
    decode_tokens_per_s: float,
    cfg: AdmissionConfig,
) -> None:
    # A prefill rate at which one bulk chunk plus the chat's own prompt fits the TTFT target
    # (with the safety factor): whatever the bulk work queued or running, and however slowly
    # it decodes, the chat overtakes it and is admitted.
    work_tokens = bulk_step_tokens + prompt_tokens
    prefill = work_tokens * cfg.safety_factor / cfg.interactive_ttft_target_s * headroom
    rates = EngineRates(
        prefill, decode_tokens_per_s, 0, running_bulk_seqs, True, bulk_step_tokens=bulk_step_tokens
    )
    shape = RequestShape(INTERACTIVE, prompt_tokens, 16)
    decision = decide_admission(shape, LIMITS, queues(bulk=bulk), rates, cfg)
    assert decision.accepted
    empty_bulk = decide_admission(shape, LIMITS, queues(), replace(rates, running_bulk_seqs=0), cfg)
    assert decision.predicted_ttft_s <= empty_bulk.predicted_ttft_s + bulk_step_tokens / prefill


@given(
    shape=chat_shapes_st,
    rates=rates_st,
    cfg=configs_st,
    excess=st.floats(min_value=1.0001, max_value=100.0),
    depth=st.integers(min_value=1, max_value=63),
)
def test_a_chat_behind_an_interactive_queue_that_cannot_finish_in_time_is_refused(
    shape: RequestShape, rates: EngineRates, cfg: AdmissionConfig, excess: float, depth: int
) -> None:
    # The prompts queued ahead alone take longer than the deadline at the prefill rate: no
    # engine can serve this chat in time, so it is refused.
    deadline_s = shape.deadline_s if shape.deadline_s is not None else cfg.interactive_ttft_target_s
    prompt_ahead = math.ceil(deadline_s * rates.prefill_tokens_per_s * excess)
    ahead = QueueState(depth, prompt_ahead + depth, 64, queued_prompt_tokens=prompt_ahead)
    decision = decide_admission(shape, LIMITS, queues(interactive=ahead), rates, cfg)
    assert decision.rejection is not None
    assert decision.rejection.code == "deadline_unmeetable"


@given(
    shape=shapes_st.filter(lambda s: s.request_class is INTERACTIVE),
    interactive=queue_states(64),
    bulk=queue_states(10_000),
    rates=rates_st,
    cfg=configs_st,
    more_depth=st.integers(min_value=0, max_value=10),
    more_prompt_tokens=st.integers(min_value=0, max_value=50_000),
    more_output_tokens=st.integers(min_value=0, max_value=50_000),
)
def test_interactive_prediction_is_monotone_in_the_interactive_queue(
    shape: RequestShape,
    interactive: QueueState,
    bulk: QueueState,
    rates: EngineRates,
    cfg: AdmissionConfig,
    more_depth: int,
    more_prompt_tokens: int,
    more_output_tokens: int,
) -> None:
    longer = QueueState(
        interactive.depth + more_depth,
        interactive.queued_tokens + more_prompt_tokens + more_output_tokens,
        interactive.queue_limit,
        interactive.queued_prompt_tokens + more_prompt_tokens,
    )
    before = decide_admission(shape, LIMITS, queues(interactive, bulk), rates, cfg)
    after = decide_admission(shape, LIMITS, queues(longer, bulk), rates, cfg)
    assert after.predicted_ttft_s >= before.predicted_ttft_s
    # A chat refused for its deadline stays refused behind a longer queue.
    if before.rejection is not None and before.rejection.code == "deadline_unmeetable":
        assert not after.accepted
