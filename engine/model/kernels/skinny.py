"""The binding of skinny_linear.c: y = x W^T + b for a decode step's few rows.

`skinny_linear_kernel()` compiles the C file once per machine and returns it, or None where it
cannot be built here; PrepackedLinear then keeps oneDNN for every row count.

NOTE: measured on the 2-vCPU Xeon (AMX, 2.6 GHz), torch 2.13, 2 threads, one process, medians
of 7 runs over 12 layers' matrices (so that 100m's stream from memory), ms a layer, this kernel
vs oneDNN prepacked. `100m` (768 x 2304, 768 x 768, 768 x 6144, 3072 x 768; 37.7 MB) rows
1/2/4/8/16/24/32: 1.19/1.22/1.28/1.33/1.63/1.99/2.43 vs 1.83/1.79/1.87/2.13/2.53/3.57/3.44
(0.56-0.71x; one row streams 31.7 GB/s, 32 rows run at 248 GFLOP/s), rows 48/64: 3.28/4.13 vs
4.06/4.96, rows 128/256: 8.19/14.93 vs 7.94/14.42 (oneDNN ahead by 3-4%). `small` (256 x 512,
256 x 256, 256 x 1536, 768 x 256; 3.2 MB, cache-resident) rows 1/8/32/64: 0.085/0.087/0.209/
0.376 vs 0.155/0.181/0.304/0.445. The loop before this one (each 16-wide panel read whole per
block of 8 rows, no prefetch) was no faster than oneDNN on 100m (32 rows: 3.98 ms) and so was
kept to weights of 2 MiB. Hence: rows up to MAX_ROWS and weights up to MAX_WEIGHT_BYTES.
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
# Where the kernel beat oneDNN in the NOTE above: up to 64 rows, at every weight size measured.
MAX_ROWS = 64
# The packed copy sits beside oneDNN's (prefill-sized calls keep oneDNN), so a weight's memory
# doubles: bounded here to keep an 8B-shaped model's matrices (235 MB each) out.
MAX_WEIGHT_BYTES = 64 << 20


class SkinnyLinear:
    def __init__(self, library: ctypes.CDLL) -> None:
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        fn = library.mixgate_skinny_linear_f32
        fn.argtypes = [ptr, i64, ptr, ptr, ptr, i64, i64, i64, ctypes.c_int]
        fn.restype = ctypes.c_int
        self._fn = fn

    @property
    def entry_address(self) -> int:
        """The C entry point's address (engine/model/kernels/decode_forward.c calls it)."""
        address = ctypes.cast(self._fn, ctypes.c_void_p).value
        assert address is not None
        return address

    @staticmethod
    def takes(weight: torch.Tensor) -> bool:
        """Whether a weight is one this kernel takes (fp32, CPU, at most MAX_WEIGHT_BYTES)."""
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
