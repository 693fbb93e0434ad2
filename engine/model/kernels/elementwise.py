"""What the model asks of a fused elementwise kernel set: RMSNorm (with the residual add),
SiLU * up and rotary, one pass each.

Two implementations: C for fp32 tensors on CPU (`fused_ops.py`), Triton for CUDA tensors
(`fused_elementwise_triton.py`). The model asks `applies_to` per call and falls back to eager
torch where a tensor is not one the kernels take.
"""

from __future__ import annotations

from typing import Protocol

import torch


class ElementwiseKernels(Protocol):
    def applies_to(self, x: torch.Tensor) -> bool: ...

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm of x [rows, hidden] -> a new [rows, hidden]."""
        ...

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + residual, RMSNorm(x + residual)) for [rows, hidden] tensors."""
        ...

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[rows, 2 * size] (gate then up) -> silu(gate) * up, a new [rows, size]."""
        ...

    def rotary(self, x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
        """x [rows, heads, head_dim], tables [rows, 1, head_dim] -> a rotated copy."""
        ...
