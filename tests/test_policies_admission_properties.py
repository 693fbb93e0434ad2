"""Admission properties over random engines, queues and requests (hypothesis).

The hand-worked cases and their reference engine live in ``test_policies_admission.py``.
"""

from __future__ import annotations

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
from tests.test_policies_admission import INTERACTIVE, LIMITS, queues


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
)
shapes_st = st.builds(
    RequestShape,
    request_class=st.sampled_from(list(RequestClass)),
    prompt_tokens=st.integers(min_value=1, max_value=8192),
    max_tokens=st.integers(min_value=1, max_value=4096),
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
    queued_output_tokens=st.integers(min_value=0, max_value=500_000),
    shape=shapes_st.filter(lambda s: s.request_class is INTERACTIVE),
    rates=rates_st,
    cfg=configs_st,
)
def test_retry_after_is_long_enough_for_the_queue_to_drain(
    queued_output_tokens: int, shape: RequestShape, rates: EngineRates, cfg: AdmissionConfig
) -> None:
    ahead = QueueState(depth=1, queued_tokens=queued_output_tokens, queue_limit=64)
    decision = decide_admission(shape, LIMITS, queues(interactive=ahead), rates, cfg)
    rejection = decision.rejection
    if rejection is None or rejection.code != "deadline_unmeetable":
        return
    assert rejection.retry_after_s is not None
    # Real time runs safety_factor times slower than predicted: in retry_after_s seconds the
    # engine drains retry_after_s / safety_factor predicted seconds of the output tokens ahead.
    # (+2 tokens: a margin of at least one token, so float rounding cannot decide the test.)
    drained_s = rejection.retry_after_s / cfg.safety_factor
    drained_tokens = int(drained_s * rates.decode_tokens_per_s) + 2
    later = QueueState(0, max(0, queued_output_tokens - drained_tokens), 64)
    retry = decide_admission(shape, LIMITS, queues(interactive=later), rates, cfg)
    own_ttft_s = retry.predicted_ttft_s - retry.predicted_start_s
    if own_ttft_s * cfg.safety_factor <= retry.deadline_s * (1 - 1e-9):
        # Feasible on an empty queue, so it is feasible once the queue has drained enough.
        assert retry.accepted
