"""What the Triton kernels share: whether Triton imports here, whether its interpreter is on,
and the power-of-two sizes `tl.arange` needs. Triton is imported lazily: CPU-only installs never
need it."""

from __future__ import annotations

import functools
import os

__all__ = ["interpreting", "next_power_of_two", "triton_import_error"]


def next_power_of_two(value: int) -> int:
    return 1 << max(0, value - 1).bit_length()


def interpreting() -> bool:
    """Whether Triton's interpreter runs the kernels (on CPU tensors: tests without a GPU)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def triton_import_error() -> str | None:
    """Why Triton cannot be imported here, or None when it can."""
    try:
        import triton  # noqa: F401
    except ImportError as error:
        return str(error)
    return None
