"""RMSNorm (with the residual add), SiLU * up and rotary as one Triton kernel each, on CUDA.

Why: with a decode step replayed as one CUDA graph (engine/model/decode_graphs.py), an 8B bf16
step on the H200 this project was lent still ran ~1,000 kernels, and two thirds of them were
eager torch's elementwise ops: RMSNorm alone is 8 (upcast, square, mean, add, rsqrt, multiply,
downcast, weight), each a few microseconds over a few kilobytes. The step was 7.45 ms at B=8
against a 4.1 ms roofline. These kernels make each stretch one launch.

The arithmetic is eager torch's, rounding included: a bf16 model rounds where eager bf16 ops
round (the normalized value before the weight, silu(gate) before the product, each rotary
product before the sum), reductions run in fp32. So outputs match eager torch to an ulp, and the
dense reference path runs through the same kernels anyway (the model's modules choose).

Triton is imported lazily: CPU-only installs never need it. Its interpreter
(`TRITON_INTERPRET=1`) runs the same kernels on CPU tensors, which is how the tests check them
on machines without a GPU.
"""

from __future__ import annotations

import functools
from typing import Any

import structlog
import torch

from engine.model.kernels.triton_support import (
    interpreting,
    next_power_of_two,
    triton_import_error,
)

__all__ = ["TritonFusedElementwise", "triton_fused_elementwise"]

log = structlog.get_logger("mixgate.kernels")

# Columns one SiLU * up program covers.
SILU_TILE = 1024
# Columns an RMSNorm program holds at once: a row up to this wide is one tile (an 8B's 4096
# is); a wider one is walked twice, tile by tile (squares, then the normalized values).
NORM_TILE = 8192


