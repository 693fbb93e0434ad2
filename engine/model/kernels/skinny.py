"""The binding of skinny_linear.c: y = x W^T + b for a decode step's few rows, over small weights.

`skinny_linear_kernel()` compiles the C file once per machine and returns it, or None where it
cannot be built here; PrepackedLinear then keeps oneDNN for every row count.

NOTE: measured on the 2-vCPU Xeon @ 2.60 GHz, torch 2.13, 2 threads, one process, medians of 3
runs of 100 calls; the four matrices of one layer, this kernel vs oneDNN prepacked:
`small` (256 x 512, 256 x 256, 256 x 1536, 768 x 256; 3.2 MB, cache-resident) rows 1/2/4/8/16/
24/32/48: 0.110/0.103/0.110/0.145/0.255/0.331/0.450/0.674 ms vs 0.346/0.280/0.291/0.339/0.419/
0.618/0.520/0.643 (3.1x at 1 row, 1.2x at 32, 0.95x at 48); `100m` (37.7 MB, from memory) rows
1/2/4/8/16/32: 2.33/2.54/3.25/3.63/5.07/8.14 vs 2.49/2.75/3.08/3.36/4.27/6.03 ms: no gain, so
only weights up to MAX_WEIGHT_BYTES and rows up to MAX_ROWS take it.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from engine.model.kernels.native_build import load_kernel_or_none

__all__ = ["MAX_ROWS", "MAX_WEIGHT_BYTES", "SkinnyLinear", "skinny_linear_kernel"]

_SOURCE = Path(__file__).with_name("skinny_linear.c")
# The C file's PANEL: output features per contiguous panel of the packed weight.
PANEL = 16
# Where the kernel beat oneDNN in the NOTE above (rows <= 32 of a weight of <= 2 MiB).
MAX_ROWS = 32
MAX_WEIGHT_BYTES = 2 << 20


class SkinnyLinear:
    def __init__(self, library: ctypes.CDLL) -> None:
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        fn = library.mixgate_skinny_linear_f32
        fn.argtypes = [ptr, i64, ptr, ptr, ptr, i64, i64, i64, ctypes.c_int]
        fn.restype = ctypes.c_int
        self._fn = fn

    @staticmethod
    def takes(weight: torch.Tensor) -> bool:
        """Whether a weight is one this kernel runs faster than oneDNN (small, fp32, CPU)."""
        return (
            weight.dtype == torch.float32
            and weight.device.type == "cpu"
            and weight.dim() == 2
            and weight.numel() * weight.element_size() <= MAX_WEIGHT_BYTES
        )

    @staticmethod
    def pack(weight: torch.Tensor) -> torch.Tensor:
        """W [n, k] -> panels [ceil(n / PANEL), k, PANEL]: panel p holds outputs p*PANEL.. in
        k-major order, zero rows padding n up to a multiple of PANEL."""
        n, k = weight.shape
        padded = -(-n // PANEL) * PANEL
        rows = torch.nn.functional.pad(weight.detach().float(), (0, 0, 0, padded - n))
        return rows.view(padded // PANEL, PANEL, k).transpose(1, 2).contiguous()

    def matmul(
        self, x: torch.Tensor, panels: torch.Tensor, out_features: int, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """x [rows, k] (unit stride along k) @ W^T (+ bias) -> a new [rows, out_features]."""
        if x.stride(1) != 1:
            x = x.contiguous()
        rows, k = x.shape
        if panels.shape[1] != k:
            raise ValueError(f"x has {k} features, the weight {panels.shape[1]}")
        out = torch.empty((rows, out_features), dtype=x.dtype)
        status = self._fn(
            x.data_ptr(), x.stride(0), panels.data_ptr(), None if bias is None else bias.data_ptr(),
            out.data_ptr(), rows, out_features, k, torch.get_num_threads(),
        )  # fmt: skip
        if status != 0:
            raise ValueError("skinny linear refused these shapes")
        return out


@functools.cache
def skinny_linear_kernel() -> SkinnyLinear | None:
    """The kernel, built on first use; None (logged once) where it cannot be built here."""
    library = load_kernel_or_none(_SOURCE, "skinny_linear_unavailable")
    return None if library is None else SkinnyLinear(library)
