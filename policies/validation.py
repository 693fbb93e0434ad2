"""Argument checks the pure layers share (policies, and planning on top of them)."""

from __future__ import annotations

import math

__all__ = ["require_positive_finite"]


def require_positive_finite(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be positive and finite, got {value!r}")
