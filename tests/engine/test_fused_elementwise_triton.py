"""The Triton elementwise kernels (the CUDA path: engine/model/kernels/fused_elementwise_triton.py)
against eager torch's ops, which they replace: RMSNorm with and without the residual add,
SiLU * up, rotary; and the model's logits through them. On a GPU they run on CUDA tensors (fp32
and bf16); elsewhere, where Triton is installed, in Triton's interpreter on CPU tensors.

Without a GPU this module runs itself again in Triton's interpreter, in a child pytest
(tests/engine/triton_interpreter.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engine.model.kernels.fused_elementwise_triton import NORM_TILE, TritonFusedElementwise
from engine.model.rotary import RotaryEmbedding
from engine.model.weights import load_model
from tests.engine.elementwise_refusals import assert_refuses_mismatched_shapes
from tests.engine.triton_interpreter import assert_passes_in_the_interpreter

pytest.importorskip("triton", reason="Triton is installed with CUDA builds of torch")

ON_GPU = torch.cuda.is_available()
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
# The interpreter narrows fp32 to bf16 by truncation, not round-to-nearest-even as GPUs do:
# bf16 is checked on CUDA only.
DTYPES = [torch.float32, torch.bfloat16] if ON_GPU else [torch.float32]
runs_here = pytest.mark.skipif(
    not (ON_GPU or INTERPRETING), reason="without a GPU: in the interpreter's child run"
)
# hidden, intermediate, heads, kv heads, head_dim: tiny-ish, 100m-like, an 8B's.
SHAPES = [(64, 128, 4, 2, 16), (768, 3072, 12, 12, 64), (4096, 14336, 32, 8, 128)]
EPS = 1e-5


@pytest.mark.skipif(ON_GPU or INTERPRETING, reason="the kernels run directly here")
def test_kernels_in_the_triton_interpreter() -> None:
    assert_passes_in_the_interpreter(__file__, passed=6, timeout_s=150)


def _tolerance(dtype: torch.dtype) -> dict[str, float]:
    # bf16: eager and the kernel round at the same points; an ulp or two apart where an fp32
    # sum's order moves a value across a rounding boundary (torch's own bf16 rtol is two ulps).
    # fp32: the same arithmetic up to reduction order and fused multiply-adds.
    if dtype == torch.float32:
        return {"atol": 1e-5, "rtol": 1e-5}
    return {"atol": 1e-2, "rtol": 1.6e-2}


def _normal(generator: torch.Generator, dtype: torch.dtype, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=generator).to(dtype=dtype, device=DEVICE)


def _eager_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + EPS)
    return weight * x32.to(x.dtype)


@runs_here
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("hidden", "intermediate", "heads", "kv_heads", "head_dim"), SHAPES)
def test_each_kernel_gives_eager_torchs_values(
    dtype: torch.dtype, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int
) -> None:
    generator = torch.Generator().manual_seed(hidden + heads)
    kernel, rows = TritonFusedElementwise(), 5
    weight = (1 + 0.1 * _normal(generator, dtype, hidden)).contiguous()
    # A strided x (a view into a wider buffer), as the layers hand over.
    wide = _normal(generator, dtype, rows, hidden + 8)
    x, residual = wide[:, :hidden], _normal(generator, dtype, rows, hidden)
    tolerance = _tolerance(dtype)
    torch.testing.assert_close(kernel.rms_norm(x, weight, EPS), _eager_norm(x, weight), **tolerance)
    total, normed = kernel.add_rms_norm(x, residual, weight, EPS)
    assert torch.equal(total, x + residual)
    torch.testing.assert_close(normed, _eager_norm(x + residual, weight), **tolerance)

    gate_up = _normal(generator, dtype, rows, 2 * intermediate)
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(kernel.silu_mul(gate_up), F.silu(gate) * up, **tolerance)

    # q and k of a qkv projection's output: rows strided by the whole qkv width.
    qkv = _normal(generator, dtype, rows, (heads + 2 * kv_heads) * head_dim)
    qk = qkv[:, : (heads + kv_heads) * head_dim].view(rows, heads + kv_heads, head_dim)
    with torch.device(DEVICE):
        tables = RotaryEmbedding(head_dim, 64, 10000.0, None).tables(
            torch.tensor([0, 1, 7, 30, 63], device=DEVICE), dtype
        )
    rotated = kernel.rotary(qk, tables.cos, tables.signed_sin)
    assert rotated.shape == qk.shape and rotated.is_contiguous()
    torch.testing.assert_close(rotated, tables.apply(qk), **tolerance)


@runs_here
def test_mismatched_shapes_are_refused() -> None:
    with torch.device(DEVICE):
        assert_refuses_mismatched_shapes(TritonFusedElementwise())
        with pytest.raises(ValueError):  # rotary here needs a power-of-two head_dim
            TritonFusedElementwise().rotary(
                torch.randn(2, 3, 12), torch.ones(2, 1, 12), torch.ones(2, 1, 12)
            )


@runs_here
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_row_wider_than_a_tile_is_normed_tile_by_tile(dtype: torch.dtype) -> None:
    hidden = NORM_TILE + NORM_TILE // 2 + 3  # two tiles, the second partly masked
    generator = torch.Generator().manual_seed(hidden)
    x, residual = _normal(generator, dtype, 3, hidden), _normal(generator, dtype, 3, hidden)
    weight = 1 + 0.1 * _normal(generator, dtype, hidden)
    kernel = TritonFusedElementwise()
    tolerance = _tolerance(dtype)
    torch.testing.assert_close(kernel.rms_norm(x, weight, EPS), _eager_norm(x, weight), **tolerance)
    total, normed = kernel.add_rms_norm(x, residual, weight, EPS)
    assert torch.equal(total, x + residual)
    torch.testing.assert_close(normed, _eager_norm(x + residual, weight), **tolerance)


@runs_here
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_model_gives_eager_torchs_logits_through_the_kernels(
    tiny_model_dir: Path, dtype: torch.dtype
) -> None:
    model, _ = load_model(tiny_model_dir, dtype, DEVICE)
    tokens = [(i * 37) % 200 + 3 for i in range(90)]
    model.use_fused_elementwise(None)
    eager = model.dense_logits(tokens)
    model.use_fused_elementwise(TritonFusedElementwise())
    fused = model.dense_logits(tokens)
    if dtype == torch.float32:
        torch.testing.assert_close(fused, eager, atol=1e-4, rtol=1e-4)
        assert torch.equal(fused.argmax(-1), eager.argmax(-1))
    else:  # bf16: an ulp here and there moves logits a little, never far
        torch.testing.assert_close(fused, eager, atol=0.1, rtol=0.05)
