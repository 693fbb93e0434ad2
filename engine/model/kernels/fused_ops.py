"""The binding of fused_elementwise.c: RMSNorm (with the residual add), SiLU * up, rotary.

`fused_elementwise_kernel()` compiles the C file once per machine and returns it, or None where
it cannot be built here; the model then keeps its eager torch ops. Only fp32 tensors on CPU
take it (the model asks `applies_to` per call); bf16 and CUDA keep torch's ops.

NOTE: measured on the 2-vCPU Xeon @ 2.60 GHz, torch 2.13, 2 threads, one process, 1,000 calls
each, eager torch -> these kernels (us; RMSNorm, residual add + RMSNorm, SiLU * up, rotary of q
and k): 100m shapes 8 rows 38/40/29/23 -> 11/12/25/15; 512 rows 365/550/5,815/1,383 ->
114/201/1,388/227 (SiLU * up over gate_up's strided halves is the one eager torch does worst);
small shapes 16 rows 36/37/19/20 -> 10/11/16/13, 128 rows 65/74/68/76 -> 19/18/70/24.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from engine.model.kernels.native_build import load_kernel_or_none

__all__ = ["FusedElementwise", "fused_elementwise_kernel"]

_SOURCE = Path(__file__).with_name("fused_elementwise.c")


class FusedElementwise:
    """One C call per elementwise stretch of a layer, for fp32 CPU tensors."""

    def __init__(self, library: ctypes.CDLL) -> None:
        i64, ptr, f32, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int
        norm = library.mixgate_rms_norm_f32
        norm.argtypes = [ptr, ptr, ptr, ptr, ptr, i64, i64, i64, f32, i32]
        norm.restype = None
        silu_mul = library.mixgate_silu_mul_f32
        silu_mul.argtypes = [ptr, ptr, i64, i64, i32]
        silu_mul.restype = None
        rotary = library.mixgate_rotary_f32
        rotary.argtypes = [ptr, i64, ptr, ptr, ptr, i64, i64, i64, i32]
        rotary.restype = None
        self._norm, self._silu_mul, self._rotary = norm, silu_mul, rotary

    def entry_addresses(self) -> tuple[int, int, int]:
        """The C entry points' addresses (norm, SiLU * up, rotary) for
        engine/model/kernels/step_forward.c, which calls the same functions."""
        norm, silu_mul, rotary = (
            ctypes.cast(fn, ctypes.c_void_p).value
            for fn in (self._norm, self._silu_mul, self._rotary)
        )
        assert norm is not None and silu_mul is not None and rotary is not None
        return norm, silu_mul, rotary

    @staticmethod
    def applies_to(x: torch.Tensor) -> bool:
        return x.dtype == torch.float32 and x.device.type == "cpu"

    # NOTE: the wrappers are lean on purpose (2-D tensors in, no reshapes or views out): at a
    # decode step's sizes the C work is a few microseconds, and each torch call on a tensor's
    # metadata costs ~1-3 us here, so the wrapper, not the kernel, is most of a call's cost.

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm of x [rows, hidden] (unit stride along hidden) -> a new [rows, hidden]."""
        x = _unit_stride_rows(x)
        rows, hidden = x.shape
        _check_weight(weight, hidden)
        out = torch.empty((rows, hidden), dtype=x.dtype)
        self._norm(
            x.data_ptr(), None, None, weight.data_ptr(), out.data_ptr(),
            rows, hidden, x.stride(0), eps, torch.get_num_threads(),
        )  # fmt: skip
        return out

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + residual, RMSNorm(x + residual)) for [rows, hidden] tensors, in one pass."""
        # The kernel walks x, residual and the sum with one row stride: all three contiguous.
        x, residual = x.contiguous(), residual.contiguous()
        if x.dim() != 2 or residual.shape != x.shape:
            raise ValueError(f"x {tuple(x.shape)} and residual {tuple(residual.shape)} differ")
        rows, hidden = x.shape
        _check_weight(weight, hidden)
        total = torch.empty_like(x)
        out = torch.empty_like(x)
        self._norm(
            x.data_ptr(), residual.data_ptr(), total.data_ptr(), weight.data_ptr(),
            out.data_ptr(), rows, hidden, hidden, eps, torch.get_num_threads(),
        )  # fmt: skip
        return total, out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[rows, 2 * size] (gate then up) -> silu(gate) * up, a new [rows, size]."""
        fused = gate_up.contiguous()
        rows, width = fused.shape
        if width % 2:
            raise ValueError(f"gate_up must have an even width, got {width}")
        out = torch.empty(rows, width // 2, dtype=fused.dtype)
        self._silu_mul(fused.data_ptr(), out.data_ptr(), rows, width // 2, torch.get_num_threads())
        return out

    def rotary(self, x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
        """x [rows, heads, head_dim] (each row's heads contiguous), tables [rows, 1, head_dim]
        -> a rotated, contiguous copy (engine.model.rotary.RotaryTables.apply's arithmetic)."""
        rows, heads, head_dim = x.shape
        if head_dim % 2:
            raise ValueError(f"rotary needs an even head_dim, got {head_dim}")
        if x.stride(2) != 1 or x.stride(1) != head_dim:
            x = x.contiguous()
        cos_rows = cos.reshape(rows, head_dim).contiguous()
        sin_rows = signed_sin.reshape(rows, head_dim).contiguous()
        out = torch.empty(rows, heads, head_dim, dtype=x.dtype)
        self._rotary(
            x.data_ptr(), x.stride(0), cos_rows.data_ptr(), sin_rows.data_ptr(), out.data_ptr(),
            rows, heads, head_dim, torch.get_num_threads(),
        )  # fmt: skip
        return out


def _unit_stride_rows(x: torch.Tensor) -> torch.Tensor:
    if x.dim() != 2:
        raise ValueError(f"expected [rows, hidden], got {tuple(x.shape)}")
    return x if x.stride(1) == 1 else x.contiguous()


def _check_weight(weight: torch.Tensor, hidden: int) -> None:
    if weight.numel() != hidden or not weight.is_contiguous():
        raise ValueError(f"norm weight {tuple(weight.shape)} does not match hidden size {hidden}")


@functools.cache
def fused_elementwise_kernel() -> FusedElementwise | None:
    """The kernels, built on first use; None (logged once) where they cannot be built here."""
    library = load_kernel_or_none(_SOURCE, "fused_elementwise_unavailable")
    return None if library is None else FusedElementwise(library)
