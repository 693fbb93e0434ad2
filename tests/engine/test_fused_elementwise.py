"""The fused elementwise kernels (engine/model/kernels/fused_elementwise.c): RMSNorm with and
without the residual add, SiLU * up, rotary. Each must equal the float64 arithmetic it
replaces, give a row the same bits whatever its batch and thread count, and drive the model to
the same logits as eager torch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engine.model.kernels import native_build
from engine.model.kernels.fused_ops import FusedElementwise, fused_elementwise_kernel
from engine.model.rotary import RotaryEmbedding
from engine.model.runner import ModelRunner
from engine.model.weights import load_model
from tests.engine.elementwise_refusals import assert_refuses_mismatched_shapes

# hidden, intermediate, heads, kv heads, head_dim: tiny-ish, small, 100m, an 8B's.
SHAPES = [
    (64, 128, 4, 2, 16),
    (256, 768, 8, 4, 32),
    (768, 3072, 12, 12, 64),
    (4096, 14336, 32, 8, 128),
]
EPS = 1e-5


def _kernel() -> FusedElementwise:
    kernel = fused_elementwise_kernel()
    assert kernel is not None, "the kernels did not build here (is gcc installed?)"
    return kernel


def _norm64(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    x64 = x.double()
    return weight.double() * (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS))


@pytest.mark.parametrize(("hidden", "inter", "heads", "kv_heads", "head_dim"), SHAPES)
@pytest.mark.parametrize("rows", [1, 7, 300])
def test_each_kernel_equals_float64(
    rows: int, hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int
) -> None:
    kernel = _kernel()
    gen = torch.Generator().manual_seed(rows * hidden)
    x = torch.randn(rows, hidden, generator=gen) * 3
    residual = torch.randn(rows, hidden, generator=gen)
    weight = torch.randn(hidden, generator=gen)
    assert torch.allclose(kernel.rms_norm(x, weight, EPS).double(), _norm64(x, weight), atol=1e-5)
    total, normed = kernel.add_rms_norm(x, residual, weight, EPS)
    assert torch.equal(total, x + residual)  # one fp32 add: the same bits
    assert torch.allclose(
        normed.double(), _norm64(x.double() + residual.double(), weight), atol=1e-5
    )

    gate_up = torch.randn(rows, 2 * inter, generator=gen) * 4
    gate, up = gate_up.double().chunk(2, dim=-1)
    assert torch.allclose(kernel.silu_mul(gate_up).double(), F.silu(gate) * up, atol=1e-5)

    # q and k of a fused qkv row, as the model views them: rows qkv-wide apart.
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * head_dim, generator=gen)
    qk = qkv[:, : (heads + kv_heads) * head_dim].view(rows, heads + kv_heads, head_dim)
    positions = torch.randint(0, 8000, (rows,), generator=gen)
    tables = RotaryEmbedding(head_dim, 8192, 500000.0, None).tables(positions, torch.float32)
    q64 = qk.double()
    cos, sin = tables.cos.double(), tables.signed_sin.double()
    expected = q64 * cos + q64.roll(head_dim // 2, dims=-1) * sin
    rotated = kernel.rotary(qk, tables.cos, tables.signed_sin)
    assert rotated.is_contiguous()
    assert torch.allclose(rotated.double(), expected, atol=1e-5)


def test_a_row_gets_the_same_bits_alone_in_any_batch_and_thread_count() -> None:
    kernel = _kernel()
    gen = torch.Generator().manual_seed(3)
    hidden, inter = 768, 3072
    # 400 rows: past the size at which a call spreads over threads.
    x, residual = torch.randn(400, hidden, generator=gen), torch.randn(400, hidden, generator=gen)
    weight = torch.randn(hidden, generator=gen)
    gate_up = torch.randn(400, 2 * inter, generator=gen)
    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 2):
            torch.set_num_threads(count)
            results.append(
                (kernel.add_rms_norm(x, residual, weight, EPS)[1], kernel.silu_mul(gate_up))
            )
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])
    row = 123
    alone_norm = kernel.add_rms_norm(x[row : row + 1], residual[row : row + 1], weight, EPS)[1]
    assert torch.equal(alone_norm[0], results[1][0][row])
    assert torch.equal(kernel.silu_mul(gate_up[row : row + 1])[0], results[1][1][row])


def test_mismatched_shapes_are_refused() -> None:
    assert_refuses_mismatched_shapes(_kernel())


def test_the_model_gives_eager_torchs_logits_through_the_kernels(tiny_model_dir: Path) -> None:
    model, _ = load_model(tiny_model_dir, torch.float32, torch.device("cpu"))
    tokens = [(i * 37) % 200 + 3 for i in range(90)]
    model.use_fused_elementwise(None)
    eager = model.dense_logits(tokens)
    model.use_fused_elementwise(_kernel())
    fused = model.dense_logits(tokens)
    assert torch.allclose(fused, eager, atol=1e-4, rtol=1e-4)
    assert torch.equal(fused.argmax(-1), eager.argmax(-1))


def test_the_runner_takes_the_kernels_for_fp32_on_cpu_only(tiny_model_dir: Path) -> None:
    cpu = torch.device("cpu")
    model, _ = load_model(tiny_model_dir, torch.float32, cpu)
    assert ModelRunner(model, 64, 4, torch.float32, cpu, seed=0).fused_elementwise is not None
    assert model.norm.fused is not None
    off = ModelRunner(model, 64, 4, torch.float32, cpu, seed=0, fused_elementwise=False)
    assert off.fused_elementwise is None and model.norm.fused is None
    model16, _ = load_model(tiny_model_dir, torch.bfloat16, cpu)
    assert ModelRunner(model16, 64, 4, torch.bfloat16, cpu, seed=0).fused_elementwise is None


@pytest.mark.usefixtures("without_compiler")
def test_without_a_compiler_the_model_keeps_eager_torch(tiny_model_dir: Path) -> None:
    source = Path(native_build.__file__).with_name("fused_elementwise.c")
    with pytest.raises(native_build.KernelBuildError):
        native_build.load_kernel(source)
    model, _ = load_model(tiny_model_dir, torch.float32, torch.device("cpu"))
    runner = ModelRunner(model, 64, 4, torch.float32, torch.device("cpu"), seed=0)
    assert runner.fused_elementwise is None and model.norm.fused is None
    assert model.dense_logits([5, 6, 7]).shape[0] == 3  # eager torch still runs
