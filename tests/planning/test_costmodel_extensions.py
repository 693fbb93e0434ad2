"""The cost model's extensions, each worked by hand: per-step overhead, overlap, the KV rate,
attention's quadratic term in a prefill chunk, and the weights/KV split of the limit.

Same round numbers as test_costmodel.py: P = 1e9, W = 2e9 bytes, kv = 1e5 bytes per token,
C = 1e14 flop/s, BW = 1e12 bytes/s.
"""

from __future__ import annotations

import pytest

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


def _rates(**changes: float) -> HardwareRates:
    return HardwareRates(
        **{"flops_per_s": 1e14, "bytes_per_s": 1e12, "source": "test", **changes}  # type: ignore[arg-type]
    )


def test_step_overhead_is_added_to_every_step() -> None:
    # B = 1, context 100: max(2e-5, 2.01e-3) + 5e-3 = 7.01e-3 s.
    est = decode_step_estimate_s(SHAPE, _rates(step_overhead_s=5e-3), 1, 100)
    assert est.step_s == pytest.approx(7.01e-3, rel=1e-12)
    assert est.overhead_s == 5e-3
    assert est.per_sequence_tokens_per_s == pytest.approx(1 / 7.01e-3, rel=1e-12)


@pytest.mark.parametrize(("overlap", "expected_s"), [(1.0, 6e-3), (0.0, 11e-3), (0.5, 8.5e-3)])
def test_overlap_between_max_and_sum(overlap: float, expected_s: float) -> None:
    # B = 300, context 100: compute 2e9 · 300 / 1e14 = 6e-3 s; memory (2e9 + 300 · 1e7) / 1e12
    # = 5e-3 s. Perfect overlap: 6e-3; none: 11e-3; half: 6e-3 + 0.5 · 5e-3 = 8.5e-3.
    est = decode_step_estimate_s(SHAPE, _rates(compute_memory_overlap=overlap), 300, 100)
    assert est.compute_s == pytest.approx(6e-3, rel=1e-12)
    assert est.memory_s == pytest.approx(5e-3, rel=1e-12)
    assert est.step_s == pytest.approx(expected_s, rel=1e-12)


def test_kv_rate_slows_only_the_cache_part() -> None:
    # KV at a quarter of BW: B = 10, context 100 -> cache 1e8 bytes / 2.5e11 = 4e-4 s.
    est = decode_step_estimate_s(SHAPE, _rates(kv_bytes_per_s=2.5e11), 10, 100)
    assert est.weights_s == pytest.approx(2e-3, rel=1e-12)
    assert est.kv_s == pytest.approx(4e-4, rel=1e-12)
    assert est.memory_s == pytest.approx(2.4e-3, rel=1e-12)


def test_limited_by_names_the_larger_part_of_memory() -> None:
    # Context 10 000: one sequence's cache is 1e9 bytes; 4 of them outweigh the 2e9 of weights.
    assert decode_step_estimate_s(SHAPE, HW, 1, 10_000).limited_by == "weights"
    assert decode_step_estimate_s(SHAPE, HW, 4, 10_000).limited_by == "kv"
    assert decode_step_estimate_s(SHAPE, HW, 400, 100).limited_by == "compute"


ATTENTION = ModelShape(
    num_parameters=1_000_000_000,
    weight_bytes=2_000_000_000,
    kv_bytes_per_token=100_000,
    attention_flops_per_query_key=1_000_000,
)


