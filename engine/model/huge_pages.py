"""The weights every decode step streams, copied into one arena of transparent huge pages (CPU).

Why: a decode step reads every weight once; on `100m` that is ~455 MB of packed fp32 panels a
step, ~111k pages of 4 KiB, so every ~4 KiB of the stream costs a TLB miss and a page walk whose
page-table lines also evict the step's own activations and K/V from the caches. Most
distributions (this VM included) run transparent huge pages in `madvise` mode, where memory gets
2 MiB pages only when asked, and torch's allocator never asks (numpy does, which is why the KV
cache from kv_cache_memory.py already has them).

Measured on the 2-vCPU Xeon, `100m`, fp32, 2 threads, B=8 decode steps, medians of 30: with
torch's allocations in huge pages (THP_MEM_ALLOC_ENABLE=1) 24.1-24.2 ms a step vs 25.4-25.9
without. That switch is read once per process, before the first allocation, so it cannot be
turned on by an engine built inside a running interpreter (tests, `bench engine`, the in-thread
engine); this module asks for the weights alone instead, from any process.

One arena for all of them rather than one mapping each: a 2 MiB-aligned mapping per matrix
would strand up to 2 MiB at each end (100m's smallest panel set is 2.4 MB).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Sequence

import structlog
import torch

from engine.model.libc import linux_libc

__all__ = ["HUGE_PAGE_BYTES", "copy_into_huge_pages", "libc_madvise"]

log = structlog.get_logger("mixgate.engine")

# x86-64's (and arm64's with 4 KiB base pages) transparent huge page.
HUGE_PAGE_BYTES = 2 << 20
# linux/mman.h
MADV_HUGEPAGE = 14
# Each tensor's start in the arena: a cache line (and an AVX-512 vector), as torch aligns.
ALIGNMENT_BYTES = 64


def copy_into_huge_pages(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of `tensors` (CPU, contiguous), side by side in one arena whose pages were advised
    MADV_HUGEPAGE before first touch; the same values, shapes and dtypes. Where the kernel
    cannot be asked (not Linux, an madvise error), the tensors come back unchanged."""
    if not tensors:
        return []
    if any(t.device.type != "cpu" or not t.is_contiguous() for t in tensors):
        raise ValueError("the huge-page arena takes contiguous CPU tensors")
    madvise = libc_madvise()
    if madvise is None:
        return list(tensors)
    offsets: list[int] = []
    total_bytes = 0
    for tensor in tensors:
        offsets.append(total_bytes)
        nbytes = tensor.numel() * tensor.element_size()
        total_bytes += -(-nbytes // ALIGNMENT_BYTES) * ALIGNMENT_BYTES
    # torch.empty maps fresh pages and writes none of them (its allocator does no zero or junk
    # fill by default), so the advice below comes before the first touch, as it must: memory
    # already faulted in 4 KiB pages would wait for khugepaged.
    raw = torch.empty(total_bytes + HUGE_PAGE_BYTES, dtype=torch.uint8)
    start = -raw.data_ptr() % HUGE_PAGE_BYTES
    if madvise(raw.data_ptr() + start, total_bytes, MADV_HUGEPAGE) != 0:
        log.info("huge_pages_unavailable", errno=ctypes.get_errno())
        return list(tensors)
    arena = raw[start : start + total_bytes]
    copies = []
    for tensor, offset in zip(tensors, offsets, strict=True):
        nbytes = tensor.numel() * tensor.element_size()
        copy = arena[offset : offset + nbytes].view(tensor.dtype).view(tensor.shape)
        copy.copy_(tensor)
        copies.append(copy)
    return copies


@functools.cache
def libc_madvise() -> Callable[[int, int, int], int] | None:
    """libc's madvise(addr, length, advice) -> 0 or -1 (errno kept), or None where it is not
    Linux's (the advice numbers here are Linux's)."""
    libc = linux_libc()  # MADV_HUGEPAGE's number is Linux's
    if libc is None:
        return None
    madvise = libc.madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise
