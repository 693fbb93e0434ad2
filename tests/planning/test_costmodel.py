"""The seed's roofline estimate, with every expected number worked by hand.

Reference model and machine (round numbers so the arithmetic is checkable on paper):
  P = 1e9 parameters, W = 2e9 bytes (bf16), kv_bytes_per_token = 1e5
  C = 1e14 flop/s, BW = 1e12 bytes/s
Per decode sequence: compute 2·P / C = 2e-5 s. At context 100, K = 1e5 · 100 = 1e7 bytes, so
its cache read costs K / BW = 1e-5 s. Weights cost W / BW = 2e-3 s per step.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planning.costmodel import (
    HardwareRates,
    ModelShape,
    crossover_batch_size,
    decode_step_estimate_s,
    mixed_step_estimate_s,
)

SHAPE = ModelShape(
    num_parameters=1_000_000_000, weight_bytes=2_000_000_000, kv_bytes_per_token=100_000
)
HW = HardwareRates(flops_per_s=1e14, bytes_per_s=1e12, source="hand-picked for tests")


def test_single_sequence_decode_is_memory_bound() -> None:
    # compute = 2e9 · 1 / 1e14 = 2e-5 s; memory = (2e9 + 1 · 1e7) / 1e12 = 2.01e-3 s.
    est = decode_step_estimate_s(SHAPE, HW, batch_size=1, context_tokens=100)
    assert est.compute_s == pytest.approx(2e-5, rel=1e-12)
    assert est.memory_s == pytest.approx(2.01e-3, rel=1e-12)
    assert est.step_s == pytest.approx(2.01e-3, rel=1e-12)
    assert est.limited_by == "weights"
    # One sequence: aggregate and per-sequence speed are both 1 / 2.01e-3 ≈ 497.5 tokens/s.
    assert est.aggregate_tokens_per_s == pytest.approx(1 / 2.01e-3, rel=1e-12)
    assert est.per_sequence_tokens_per_s == pytest.approx(1 / 2.01e-3, rel=1e-12)
    assert est.prefill_tokens_per_s == 0.0


def test_large_batch_decode_is_compute_bound() -> None:
    # B = 400: compute = 2e9 · 400 / 1e14 = 8e-3 s; memory = (2e9 + 400 · 1e7) / 1e12 = 6e-3 s.
    est = decode_step_estimate_s(SHAPE, HW, batch_size=400, context_tokens=100)
    assert est.compute_s == pytest.approx(8e-3, rel=1e-12)
    assert est.memory_s == pytest.approx(6e-3, rel=1e-12)
    assert est.limited_by == "compute"
    # 400 tokens per 8 ms step = 50 000 tokens/s in aggregate, but each user sees 125 tokens/s.
    assert est.aggregate_tokens_per_s == pytest.approx(50_000, rel=1e-12)
    assert est.per_sequence_tokens_per_s == pytest.approx(125, rel=1e-12)


def test_crossover_worked_by_hand() -> None:
    # 2·P·B / C = (W + B·K) / BW  ->  2e-5·B = 2e-3 + 1e-5·B  ->  B = 2e-3 / 1e-5 = 200.
    assert crossover_batch_size(SHAPE, HW, context_tokens=100) == pytest.approx(200, rel=1e-12)
    # At B = 200 both terms are 4e-3 s; the tie is reported as memory-bound.
    est = decode_step_estimate_s(SHAPE, HW, batch_size=200, context_tokens=100)
    assert est.compute_s == est.memory_s == pytest.approx(4e-3, rel=1e-12)
    assert est.limited_by == "weights"
    assert decode_step_estimate_s(SHAPE, HW, 201, 100).limited_by == "compute"


def test_long_context_never_becomes_compute_bound() -> None:
    # Context 1000: K / BW = 1e8 / 1e12 = 1e-4 s > 2e-5 s of compute per sequence.
    assert crossover_batch_size(SHAPE, HW, context_tokens=1000) == math.inf
    # Context 200 is the boundary: 2e7 / 1e12 = 2e-5 s exactly, so still no crossover.
    assert crossover_batch_size(SHAPE, HW, context_tokens=200) == math.inf
    assert decode_step_estimate_s(SHAPE, HW, 10_000, 1000).limited_by == "kv"


def test_zero_context_crossover_is_weights_over_compute() -> None:
    # K = 0: B = (W / BW) / (2·P / C) = 2e-3 / 2e-5 = 100.
    assert crossover_batch_size(SHAPE, HW, context_tokens=0) == pytest.approx(100, rel=1e-12)


def test_mixed_step_worked_by_hand() -> None:
    # 256 prefill tokens + 8 decodes at context 100:
    # compute = 2e9 · 264 / 1e14 = 5.28e-3 s
    # memory  = (2e9 + 8 · 1e7 + 256 · 1e5) / 1e12 = 2.1056e-3 s  -> compute-bound.
    est = mixed_step_estimate_s(SHAPE, HW, prefill_tokens=256, decode_seqs=8, context_tokens=100)
    assert est.compute_s == pytest.approx(5.28e-3, rel=1e-12)
    assert est.memory_s == pytest.approx(2.1056e-3, rel=1e-12)
    assert est.limited_by == "compute"
    assert est.aggregate_tokens_per_s == pytest.approx(8 / 5.28e-3, rel=1e-12)
    assert est.prefill_tokens_per_s == pytest.approx(256 / 5.28e-3, rel=1e-12)


def test_prefill_only_step_has_no_decode_output() -> None:
    # 1000 prompt tokens: compute 2e-2 s, memory (2e9 + 1e8) / 1e12 = 2.1e-3 s.
    est = mixed_step_estimate_s(SHAPE, HW, prefill_tokens=1000, decode_seqs=0, context_tokens=0)
    assert est.step_s == pytest.approx(2e-2, rel=1e-12)
    assert est.aggregate_tokens_per_s == 0.0
    assert est.prefill_tokens_per_s == pytest.approx(50_000, rel=1e-12)


def test_dense_shape_from_architecture_numbers() -> None:
    # K and V (2) × 16 layers × 8 KV heads × 64 dims × 2 bytes = 32 768 bytes per token.
    shape = ModelShape.dense(1_000_000, num_layers=16, num_kv_heads=8, head_dim=64)
    assert shape.kv_bytes_per_token == 32_768
    assert shape.weight_bytes == 2_000_000
    fp32 = ModelShape.dense(10, 1, 1, 1, bytes_per_parameter=4, kv_bytes_per_element=4)
    assert (fp32.weight_bytes, fp32.kv_bytes_per_token) == (40, 8)


@pytest.mark.parametrize(
    "build",
    [
        lambda: HardwareRates(flops_per_s=0.0, bytes_per_s=1.0, source="x"),
        lambda: HardwareRates(flops_per_s=1.0, bytes_per_s=math.inf, source="x"),
        lambda: HardwareRates(flops_per_s=1.0, bytes_per_s=1.0, source=""),
        lambda: ModelShape(num_parameters=0, weight_bytes=1, kv_bytes_per_token=0),
        lambda: ModelShape(num_parameters=1, weight_bytes=1, kv_bytes_per_token=-1),
        lambda: ModelShape.dense(10, num_layers=0, num_kv_heads=1, head_dim=1),
        lambda: decode_step_estimate_s(SHAPE, HW, batch_size=0, context_tokens=1),
        lambda: decode_step_estimate_s(SHAPE, HW, batch_size=1, context_tokens=-1),
        lambda: mixed_step_estimate_s(SHAPE, HW, 0, 0, 0),
        lambda: mixed_step_estimate_s(SHAPE, HW, -1, 2, 0),
        lambda: crossover_batch_size(SHAPE, HW, context_tokens=-1),
    ],
)
def test_nonsense_inputs_raise(build: object) -> None:
    assert callable(build)
    with pytest.raises(ValueError):
        build()


batch_sizes = st.integers(min_value=1, max_value=4096)
contexts = st.integers(min_value=0, max_value=32_768)


@given(batch_size=batch_sizes, context_tokens=contexts)
def test_batching_never_lowers_aggregate_nor_raises_per_sequence_speed(
    batch_size: int, context_tokens: int
) -> None:
    smaller = decode_step_estimate_s(SHAPE, HW, batch_size, context_tokens)
    larger = decode_step_estimate_s(SHAPE, HW, batch_size + 1, context_tokens)
    assert larger.aggregate_tokens_per_s >= smaller.aggregate_tokens_per_s * (1 - 1e-12)
    assert larger.per_sequence_tokens_per_s <= smaller.per_sequence_tokens_per_s


@given(batch_size=batch_sizes, context_tokens=contexts)
def test_regime_matches_the_crossover(batch_size: int, context_tokens: int) -> None:
    est = decode_step_estimate_s(SHAPE, HW, batch_size, context_tokens)
    crossover = crossover_batch_size(SHAPE, HW, context_tokens)
    assert est.step_s == max(est.compute_s, est.memory_s)
    # Stay clear of the float tie at the crossover itself.
    if batch_size < crossover * (1 - 1e-9):
        assert est.limited_by in ("weights", "kv")
    elif batch_size > crossover * (1 + 1e-9):
        assert est.limited_by == "compute"


@given(decode_seqs=batch_sizes, context_tokens=contexts)
def test_mixed_step_without_prefill_equals_decode_step(
    decode_seqs: int, context_tokens: int
) -> None:
    mixed = mixed_step_estimate_s(SHAPE, HW, 0, decode_seqs, context_tokens)
    assert mixed == decode_step_estimate_s(SHAPE, HW, decode_seqs, context_tokens)
