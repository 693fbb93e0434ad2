"""Decode attention over the paged KV cache in place: the binding of paged_decode_attention.c.

`paged_decode_kernel()` compiles the kernel once per machine and returns it, or None where it
cannot run here (no C compiler, a failed build); the runner then keeps the gather + SDPA path.
fp32 and bf16 caches on CPU take it (a bf16 cache's K/V are widened as they are read; q and
the output cross in fp32); CUDA has its own kernel (paged_decode_triton.py).
"""

from __future__ import annotations

import ctypes
import functools
import math
from pathlib import Path

import torch

from engine.model.kernels.native_build import load_kernel_or_none

__all__ = ["PagedDecodeKernel", "paged_decode_kernel"]

_SOURCE = Path(__file__).with_name("paged_decode_attention.c")
# The C file's limits (MAX_GROUP, MAX_HEAD_DIM, MAX_ACC): shapes past them keep SDPA.
_MAX_GROUP = 64
_MAX_HEAD_DIM = 512
_MAX_ACC = 64 * 128
# The cache dtypes the C file has an entry point for.
_ENTRY_POINTS = {
    torch.float32: "mixgate_paged_decode_attention_f32",
    torch.bfloat16: "mixgate_paged_decode_attention_bf16",
}


class PagedDecodeKernel:
    """Single-token queries, each over its own blocks of one layer's K/V cache."""

    def __init__(self, library: ctypes.CDLL) -> None:
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        self._fns = {}
        for dtype, name in _ENTRY_POINTS.items():
            fn = getattr(library, name)
            fn.argtypes = [ptr, ptr, ptr, ptr, i64, ptr, ptr, i64, i64, i64, i64, i64]
            fn.argtypes += [ctypes.c_float, ctypes.c_int]
            fn.restype = ctypes.c_int
            self._fns[dtype] = fn

    def entry_address(self, dtype: torch.dtype) -> int | None:
        """The C entry point's address for a `dtype` cache (engine/model/kernels/
        step_forward.c calls it), or None where there is none."""
        fn = self._fns.get(dtype)
        return None if fn is None else ctypes.cast(fn, ctypes.c_void_p).value

    @staticmethod
    def supports(heads: int, kv_heads: int, head_dim: int) -> bool:
        if kv_heads < 1 or heads % kv_heads:
            return False
        group = heads // kv_heads
        return group <= _MAX_GROUP and head_dim <= _MAX_HEAD_DIM and heads * head_dim <= _MAX_ACC

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
    ) -> torch.Tensor:
        """q [rows, heads, d]; caches [blocks, block_size, kv_heads, d] (one layer, fp32 or
        bf16); block_tables int64 [rows, width]; context_lens int64 [rows] -> [rows, heads, d]
        in q's dtype."""
        fn = self._fns.get(k_cache.dtype)
        if fn is None or v_cache.dtype != k_cache.dtype:
            raise ValueError(f"paged decode attention has no kernel for {k_cache.dtype} caches")
        out_dtype = q.dtype
        q = q.float().contiguous()
        rows, heads, head_dim = q.shape
        if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
            raise ValueError("the K/V cache of a layer must be contiguous")
        if block_tables.dtype != torch.long or context_lens.dtype != torch.long:
            raise ValueError("block tables and context lengths must be int64")
        tables = block_tables.contiguous()
        lengths = context_lens.contiguous()
        out = torch.empty_like(q)
        status = fn(
            q.data_ptr(),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            tables.data_ptr(),
            tables.shape[1],
            lengths.data_ptr(),
            out.data_ptr(),
            rows,
            heads,
            k_cache.shape[2],
            head_dim,
            k_cache.shape[1],
            1.0 / math.sqrt(head_dim),
            torch.get_num_threads(),
        )
        if status != 0:
            raise ValueError("paged decode attention refused these shapes")
        return out.to(out_dtype)


@functools.cache
def paged_decode_kernel() -> PagedDecodeKernel | None:
    """The kernel, built on first use; None (logged once) where it cannot be built here."""
    library = load_kernel_or_none(_SOURCE, "paged_decode_kernel_unavailable")
    return None if library is None else PagedDecodeKernel(library)
