"""Causal prefill attention over the paged KV cache in place: the binding of
paged_prefill_attention.c.

`paged_prefill_kernel()` compiles the kernel once per machine and returns it, or None where it
cannot run here (no C compiler, a failed build); the runner then keeps torch's SDPA (over the
fresh K/V for a first chunk, over a gathered copy and a mask for a later one). fp32 caches on
CPU only: a bf16 model keeps SDPA.
"""

from __future__ import annotations

import ctypes
import functools
import math
from pathlib import Path

import torch

from engine.model.kernels.native_build import load_kernel_or_none

__all__ = ["PagedPrefillKernel", "paged_prefill_kernel"]

_SOURCE = Path(__file__).with_name("paged_prefill_attention.c")
_ENTRY_POINT = "mixgate_paged_prefill_attention_f32"
# The C file's limit (MAX_HEAD_DIM) and its register block (head_dim a multiple of 4).
_MAX_HEAD_DIM = 256


class PagedPrefillKernel:
    """One sequence's chunk of queries, causally over its own blocks of one layer's cache."""

    def __init__(self, library: ctypes.CDLL) -> None:
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        fn = getattr(library, _ENTRY_POINT)
        fn.argtypes = [ptr, i64, ptr, ptr, ptr, i64, i64, ptr, i64, i64, i64, i64, i64]
        fn.argtypes += [ctypes.c_float, ctypes.c_int]
        fn.restype = ctypes.c_int
        self._fn = fn

    @property
    def entry_address(self) -> int:
        """The C entry point's address (engine/model/kernels/step_forward.c calls it)."""
        address = ctypes.cast(self._fn, ctypes.c_void_p).value
        assert address is not None
        return address

    @staticmethod
    def supports(heads: int, kv_heads: int, head_dim: int) -> bool:
        return (
            kv_heads >= 1
            and heads % kv_heads == 0
            and head_dim % 4 == 0
            and 4 <= head_dim <= _MAX_HEAD_DIM
        )

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_table: torch.Tensor,
        start_pos: int,
    ) -> torch.Tensor:
        """q [rows, heads, d] fp32 (query row i at position start_pos + i); one layer's caches
        [blocks, block_size, kv_heads, d] fp32, holding the sequence's keys 0 .. start_pos +
        rows - 1 in the blocks of `block_table` (int64, in order) -> [rows, heads, d]."""
        if q.dtype != torch.float32 or k_cache.dtype != torch.float32:
            raise ValueError("paged prefill attention runs fp32 queries over an fp32 cache")
        if v_cache.dtype != k_cache.dtype:
            raise ValueError("the K and V caches must share a dtype")
        if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
            raise ValueError("the K/V cache of a layer must be contiguous")
        if block_table.dtype != torch.long:
            raise ValueError("the block table must be int64")
        rows, heads, head_dim = q.shape
        block_size = k_cache.shape[1]
        if block_table.shape[0] * block_size < start_pos + rows:
            raise ValueError("the block table does not cover the chunk's last position")
        # Rows may be strided (a slice of the step's batch) but each row's heads contiguous.
        if q.stride(2) != 1 or q.stride(1) != head_dim:
            q = q.contiguous()
        table = block_table.contiguous()
        out = torch.empty((rows, heads, head_dim), dtype=torch.float32, device=q.device)
        status = self._fn(
            q.data_ptr(),
            q.stride(0),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            table.data_ptr(),
            start_pos,
            rows,
            out.data_ptr(),
            out.stride(0),
            heads,
            k_cache.shape[2],
            head_dim,
            block_size,
            1.0 / math.sqrt(head_dim),
            torch.get_num_threads(),
        )
        if status != 0:
            raise ValueError("paged prefill attention refused these shapes")
        return out


@functools.cache
def paged_prefill_kernel() -> PagedPrefillKernel | None:
    """The kernel, built on first use; None (logged once) where it cannot be built here."""
    library = load_kernel_or_none(_SOURCE, "paged_prefill_kernel_unavailable")
    return None if library is None else PagedPrefillKernel(library)