@functools.cache
def _kernels() -> tuple[Any, Any, Any]:
    import triton
    import triton.language as tl

    @triton.jit  # type: ignore[untyped-decorator]
    def rms_norm(  # type: ignore[no-untyped-def]
        x_ptr,
        residual_ptr,
        total_ptr,
        weight_ptr,
        out_ptr,
        stride_x,
        stride_residual,
        stride_total,
        stride_out,
        hidden,
        eps,
        HAS_RESIDUAL: tl.constexpr,
        TILE: tl.constexpr,
    ):
        row = tl.program_id(0)
        squares = tl.zeros([TILE], tl.float32)
        for start in range(0, hidden, TILE):
            cols = start + tl.arange(0, TILE)
            inside = cols < hidden
            x = tl.load(x_ptr + row * stride_x + cols, mask=inside, other=0.0)
            if HAS_RESIDUAL:
                residual = tl.load(
                    residual_ptr + row * stride_residual + cols, mask=inside, other=0.0
                )
                # The sum rounded to the model dtype, as eager `x + residual` stores it.
                x = (x.to(tl.float32) + residual.to(tl.float32)).to(total_ptr.dtype.element_ty)
                tl.store(total_ptr + row * stride_total + cols, x, mask=inside)
            x32 = x.to(tl.float32)
            squares += x32 * x32
        rstd = tl.rsqrt(tl.sum(squares, axis=0) / hidden + eps)
        for start in range(0, hidden, TILE):
            cols = start + tl.arange(0, TILE)
            inside = cols < hidden
            # The sum again from the inputs, not read back from `total` (another thread of this
            # program may have stored it).
            x = tl.load(x_ptr + row * stride_x + cols, mask=inside, other=0.0)
            if HAS_RESIDUAL:
                residual = tl.load(
                    residual_ptr + row * stride_residual + cols, mask=inside, other=0.0
                )
                x = (x.to(tl.float32) + residual.to(tl.float32)).to(total_ptr.dtype.element_ty)
            normed = (x.to(tl.float32) * rstd).to(out_ptr.dtype.element_ty)
            weight = tl.load(weight_ptr + cols, mask=inside, other=0.0)
            out = weight.to(tl.float32) * normed.to(tl.float32)
            tl.store(
                out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=inside
            )

    @triton.jit  # type: ignore[untyped-decorator]
    def silu_mul(  # type: ignore[no-untyped-def]
        gate_up_ptr,
        out_ptr,
        stride_gate_up,
        stride_out,
        size,
        TILE: tl.constexpr,
    ):
        row = tl.program_id(0)
        cols = tl.program_id(1) * TILE + tl.arange(0, TILE)
        inside = cols < size
        gate = tl.load(gate_up_ptr + row * stride_gate_up + cols, mask=inside, other=0.0)
        up = tl.load(gate_up_ptr + row * stride_gate_up + size + cols, mask=inside, other=0.0)
        gate32 = gate.to(tl.float32)
        # F.silu's formula (x / (1 + e^-x)) in fp32, rounded before the product as eager does.
        activated = (gate32 / (1.0 + tl.exp(-gate32))).to(out_ptr.dtype.element_ty)
        out = activated.to(tl.float32) * up.to(tl.float32)
        tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=inside)

    @triton.jit  # type: ignore[untyped-decorator]
    def rotary(  # type: ignore[no-untyped-def]
        x_ptr,
        cos_ptr,
        sin_ptr,
        out_ptr,
        stride_x_row,
        stride_x_head,
        stride_table_row,
        heads,
        HEADS_PAD: tl.constexpr,
        HEAD_DIM: tl.constexpr,
    ):
        row = tl.program_id(0)
        head = tl.arange(0, HEADS_PAD)
        dims = tl.arange(0, HEAD_DIM)
        inside = (head < heads)[:, None]
        base = x_ptr + row * stride_x_row + head[:, None] * stride_x_head
        x = tl.load(base + dims[None, :], mask=inside, other=0.0)
        # x.roll(half, dims=-1)[d] is x[(d - half) mod head_dim], which is x[(d + half) mod
        # head_dim] since half is half the width.
        turned_dims = (dims + HEAD_DIM // 2) % HEAD_DIM
        rolled = tl.load(base + turned_dims[None, :], mask=inside, other=0.0)
        cos = tl.load(cos_ptr + row * stride_table_row + dims).to(tl.float32)
        sin = tl.load(sin_ptr + row * stride_table_row + dims).to(tl.float32)
        dtype = out_ptr.dtype.element_ty
        straight = (x.to(tl.float32) * cos[None, :]).to(dtype)
        turned = (rolled.to(tl.float32) * sin[None, :]).to(dtype)
        out = straight.to(tl.float32) + turned.to(tl.float32)
        out_offsets = row * heads * HEAD_DIM + head[:, None] * HEAD_DIM + dims[None, :]
        tl.store(out_ptr + out_offsets, out.to(dtype), mask=inside)

    return rms_norm, silu_mul, rotary


class TritonFusedElementwise:
    """One Triton launch per elementwise stretch of a layer, for CUDA tensors."""

    @staticmethod
    def applies_to(x: torch.Tensor) -> bool:
        # The interpreter (tests without a GPU) runs on CPU tensors.
        return x.device.type == "cuda" or interpreting()

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        out, _ = self._norm(x, None, weight, eps)
        return out

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual.shape != x.shape:
            raise ValueError(f"x {tuple(x.shape)} and residual {tuple(residual.shape)} differ")
        out, total = self._norm(x, residual, weight, eps)
        assert total is not None
        return total, out

    def _norm(
        self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if x.dim() != 2:
            raise ValueError(f"expected [rows, hidden], got {tuple(x.shape)}")
        rows, hidden = x.shape
        if weight.numel() != hidden or not weight.is_contiguous():
            raise ValueError(f"norm weight {tuple(weight.shape)} does not match hidden {hidden}")
        x = x if x.stride(1) == 1 else x.contiguous()
        if residual is not None and residual.stride(1) != 1:
            residual = residual.contiguous()
        out = torch.empty((rows, hidden), dtype=x.dtype, device=x.device)
        total = None if residual is None else torch.empty_like(out)
        if rows == 0:
            return out, total
        _kernels()[0][(rows,)](
            x,
            x if residual is None else residual,
            out if total is None else total,
            weight,
            out,
            x.stride(0),
            0 if residual is None else residual.stride(0),
            0 if total is None else total.stride(0),
            out.stride(0),
            hidden,
            eps,
            HAS_RESIDUAL=residual is not None,
            TILE=min(NORM_TILE, next_power_of_two(hidden)),
        )
        return out, total

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        if gate_up.dim() != 2 or gate_up.shape[1] % 2:
            raise ValueError(f"gate_up must be [rows, even width], got {tuple(gate_up.shape)}")
        gate_up = gate_up if gate_up.stride(1) == 1 else gate_up.contiguous()
        rows, size = gate_up.shape[0], gate_up.shape[1] // 2
        out = torch.empty((rows, size), dtype=gate_up.dtype, device=gate_up.device)
        if rows:
            grid = (rows, -(-size // SILU_TILE))
            _kernels()[1][grid](
                gate_up, out, gate_up.stride(0), out.stride(0), size, TILE=SILU_TILE
            )
        return out

    def rotary(self, x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
        rows, heads, head_dim = x.shape
        if head_dim % 2 or head_dim & (head_dim - 1):
            raise ValueError(f"rotary here needs a power-of-two head_dim, got {head_dim}")
        if x.stride(2) != 1:
            x = x.contiguous()
        cos_rows = cos.reshape(rows, head_dim)
        sin_rows = signed_sin.reshape(rows, head_dim)
        if cos_rows.stride(1) != 1 or sin_rows.stride() != cos_rows.stride():
            cos_rows, sin_rows = cos_rows.contiguous(), sin_rows.contiguous()
        out = torch.empty((rows, heads, head_dim), dtype=x.dtype, device=x.device)
        if rows:
            _kernels()[2][(rows,)](
                x,
                cos_rows,
                sin_rows,
                out,
                x.stride(0),
                x.stride(1),
                cos_rows.stride(0),
                heads,
                HEADS_PAD=next_power_of_two(heads),
                HEAD_DIM=head_dim,
            )
        return out


@functools.cache
def triton_fused_elementwise() -> TritonFusedElementwise | None:
    """The kernels where Triton can be imported; None (logged once) where it cannot."""
    reason = triton_import_error()
    if reason is not None:
        log.info("triton_fused_elementwise_unavailable", reason=reason)
        return None
    return TritonFusedElementwise()
