"""The memory budget, worked by hand."""

from __future__ import annotations

import pytest

from planning.memory_budget import MemoryBudget

# 100 GB device, 30 GB of weights, 10 GB of activations, 10 GB headroom: 50 GB for KV.
GB = 10**9
BUDGET = MemoryBudget(
    device_memory_bytes=100 * GB,
    weight_bytes=30 * GB,
    kv_bytes_per_token=500_000,
    activation_bytes=10 * GB,
    headroom_bytes=10 * GB,
)


def test_kv_capacity_and_sequences_by_hand() -> None:
    assert BUDGET.kv_budget_bytes == 50 * GB
    assert BUDGET.kv_token_capacity() == 100_000  # 50e9 / 5e5
    assert BUDGET.max_sequences(4096) == 24  # floor(100 000 / 4096)
    assert BUDGET.max_sequences(100_000) == 1
    assert BUDGET.max_sequences(100_001) == 0


def test_used_bytes_and_fits() -> None:
    # 24 sequences of 4096: 40e9 + 24 · 4096 · 5e5 = 89.152e9; with headroom 99.152e9 <= 100e9.
    assert BUDGET.used_bytes(24, 4096) == 40 * GB + 24 * 4096 * 500_000
    assert BUDGET.fits(24, 4096)
    assert not BUDGET.fits(25, 4096)


def test_a_model_that_does_not_fit_leaves_no_kv_room() -> None:
    too_big = MemoryBudget(device_memory_bytes=10, weight_bytes=20, kv_bytes_per_token=1)
    assert too_big.kv_token_capacity() == 0
    assert too_big.max_sequences(1) == 0
    assert not too_big.fits(0, 0)


def test_headroom_as_a_fraction() -> None:
    budget = MemoryBudget.with_headroom_fraction(1000, 300, 7, activation_bytes=100)
    assert budget.headroom_bytes == 100  # the default tenth
    assert budget.kv_token_capacity() == 500 // 7
    assert (
        MemoryBudget.with_headroom_fraction(1000, 0, 1, headroom_fraction=0.0).headroom_bytes == 0
    )


@pytest.mark.parametrize(
    "build",
    [
        lambda: MemoryBudget(0, 1, 1),
        lambda: MemoryBudget(10, 1, 0),
        lambda: MemoryBudget(10, -1, 1),
        lambda: MemoryBudget.with_headroom_fraction(10, 1, 1, headroom_fraction=1.0),
        lambda: BUDGET.max_sequences(0),
        lambda: BUDGET.used_bytes(-1, 10),
    ],
)
def test_nonsense_inputs_raise(build: object) -> None:
    assert callable(build)
    with pytest.raises(ValueError):
        build()