def test_prefill_chunk_attention_is_quadratic() -> None:
    # One chunk of 1000 tokens, nothing cached: 1000 · 1001 / 2 = 500 500 pairs · 1e6 flops
    # = 5.005e11 flops on top of 2e9 · 1000 = 2e12: 2.5005e12 / 1e14 = 2.5005e-2 s.
    est = mixed_step_estimate_s(ATTENTION, HW, prefill_tokens=1000, decode_seqs=0, context_tokens=0)
    assert est.compute_s == pytest.approx(2.5005e-2, rel=1e-12)
    # The same 1000 tokens after 3000 cached: + 1000 · 3000 pairs, and the prefix's KV read
    # (3000 · 1e5 bytes) next to the chunk's own KV written (1000 · 1e5).
    later = mixed_step_estimate_s(ATTENTION, HW, 1000, 0, 0, prefill_context_tokens=3000)
    assert later.compute_s == pytest.approx((2e12 + (500_500 + 3_000_000) * 1e6) / 1e14)
    assert later.kv_s == pytest.approx(4000 * 1e5 / 1e12, rel=1e-12)


def test_chunks_of_several_sequences_cost_less_attention_than_one_long_chunk() -> None:
    one = mixed_step_estimate_s(ATTENTION, HW, 1000, 0, 0)
    split = mixed_step_estimate_s(ATTENTION, HW, 1000, 0, 0, prefill_chunks=[(500, 0), (500, 0)])
    # 2 · 500 · 501 / 2 = 250 500 pairs instead of 500 500.
    assert one.compute_s - split.compute_s == pytest.approx(250_000 * 1e6 / 1e14, rel=1e-9)


def test_decode_attention_reads_each_cached_key_once() -> None:
    # B = 4 at context 500: 2000 pairs · 1e6 = 2e9 flops on top of 2e9 · 4 = 8e9.
    est = decode_step_estimate_s(ATTENTION, HW, 4, 500)
    assert est.compute_s == pytest.approx(1e10 / 1e14, rel=1e-12)


def test_attention_moves_the_crossover() -> None:
    # Context 100: compute per sequence 2e-5 + 1e8 / 1e14 = 2.1e-5 s; cache 1e-5 s; weights
    # 2e-3 s -> B = 2e-3 / 1.1e-5.
    assert crossover_batch_size(ATTENTION, HW, 100) == pytest.approx(2e-3 / 1.1e-5, rel=1e-12)


def test_dense_builder_with_query_heads_counts_attention() -> None:
    shape = ModelShape.dense(1_000, num_layers=2, num_kv_heads=2, head_dim=8, num_attention_heads=4)
    assert shape.attention_flops_per_query_key == 4 * 2 * 4 * 8
    assert ModelShape.dense(1_000, 2, 2, 8).attention_flops_per_query_key == 0


def test_rates_from_a_mapping() -> None:
    rates = HardwareRates.from_mapping(
        {"flops_per_s": 5e10, "bytes_per_s": 2e10, "step_overhead_s": 0.01, "extra": "ignored"}
    )
    assert (rates.flops_per_s, rates.bytes_per_s, rates.step_overhead_s) == (5e10, 2e10, 0.01)
    assert rates.compute_memory_overlap == 1.0
    assert rates.effective_kv_bytes_per_s == 2e10
    with pytest.raises(ValueError):
        HardwareRates.from_mapping({"flops_per_s": "fast", "bytes_per_s": 1.0})
    with pytest.raises(ValueError):
        HardwareRates.from_mapping({"bytes_per_s": 1.0})


@pytest.mark.parametrize(
    "build",
    [
        lambda: _rates(step_overhead_s=-1.0),
        lambda: _rates(compute_memory_overlap=1.5),
        lambda: _rates(kv_bytes_per_s=0.0),
        lambda: mixed_step_estimate_s(SHAPE, HW, 10, 0, 0, prefill_chunks=[(5, 0)]),
        lambda: mixed_step_estimate_s(SHAPE, HW, 10, 0, 0, prefill_chunks=[(12, 0), (-2, 0)]),
        lambda: mixed_step_estimate_s(SHAPE, HW, 10, 0, 0, prefill_context_tokens=-1),
    ],
)
def test_nonsense_extension_inputs_raise(build: object) -> None:
    assert callable(build)
    with pytest.raises(ValueError):
        build()
