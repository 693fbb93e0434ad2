"""The huge-page arena for streamed weights: the same values, and memory the kernel was asked to
back with 2 MiB pages (read back from /proc/self/smaps, where this kernel reports it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from engine.model.huge_pages import ALIGNMENT_BYTES, HUGE_PAGE_BYTES, copy_into_huge_pages
from engine.model.kernels.skinny import skinny_linear_kernel
from engine.model.prepacked_linear import (
    PrepackedLinear,
    move_panels_into_huge_pages,
    prepacking_supported,
)

THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _thp_can_be_asked_for() -> bool:
    """Linux with transparent huge pages in `always` or `madvise` mode."""
    if not sys.platform.startswith("linux") or not THP_MODE.exists():
        return False
    return "[never]" not in THP_MODE.read_text()


def _mapping_flags(address: int) -> dict[str, str]:
    """The smaps fields of the mapping of this process that holds `address`."""
    fields: dict[str, str] = {}
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
            continue
        if inside and ":" in head:
            fields[head.rstrip(":")] = line.split(":", 1)[1].strip()
    return fields


def test_copies_hold_the_same_values_shapes_and_dtypes() -> None:
    tensors = [
        torch.randn(48, 768, 16),
        torch.arange(7, dtype=torch.int64),
        torch.randn(3, 5).to(torch.bfloat16),
    ]
    copies = copy_into_huge_pages(tensors)
    assert len(copies) == len(tensors)
    for original, copy in zip(tensors, copies, strict=True):
        assert copy.dtype == original.dtype and copy.shape == original.shape
        assert copy.is_contiguous()
        assert torch.equal(copy, original)
        assert copy.data_ptr() % ALIGNMENT_BYTES == 0
    # Copies, not aliases: the originals can be dropped or changed.
    tensors[0].zero_()
    assert copies[0].abs().sum() > 0


def test_nothing_in_nothing_out_and_non_contiguous_refused() -> None:
    assert copy_into_huge_pages([]) == []
    with pytest.raises(ValueError, match="contiguous CPU"):
        copy_into_huge_pages([torch.randn(4, 6).t()])


@pytest.mark.skipif(not _thp_can_be_asked_for(), reason="no transparent huge pages to ask for")
def test_the_arena_is_advised_for_huge_pages_and_starts_on_one() -> None:
    copies = copy_into_huge_pages([torch.ones(HUGE_PAGE_BYTES // 4 + 1000), torch.ones(10)])
    assert copies[0].data_ptr() % HUGE_PAGE_BYTES == 0
    flags = _mapping_flags(copies[0].data_ptr())
    # VmFlags `hg`: MADV_HUGEPAGE was applied to this mapping; THPeligible: the kernel may back
    # it with huge pages (whether it found free 2 MiB pages at fault time is its business).
    assert "hg" in flags["VmFlags"].split()
    assert flags["THPeligible"] == "1"


@pytest.mark.skipif(
    not prepacking_supported(torch.device("cpu"), torch.float32) or skinny_linear_kernel() is None,
    reason="no oneDNN or no few-row kernel here",
)
def test_moved_panels_compute_what_they_computed() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96), nn.Linear(96, 40, bias=False))
    kernel = skinny_linear_kernel()
    packed = nn.Sequential(*(PrepackedLinear(layer, kernel) for layer in model))
    x = torch.randn(5, 64)
    with torch.inference_mode():
        before = packed(x)
        old_pointers = [m.panels.data_ptr() for m in packed if isinstance(m, PrepackedLinear)]
        moved_bytes = move_panels_into_huge_pages(packed)
        after = packed(x)
    new_pointers = [m.panels.data_ptr() for m in packed if isinstance(m, PrepackedLinear)]
    assert kernel is not None
    # Out features padded to whole panels (16 with AVX-512, 8 with AVX2).
    padded_out = -(-40 // kernel.panel) * kernel.panel
    assert moved_bytes == (96 * 64 + padded_out * 96) * 4
    assert all(new != old for new, old in zip(new_pointers, old_pointers, strict=True))
    assert torch.equal(before, after)
