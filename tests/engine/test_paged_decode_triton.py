"""Triton's decode attention over the paged cache in place (the CUDA path), against float64
attention over each row's blocks (test_paged_decode_kernel's reference). On a GPU it runs on
CUDA tensors (fp32 and bf16); elsewhere, where Triton is installed, in Triton's interpreter on
CPU tensors (fp32: the interpreter's bf16 tl.dot is broken in Triton 3.9, so bf16 is checked
on CUDA only).

Without a GPU this module runs itself again in Triton's interpreter, in a child pytest
(tests/engine/triton_interpreter.py).
"""

from __future__ import annotations

import os

import pytest
import torch

from engine.model.kernels.paged_decode_triton import TritonPagedDecode
from tests.engine.test_paged_decode_kernel import float64_reference
from tests.engine.triton_interpreter import assert_passes_in_the_interpreter

pytest.importorskip("triton", reason="Triton is installed with CUDA builds of torch")

ON_GPU = torch.cuda.is_available()
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if ON_GPU else "cpu"
DTYPES = [torch.float32, torch.bfloat16] if ON_GPU else [torch.float32]
runs_here = pytest.mark.skipif(
    not (ON_GPU or INTERPRETING), reason="without a GPU: in the interpreter's child run"
)


@pytest.mark.skipif(ON_GPU or INTERPRETING, reason="the kernel runs directly here")
def test_kernel_in_the_triton_interpreter() -> None:
    assert_passes_in_the_interpreter(__file__, passed=5, timeout_s=110)


@runs_here
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "block_size"),
    [(4, 2, 16, 4), (8, 4, 32, 8), (12, 12, 64, 16), (32, 8, 128, 16)],
)
def test_matches_sdpa_over_each_rows_blocks(
    dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int, block_size: int
) -> None:
    generator = torch.Generator().manual_seed(heads * head_dim + block_size)

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(dtype=dtype, device=DEVICE)

    # One key; a partial last block; exactly whole blocks; past one 64-key tile; a longer one.
    lengths = torch.tensor([1, 3 * block_size + 1, 4 * block_size, 70, 97], device=DEVICE)
    rows, width = lengths.shape[0], -(-97 // block_size)
    num_blocks = rows * width + 3
    k_cache = normal(num_blocks, block_size, kv_heads, head_dim)
    v_cache = normal(num_blocks, block_size, kv_heads, head_dim)
    # Every row's blocks scattered over the cache, none shared.
    tables = torch.randperm(num_blocks, generator=generator)[: rows * width].view(rows, width)
    tables = tables.to(DEVICE)
    q = normal(rows, heads, head_dim)
    out = TritonPagedDecode().attend(q, k_cache, v_cache, tables, lengths)
    assert out.shape == q.shape and out.dtype == dtype
    expected = float64_reference(q, k_cache, v_cache, tables, lengths).float()
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float().cpu(), expected, atol=tolerance, rtol=tolerance)


@runs_here
def test_refuses_what_it_cannot_tile() -> None:
    assert TritonPagedDecode.supports(32, 8, 128)
    assert not TritonPagedDecode.supports(12, 5, 64)  # heads not a multiple of KV heads
    assert not TritonPagedDecode.supports(6, 6, 48)  # head_dim not a power of two
    assert not TritonPagedDecode.supports(4, 4, 8)  # below tl.dot's 16
    q = torch.zeros(1, 6, 48, device=DEVICE)
    cache = torch.zeros(2, 4, 6, 48, device=DEVICE)
    tables = torch.zeros(1, 1, dtype=torch.long, device=DEVICE)
    with pytest.raises(ValueError, match="refused"):
        TritonPagedDecode().attend(q, cache, cache, tables, torch.ones(1, dtype=torch.long))
