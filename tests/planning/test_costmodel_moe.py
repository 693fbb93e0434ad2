"""MoE: the union of experts a step reads, worked by hand, and why dense speed-ups do not carry.

Reference MoE shape (round numbers): dense part 1e9 bytes, 8 experts of 1e9 bytes each
(E = 8, k = 2), bf16 so parameters = bytes / 2. Active parameters per token:
0.5e9 (dense) + 2/8 · 4e9 (experts) = 1.5e9. Machine: C = 1e14 flop/s, BW = 1e12 bytes/s.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planning.costmodel import (
    HardwareRates,
    ModelShape,
    decode_step_estimate_s,
    expected_experts_touched,
    mixed_step_estimate_s,
    moe_decode_comparison,
)
from planning.costmodel_routing import expert_pick_probabilities

HW = HardwareRates(flops_per_s=1e14, bytes_per_s=1e12, source="hand-picked for tests")
MOE = ModelShape(
    num_parameters=4_500_000_000,
    weight_bytes=9_000_000_000,
    kv_bytes_per_token=0,
    num_experts=8,
    experts_per_token=2,
    expert_parameters=4_000_000_000,
    expert_weight_bytes=8_000_000_000,
)


def test_uniform_union_worked_by_hand() -> None:
    # E · (1 − (1 − k/E)^T) with E = 8, k = 2: T = 1 -> 2; T = 2 -> 8 · (1 − 0.75²) = 3.5;
    # T = 3 -> 8 · (1 − 0.421875) = 4.625.
    assert expected_experts_touched(8, 2, 1) == pytest.approx(2.0, rel=1e-12)
    assert expected_experts_touched(8, 2, 2) == pytest.approx(3.5, rel=1e-12)
    assert expected_experts_touched(8, 2, 3) == pytest.approx(4.625, rel=1e-12)
    assert expected_experts_touched(8, 2, 0) == 0.0


@pytest.mark.parametrize("skew", [0.0, 1.0, 3.0])
@pytest.mark.parametrize("tokens", [1, 2, 64, 10_000])
def test_k_equal_e_reads_everything_at_any_batch(skew: float, tokens: int) -> None:
    assert expected_experts_touched(8, 8, tokens, routing_skew=skew) == pytest.approx(8.0)


@pytest.mark.parametrize("skew", [0.0, 0.5, 1.0, 2.0])
@pytest.mark.parametrize(("experts", "k"), [(8, 2), (64, 6), (60, 4)])
def test_one_token_reads_exactly_k_experts(skew: float, experts: int, k: int) -> None:
    assert expected_experts_touched(experts, k, 1, routing_skew=skew) == pytest.approx(k)


def test_skew_shares_popular_experts_so_the_union_is_smaller() -> None:
    uniform = expected_experts_touched(64, 2, 16)
    skewed = expected_experts_touched(64, 2, 16, routing_skew=1.2)
    assert skewed < uniform
    # The most popular expert is picked more often than uniform's k/E; the rarest less.
    q = expert_pick_probabilities(64, 2, routing_skew=1.2)
    assert q[0] > 2 / 64 > q[-1]
    assert sum(q) == pytest.approx(2.0, rel=1e-9)
    assert max(q) <= 1.0


def test_strong_skew_caps_a_token_at_one_pick_per_expert() -> None:
    # With E = 4, k = 3 and a steep skew, the top experts saturate at q = 1 (every token
    # picks them) and the rest share what is left so the picks still add up to k.
    q = expert_pick_probabilities(4, 3, routing_skew=4.0)
    assert q[0] == pytest.approx(1.0) and q[1] == pytest.approx(1.0)
    assert sum(q) == pytest.approx(3.0, rel=1e-9)


@given(
    experts=st.integers(1, 128),
    data=st.data(),
    tokens=st.integers(0, 4096),
    skew=st.floats(0.0, 3.0),
)
def test_union_is_bounded_and_grows_with_tokens(
    experts: int, data: st.DataObject, tokens: int, skew: float
) -> None:
    k = data.draw(st.integers(1, experts))
    now = expected_experts_touched(experts, k, tokens, skew)
    later = expected_experts_touched(experts, k, tokens + 1, skew)
    assert 0.0 <= now <= experts + 1e-9
    assert later >= now - 1e-9
    if tokens >= 1:
        assert now >= k - 1e-6  # never fewer than one token's k experts


def test_moe_shape_active_parameters_and_bytes() -> None:
    assert MOE.active_parameters == pytest.approx(1.5e9)
    assert MOE.dense_weight_bytes == 1_000_000_000
    assert MOE.active_weight_bytes == pytest.approx(3e9)
    assert MOE.weight_bytes_read(1) == pytest.approx(3e9)  # dense + 2 experts
    assert MOE.weight_bytes_read(2) == pytest.approx(4.5e9)  # dense + 3.5 experts


def test_moe_decode_step_reads_the_union_and_computes_the_active_part() -> None:
    # B = 2: compute 2 · 1.5e9 · 2 / 1e14 = 6e-5 s; memory (1e9 + 3.5e9) / 1e12 = 4.5e-3 s.
    est = decode_step_estimate_s(MOE, HW, batch_size=2, context_tokens=0)
    assert est.compute_s == pytest.approx(6e-5, rel=1e-12)
    assert est.weights_s == pytest.approx(4.5e-3, rel=1e-12)
    assert est.limited_by == "weights"
    # A mixed step's union counts prompt tokens too: 30 + 2 tokens read nearly all 8 experts.
    mixed = mixed_step_estimate_s(MOE, HW, prefill_tokens=30, decode_seqs=2, context_tokens=0)
    assert mixed.weight_bytes_read == pytest.approx(1e9 + 8e9 * (1 - 0.75**32), rel=1e-12)


def test_dense_speedups_do_not_carry_over_from_the_active_parameter_count() -> None:
    one = moe_decode_comparison(MOE, HW, batch_size=1, context_tokens=0)
    eight = moe_decode_comparison(MOE, HW, batch_size=8, context_tokens=0)
    # At B = 1 both views read the same 3e9 bytes.
    assert one.active_dense.step_s == pytest.approx(one.expert_union.step_s, rel=1e-9)
    # At B = 8 the active-dense view still reads 3e9 bytes (3 ms); the union reads
    # 1e9 + 8e9 · (1 − 0.75^8) = 8.199e9 bytes (8.2 ms).
    assert eight.active_dense.weights_s == pytest.approx(3e-3, rel=1e-9)
    assert eight.expert_union.weights_s == pytest.approx((1e9 + 8e9 * (1 - 0.75**8)) / 1e12)
    assert eight.experts_touched == pytest.approx(8 * (1 - 0.75**8))
    dense_speedup = (
        eight.active_dense.aggregate_tokens_per_s / one.active_dense.aggregate_tokens_per_s
    )
    moe_speedup = (
        eight.expert_union.aggregate_tokens_per_s / one.expert_union.aggregate_tokens_per_s
    )
    assert dense_speedup > 7.5  # memory-bound dense: batching is nearly free
    assert moe_speedup < 3.0  # the union grows with the batch: much less of a win


def test_comparison_needs_an_moe_shape() -> None:
    dense = ModelShape(num_parameters=10, weight_bytes=20, kv_bytes_per_token=0)
    with pytest.raises(ValueError):
        moe_decode_comparison(dense, HW, 1, 0)


_VALID_MOE: dict[str, float] = {
    "num_parameters": 100,
    "weight_bytes": 200,
    "kv_bytes_per_token": 0,
    "num_experts": 8,
    "experts_per_token": 2,
    "expert_parameters": 80,
    "expert_weight_bytes": 160,
}


@pytest.mark.parametrize(
    "override",
    [
        {"experts_per_token": 9},
        {"experts_per_token": 0},
        {"expert_parameters": 0},
        {"expert_weight_bytes": 201},
        {"routing_skew": -1.0},
        # A dense shape (no experts) must not carry expert fields.
        {"num_experts": 0, "expert_parameters": 0, "expert_weight_bytes": 0},
    ],
)
def test_inconsistent_moe_fields_raise(override: dict[str, float]) -> None:
    assert ModelShape(**_VALID_MOE).is_moe  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ModelShape(**{**_VALID_MOE, **override})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "call",
    [
        lambda: expected_experts_touched(0, 1, 1),
        lambda: expected_experts_touched(8, 9, 1),
        lambda: expected_experts_touched(8, 2, -1),
        lambda: expected_experts_touched(8, 2, 1, routing_skew=float("nan")),
    ],
)
def test_nonsense_routing_inputs_raise(call: object) -> None:
    assert callable(call)
    with pytest.raises(ValueError):
        call()
