"""The paged prefill kernel equals causal attention over each query's visible keys.

Every case reads K/V from blocks scattered through the cache and compares with float64
softmax(q·K/sqrt(d))·V over keys 0 .. start_pos + i of query row i. The shapes cross the
kernel's tile edges (64 queries and 128 keys a tile on AVX-512, 16 queries on AVX2): chunks of
one row, of a tile and one, first chunks and later ones whose keys start tiles before their
first query, GQA groups, head sizes 4 to 256, a block size that is no power of two.
"""

from __future__ import annotations

import math

import pytest
import torch

from engine.model.kernels.paged_prefill import PagedPrefillKernel, paged_prefill_kernel


@pytest.fixture(scope="module")
def kernel() -> PagedPrefillKernel:
    built = paged_prefill_kernel()
    assert built is not None, "the prefill kernel was meant to build here (gcc is installed)"
    return built


def _reference(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start_pos: int
) -> torch.Tensor:
    rows, heads, head_dim = q.shape
    group = heads // keys.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for i in range(rows):
        visible = start_pos + i + 1
        for h in range(heads):
            k = keys[:visible, h // group].double()
            scores = k @ q[i, h].double() / math.sqrt(head_dim)
            out[i, h] = torch.softmax(scores, 0) @ values[:visible, h // group].double()
    return out


@pytest.mark.parametrize(
    ("rows", "start_pos", "heads", "kv_heads", "head_dim", "block_size"),
    [
        (1, 0, 4, 4, 8, 16),  # one token: a prompt of one
        (5, 0, 4, 2, 8, 16),  # GQA, a partial tile
        (64, 0, 4, 4, 64, 16),  # exactly one AVX-512 tile
        (65, 0, 4, 4, 64, 16),  # a tile and one row
        (200, 0, 2, 2, 64, 16),  # several key tiles, the last partial
        (100, 37, 8, 4, 32, 16),  # a later chunk: keys before its first query
        (20, 300, 2, 2, 64, 16),  # a short chunk after more than two key tiles
        (3, 61, 2, 1, 16, 7),  # odd block size, one kv head for two query heads
        (40, 5, 2, 2, 256, 16),  # the largest head size
        (9, 0, 3, 3, 4, 4),  # the smallest head size
    ],
)
def test_kernel_equals_causal_attention_over_scattered_blocks(
    kernel: PagedPrefillKernel,
    rows: int,
    start_pos: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    block_size: int,
) -> None:
    generator = torch.Generator().manual_seed(rows * 1000 + start_pos)
    context = start_pos + rows
    num_blocks = -(-context // block_size) + 20
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=generator)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=generator)
    table = torch.randperm(num_blocks, generator=generator)[: -(-context // block_size)]
    q = torch.randn(rows, heads, head_dim, generator=generator)
    out = kernel.attend(q, k_cache, v_cache, table, start_pos)
    keys = k_cache[table].flatten(0, 1)[:context]
    values = v_cache[table].flatten(0, 1)[:context]
    expected = _reference(q, keys, values, start_pos)
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=1e-5)


# Larger scores round coarser in fp32 before any exp sees them, hence the wider tolerance at x16
# (libm's expf in the kernel's place misses the same tolerances by the same margins).
@pytest.mark.parametrize(("q_scale", "atol"), [(4.0, 2e-5), (16.0, 4e-5)])
def test_scores_across_the_exponentials_whole_range(
    kernel: PagedPrefillKernel, q_scale: float, atol: float
) -> None:
    """The kernel's own exp (a polynomial, not libm's) over all of its inputs: scaled queries
    spread a row's scores 21-30 below its maximum at x4 and 88-117 at x16, past fp32's
    underflow (e^-87 is its smallest normal), so that a row's weights span every exponent and
    its far keys weigh nothing. A coefficient off by a third of a percent fails this by 50x."""
    rows, start_pos, heads, kv_heads, head_dim, block_size = 70, 150, 4, 2, 64, 16
    generator = torch.Generator().manual_seed(int(q_scale))
    context = start_pos + rows
    num_blocks = -(-context // block_size) + 5
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=generator)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=generator)
    table = torch.randperm(num_blocks, generator=generator)[: -(-context // block_size)]
    q = torch.randn(rows, heads, head_dim, generator=generator) * q_scale
    out = kernel.attend(q, k_cache, v_cache, table, start_pos)
    keys = k_cache[table].flatten(0, 1)[:context]
    values = v_cache[table].flatten(0, 1)[:context]
    expected = _reference(q, keys, values, start_pos)
    torch.testing.assert_close(out.double(), expected, atol=atol, rtol=1e-5)


def test_rows_of_a_wider_batch_are_read_through_their_stride(kernel: PagedPrefillKernel) -> None:
    # The runner hands a span's rows of the step's q: a slice, contiguous per row only.
    generator = torch.Generator().manual_seed(3)
    k_cache = torch.randn(8, 16, 2, 32, generator=generator)
    v_cache = torch.randn(8, 16, 2, 32, generator=generator)
    table = torch.tensor([5, 2, 7])
    fused = torch.randn(40, 3, 2, 32, generator=generator)  # [rows, q|k|v, heads, d]
    q = fused[:, 0]
    assert not q.is_contiguous()
    out = kernel.attend(q, k_cache, v_cache, table, 8)
    expected = _reference(q, k_cache[table].flatten(0, 1), v_cache[table].flatten(0, 1), 8)
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=1e-5)


def test_shapes_and_inputs_outside_the_kernel_are_refused(kernel: PagedPrefillKernel) -> None:
    assert PagedPrefillKernel.supports(12, 12, 64)
    assert not PagedPrefillKernel.supports(12, 5, 64), "heads not a multiple of kv heads"
    assert not PagedPrefillKernel.supports(4, 4, 6), "head size not a multiple of 4"
    assert not PagedPrefillKernel.supports(4, 4, 512), "head size past the kernel's limit"
    k_cache = torch.zeros(4, 16, 2, 32)
    q = torch.zeros(10, 2, 32)
    with pytest.raises(ValueError, match="fp32"):
        kernel.attend(q.bfloat16(), k_cache, k_cache, torch.tensor([0]), 0)
    with pytest.raises(ValueError, match="does not cover"):
        kernel.attend(q, k_cache, k_cache, torch.tensor([0]), 10)
