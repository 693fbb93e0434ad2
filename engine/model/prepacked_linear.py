"""Linear layers whose weights oneDNN has prepacked once at load time (CPU only).

A decode step multiplies 1-32 rows by every weight matrix. torch's default CPU linear goes to
MKL's sgemm, which on small row counts streams the weights far below the machine's bandwidth;
oneDNN's inner-product primitive over a weight already reordered into its blocked layout does
not pay that reorder (or MKL's packing) on every call.

NOTE: measured on a 2-vCPU AMD EPYC (Zen 4, AVX-512 BF16), torch 2.13, 2 threads, one process,
interleaved, medians; the five matrices of one layer plus lm_head, 100m shapes (hidden 768):
fp32 rows 1/2/8/32: F.linear 1.89/3.57/3.12/9.80 ms, oneDNN unpacked 0.77/0.97/1.21/4.30,
prepacked 0.47/0.51/0.77/3.31 (4.0x/7.0x/4.0x/3.0x); bf16 prepacked 0.26/0.20/0.36/0.96 vs
F.linear 0.48/0.40/0.94/26.1 ms. On the `small` preset (hidden 256) prepacked wins from 2 rows
on (1.6-2.0x) and loses at 1 row (0.090 vs 0.056 ms: oneDNN's fixed cost per call), a few
hundredths of a millisecond per step.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.model.huge_pages import copy_into_huge_pages
from engine.model.kernels.skinny import SkinnyLinear

__all__ = [
    "PrepackedLinear",
    "bucketed_rows",
    "move_panels_into_huge_pages",
    "prepack_linears",
    "prepacked_matmul",
    "prepacking_supported",
    "warm_row_buckets",
]

# oneDNN creates (and caches, up to ONEDNN_PRIMITIVE_CACHE_CAPACITY = 1024 entries) one primitive
# per row count it sees: ~0.6 MB each for a 768x3072 weight. A serving engine sees every row
# count from 1 to the step budget, so its RSS grew by ~450 MiB over a 3-minute soak (engine core
# 506 -> 949 MiB; flat at ~420 with prepacking off) and the soak failed "RSS flat". Row counts
# above EXACT_ROWS are padded to a multiple of ROW_BUCKET, which bounds the shapes (~50 up to a
# 544-token step) at <= ROW_BUCKET - 1 zero rows of work: free where a step is weight-bound,
# < 6% at 256 rows. Measured on one 256x768 linear, 2,000 calls with rows uniform in 1..600:
# RSS +365 MiB exact vs +31 MiB bucketed.
EXACT_ROWS = 16
ROW_BUCKET = 16


def prepacking_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether oneDNN can run linears of `dtype` on `device` here."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        return False
    if dtype == torch.float32:
        return True
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if dtype == torch.float16:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    return False


class PrepackedLinear(nn.Module):
    """y = x W^T + b through oneDNN, W held in oneDNN's own layout (an opaque mkldnn tensor).

    The original weight stays reachable as `weight` only when something else shares it (a tied
    lm_head shares the embedding's); otherwise the packed copy replaces it.

    With `skinny` given, an fp32 weight it takes (up to its MAX_WEIGHT_BYTES) is also packed for
    it (engine/model/kernels/skinny.py), and calls of at most its `max_rows` rows go there instead:
    faster than oneDNN at those row counts, small and streamed weights alike.
    """

    def __init__(self, linear: nn.Linear, skinny: SkinnyLinear | None = None):
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        weight = linear.weight.detach()
        self.dtype = weight.dtype
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        self.bias = None if linear.bias is None else linear.bias.detach().contiguous()
        self.skinny = skinny if skinny is not None and skinny.takes(weight) else None
        self.panels = None if self.skinny is None else self.skinny.pack(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skinny, panels = self.skinny, self.panels
        if (
            skinny is not None
            and panels is not None
            and x.dim() == 2
            and x.shape[0] <= skinny.max_rows
        ):
            return skinny.matmul(x, panels, self.out_features, self.bias)
        return prepacked_matmul(x, self.packed, self.bias)


def bucketed_rows(rows: int) -> int:
    """The row count oneDNN is asked for: exact up to EXACT_ROWS, else the next multiple of
    ROW_BUCKET (see the note above EXACT_ROWS)."""
    if rows <= EXACT_ROWS:
        return rows
    return -(-rows // ROW_BUCKET) * ROW_BUCKET


def prepacked_matmul(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x @ W^T (+ bias) over a oneDNN-prepacked W; x's rows padded to a bucketed count."""
    rows = x.reshape(-1, x.shape[-1])
    num_rows = rows.shape[0]
    padded_rows = bucketed_rows(num_rows)
    if padded_rows != num_rows:
        rows = torch.nn.functional.pad(rows, (0, 0, 0, padded_rows - num_rows))
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")
    if padded_rows != num_rows:
        out = out[:num_rows]
    return out.reshape(*x.shape[:-1], out.shape[-1])


def prepack_linears(model: nn.Module, skinny: SkinnyLinear | None = None) -> int:
    """Replace every nn.Linear in `model` by a PrepackedLinear (weights `skinny` takes also
    through it for few rows), and prepack the experts of every module that has `prepack_experts`
    (engine.model.moe); returns how many linears were replaced."""
    for module in model.modules():
        prepack_experts = getattr(module, "prepack_experts", None)
        if callable(prepack_experts):
            prepack_experts()
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear)
    ]
    for parent, name, child in targets:
        setattr(parent, name, PrepackedLinear(child, skinny))
    return len(targets)


def move_panels_into_huge_pages(model: nn.Module) -> int:
    """Move every skinny-kernel panel set of `model` into one arena of transparent huge pages
    (engine/model/huge_pages.py): those are the weights a decode step streams whole. Returns
    the bytes moved."""
    owners = [
        (m, m.panels)
        for m in model.modules()
        if isinstance(m, PrepackedLinear) and m.panels is not None
    ]
    panels = [p for _, p in owners]
    for (linear, _), copy in zip(owners, copy_into_huge_pages(panels), strict=True):
        linear.panels = copy
    return sum(p.numel() * p.element_size() for p in panels)


def warm_row_buckets(model: nn.Module, max_rows: int) -> int:
    """Run every distinct prepacked weight shape once at each bucketed row count up to
    `max_rows` that oneDNN would serve; returns the calls made.

    oneDNN creates a primitive per (weight shape, row count) on first use, ~0.6-1 ms each here:
    on a fresh server the first steps of each new row count paid it for every weight shape (the
    first 512-token prefill step of the `small` preset took 76 ms instead of ~40). Primitives
    are keyed by shapes, not by weights, so one linear per shape warms them all.
    """
    by_shape: dict[tuple[int, int, bool, torch.dtype], PrepackedLinear] = {}
    for module in model.modules():
        if isinstance(module, PrepackedLinear):
            key = (module.in_features, module.out_features, module.bias is not None, module.dtype)
            by_shape.setdefault(key, module)
    row_counts = sorted({bucketed_rows(rows) for rows in range(1, max_rows + 1)})
    calls = 0
    with torch.inference_mode():
        for linear in by_shape.values():
            for rows in row_counts:
                if linear.skinny is not None and rows <= linear.skinny.max_rows:
                    continue  # the engine's own loop takes these, not oneDNN
                x = torch.zeros(rows, linear.in_features, dtype=linear.dtype)
                prepacked_matmul(x, linear.packed, linear.bias)
                calls += 1
    return calls
