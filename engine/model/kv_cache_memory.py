"""The paged KV cache's memory: zeroed; on CPU committed lazily, or ahead of use in the background.

On CPU the memory comes from calloc (numpy.zeros), which for an allocation this size maps
fresh pages the kernel zeroes on first touch instead of writing every byte up front as
torch.zeros does: the default 1 GiB cache cost ~0.8 s of every engine start and 1 GiB of
resident memory before a single block was used. The values are the same (all-zero bits are
+0.0 in every float dtype), so reading a never-written slot is as safe as before.

But first touch is paid inside a step. numpy asks for transparent huge pages on an allocation
this size, so the first write into each 2 MiB of each layer's K and V regions faults and zeroes
the whole huge page; on the small preset (4 layers) a 512-token prefill step crosses into fresh
huge pages every 8 steps, and those steps took 90 ms instead of 40 (torch profiler: the cache
write, `index_copy_`, 48.5 ms instead of 1.8) until the whole cache had been touched once. A
chat that arrived during a bulk burst on a fresh server waited behind them.

`populate_in_background` commits the pages ahead of use without writing them: Linux's
madvise(MADV_POPULATE_WRITE) (5.14+) faults pages in as a write would but leaves their contents
alone, so it is safe while the engine writes K/V into blocks it already uses. It runs on a
daemon thread (ctypes drops the GIL for the call), lowest addresses first, which is the order
the block manager's free list hands blocks out at the start. On this 2-vCPU VM committing 1 GiB
took 0.15-2.3 s (the host backs guest memory on first touch too), which is why it is not done
before the engine reports ready.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import threading
import time
from typing import Any

import numpy as np
import structlog
import torch

from engine.model.huge_pages import libc_madvise

__all__ = ["populate_in_background", "zeroed_kv_cache"]

log = structlog.get_logger("mixgate.engine")

# Cache-line (and AVX-512 vector) alignment, as torch's own CPU allocator gives.
ALIGNMENT_BYTES = 64
# linux/mman.h; not in Python's mmap module before 3.13.
MADV_POPULATE_WRITE = 23
# One madvise call's span: short enough that the thread gives the CPU back often.
POPULATE_CHUNK_BYTES = 32 << 20


def zeroed_kv_cache(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """A zero-filled cache tensor of `shape` (on CPU: pages committed on first touch)."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = math.prod(shape) * itemsize
    raw = np.zeros(nbytes + ALIGNMENT_BYTES, dtype=np.uint8)
    offset = -raw.ctypes.data % ALIGNMENT_BYTES
    aligned = torch.from_numpy(raw[offset : offset + nbytes])
    return aligned.view(dtype).view(shape)


def populate_in_background(cache: torch.Tensor) -> threading.Thread | None:
    """Commit a CPU cache's pages on a daemon thread (returned, already started); None where
    there is nothing to do (not CPU memory) or the kernel cannot (no MADV_POPULATE_WRITE)."""
    if cache.device.type != "cpu" or cache.numel() == 0:
        return None
    madvise = libc_madvise()
    if madvise is None:
        return None
    thread = threading.Thread(
        target=_populate, args=(madvise, cache), name="kv-cache-populate", daemon=True
    )
    thread.start()
    return thread


def _populate(madvise: Any, cache: torch.Tensor) -> None:
    # The thread holds `cache`, so its memory stays mapped until the last call returns.
    page = mmap.PAGESIZE
    start = cache.data_ptr() // page * page  # the page holding the first byte
    end = cache.data_ptr() + cache.numel() * cache.element_size()
    began = time.perf_counter()
    address = start
    while address < end:
        length = min(POPULATE_CHUNK_BYTES, end - address)
        if madvise(address, length, MADV_POPULATE_WRITE) != 0:
            # EINVAL: a kernel before 5.14; ENOMEM/EFAULT: the range went away. First touch
            # stays the fallback either way.
            done_bytes = address - start
            log.info("kv_cache_populate_stopped", errno=ctypes.get_errno(), done_bytes=done_bytes)
            return
        address += length
    log.info(
        "kv_cache_populated",
        bytes=end - start,
        seconds=round(time.perf_counter() - began, 3),
    )
