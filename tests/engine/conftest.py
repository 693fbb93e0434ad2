"""Fixtures shared by the engine's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.model.kernels.fused_ops import fused_elementwise_kernel
from engine.model.kernels.paged_decode import paged_decode_kernel
from engine.model.kernels.paged_prefill import paged_prefill_kernel
from engine.model.kernels.skinny import skinny_linear_kernel
from engine.model.kernels.step_forward import step_forward_library

_KERNELS = (
    paged_decode_kernel,
    paged_prefill_kernel,
    fused_elementwise_kernel,
    skinny_linear_kernel,
    step_forward_library,
)


@pytest.fixture
def without_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No C compiler and an empty kernel cache: every kernel binding built inside the test
    finds nothing to load. The built-once bindings are forgotten before and after, so that the
    test sees the fallback and the next caller builds with the real compiler again."""
    monkeypatch.setenv("MIXGATE_KERNEL_CACHE", str(tmp_path / "kernels"))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    for kernel in _KERNELS:
        kernel.cache_clear()
    try:
        yield
    finally:
        for kernel in _KERNELS:
            kernel.cache_clear()
