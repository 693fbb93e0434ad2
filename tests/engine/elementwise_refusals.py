"""What every fused elementwise kernel set (C on CPU, Triton on CUDA) must refuse, on tensors of
the current default device."""

from __future__ import annotations

import pytest
import torch

from engine.model.kernels.elementwise import ElementwiseKernels

EPS = 1e-5


def assert_refuses_mismatched_shapes(kernel: ElementwiseKernels) -> None:
    with pytest.raises(ValueError):
        kernel.rms_norm(torch.randn(4, 8), torch.ones(9), EPS)
    with pytest.raises(ValueError):
        kernel.add_rms_norm(torch.randn(4, 8), torch.randn(3, 8), torch.ones(8), EPS)
    with pytest.raises(ValueError):
        kernel.silu_mul(torch.randn(4, 7))
    with pytest.raises(ValueError):
        kernel.rms_norm(torch.randn(2, 4, 8), torch.ones(8), EPS)
    with pytest.raises(ValueError):
        kernel.rotary(torch.randn(2, 3, 7), torch.ones(2, 1, 7), torch.ones(2, 1, 7))
