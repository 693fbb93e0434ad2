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
kept to weights of 2 MiB. Hence: rows up to a bound (MAX_ROWS_BY_PANEL, below) and weights up to
MAX_WEIGHT_BYTES.

NOTE: on a 2-vCPU AMD EPYC whose guest sees AVX2 and no AVX-512 (family 25 model 1), the
16-float panels of the first version spilled their accumulators (a 16-float vector is two of
AVX2's 16 registers): `mixgate bench engine --model <100m> --threads 2`, decode step B=1/8/16/32
39.0/299.3/576.5/1164.9 ms, against 25.0/44.4/-/94.2 with `--small-linears onednn`. With the
AVX2 blocking (8-float panels, 4 rows x 3 panels) 16.8/22.0/41.8/76.7 ms (1.09/1.25/1.64/1.50x
the roofline estimate).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from engine.model.kernels.native_build import load_kernel_or_none

__all__ = [
    "MAX_ROWS",
    "MAX_ROWS_BY_PANEL",
    "MAX_WEIGHT_BYTES",
    "SkinnyLinear",
    "skinny_linear_kernel",
]

_SOURCE = Path(__file__).with_name("skinny_linear.c")
# Rows up to which a call takes this kernel rather than oneDNN, by the build's panel width:
# where it measured faster. AVX2 (8-float panels): up to 64, as measured on the AVX2 EPYC. AVX-512
# (16): up to 128. On the 2-vCPU Zen 5 (torch 2.13, 2 threads, one process, interleaved, medians
# of 9 over every layer's matrices) its time over oneDNN's at 64/80/96/112/128/160 rows was
# 0.91/0.93/0.91/0.97/0.97/0.99 on 100m's 12 layers (streamed) and 0.84/0.88/0.92/0.92/0.94/0.96
# on small's 4 (cache-resident); a mixed step of small (30 decodes + a 64-token chunk, 94 rows)
# took 0.94x, 8 decodes + 64 0.88x, and 100m's 94-row step 0.96x. The Xeon's NOTE above has
# oneDNN 3-4% ahead at 128 rows of 100m and the kernel 17% ahead at 64: its crossover is near 100,
# so 128 costs it a little at the top of the range for much more below.
MAX_ROWS_BY_PANEL = {16: 128, 8: 64}
# The bound every build honours (the AVX2 build's); SkinnyLinear.max_rows is this build's own.
MAX_ROWS = min(MAX_ROWS_BY_PANEL.values())
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
        # Output features per contiguous panel of the packed weight: the C file picks it for
        # this CPU's vector registers (16 with AVX-512, else 8).
        library.mixgate_skinny_panel.restype = ctypes.c_int
        self.panel = int(library.mixgate_skinny_panel())
        self.max_rows = MAX_ROWS_BY_PANEL.get(self.panel, MAX_ROWS)

    @property
    def entry_address(self) -> int:
        """The C entry point's address (engine/model/kernels/step_forward.c calls it)."""
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

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        """W [n, k] -> panels [ceil(n / panel), k, panel]: panel p holds outputs p*panel.. in
        k-major order, zero rows padding n up to a multiple of the panel."""
        n, k = weight.shape
        panel = self.panel
        padded = -(-n // panel) * panel
        rows = torch.nn.functional.pad(weight.detach().float(), (0, 0, 0, padded - n))
        return rows.view(padded // panel, panel, k).transpose(1, 2).contiguous()

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
