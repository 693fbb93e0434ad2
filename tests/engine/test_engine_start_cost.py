"""What an engine start does not pay for: torch._dynamo's import (random init on meta), and a
KV cache written in full before its first block is used; and how a served engine commits the
cache's pages anyway, in the background, without changing what the engine writes meanwhile."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.model.kv_cache_memory import ALIGNMENT_BYTES, zeroed_kv_cache
from engine.model.weights import load_model

SHAPE = (2, 2, 64, 16, 2, 32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_cache_is_zero_aligned_and_writable_in_place(dtype: torch.dtype) -> None:
    cache = zeroed_kv_cache(SHAPE, dtype, torch.device("cpu"))
    assert cache.shape == SHAPE and cache.dtype == dtype and cache.is_contiguous()
    assert cache.data_ptr() % ALIGNMENT_BYTES == 0
    assert not cache.any()
    cache[1, 0, 3] = 2.0
    assert cache.sum().item() == 2.0 * 16 * 2 * 32
    assert cache[1, 0, 3].eq(2.0).all() and not cache[1, 0, 4].any()


@pytest.mark.skipif(not Path("/proc/self/statm").is_file(), reason="reads Linux's /proc")
def test_a_large_cache_is_not_resident_until_written() -> None:
    # Run alone in a child, so no other test's memory moves the resident count between reads.
    script = """
import os, torch
from engine.model.kv_cache_memory import zeroed_kv_cache
page = os.sysconf("SC_PAGE_SIZE")
def resident_bytes():
    return int(open("/proc/self/statm").read().split()[1]) * page
before = resident_bytes()
cache = zeroed_kv_cache((1 << 28,), torch.float32, torch.device("cpu"))  # 1 GiB
after_alloc = resident_bytes()
cache[: 1 << 20] = 1.0  # 4 MiB written
after_write = resident_bytes()
print(before, after_alloc, after_write)
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    before, after_alloc, after_write = (int(value) for value in out.split())
    assert after_alloc - before < 64 << 20, "allocating the cache made it resident"
    assert after_write - before >= 4 << 20


@pytest.mark.skipif(not Path("/proc/self/statm").is_file(), reason="reads Linux's /proc")
def test_populating_commits_every_page_and_keeps_what_was_written() -> None:
    # In a child, alone, as above. Writes land before, during and after the populate thread's
    # run; every one must survive it (MADV_POPULATE_WRITE faults pages in, it writes nothing).
    script = """
import os, torch
from engine.model.kv_cache_memory import populate_in_background, zeroed_kv_cache
page = os.sysconf("SC_PAGE_SIZE")
def resident_bytes():
    return int(open("/proc/self/statm").read().split()[1]) * page
cache = zeroed_kv_cache((64, 1 << 20), torch.float32, torch.device("cpu"))  # 256 MiB
before = resident_bytes()
cache[0] = 1.0
thread = populate_in_background(cache)
cache[40] = 2.0
thread.join()
cache[63] = 3.0
after = resident_bytes()
written = float(cache[0].sum() + cache[40].sum() + cache[63].sum())
print(after - before, written, float(cache.sum()) - written)
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    # The last line: the thread's log line may come before it.
    grown, written, elsewhere = (float(value) for value in out.splitlines()[-1].split())
    assert grown >= 250 << 20, "the populate thread left most of the cache uncommitted"
    assert written == 6.0 * (1 << 20) and elsewhere == 0.0


def test_populating_is_for_cpu_memory_only() -> None:
    from engine.model.kv_cache_memory import populate_in_background

    meta = torch.empty(4, 4, device="meta")
    assert populate_in_background(meta) is None
    assert populate_in_background(torch.empty(0)) is None


def test_building_the_model_imports_no_dynamo_and_restores_init(tiny_model_dir: Path) -> None:
    script = f"""
import sys, torch
from engine.model.weights import load_model
load_model({str(tiny_model_dir)!r}, torch.float32, torch.device("cpu"))
print("torch._dynamo" in sys.modules)
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["False"]
    # In this process: init is skipped only while the model is built.
    originals = (torch.nn.Linear.reset_parameters, torch.nn.Embedding.reset_parameters)
    load_model(tiny_model_dir, torch.float32, torch.device("cpu"))
    assert (torch.nn.Linear.reset_parameters, torch.nn.Embedding.reset_parameters) == originals
    torch.manual_seed(0)
    assert torch.nn.Embedding(64, 8).weight.std().item() == pytest.approx(1.0, abs=0.2)
