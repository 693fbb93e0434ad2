"""The few-rows linear kernel (engine/model/kernels/skinny_linear.c) and where it is used.

It must equal x @ W^T + b in float64 for every row count up to its limit and past it (row
blocks of 8, passes of 32 rows, a last group of one or two panels, a last panel that is not
full, inputs that end inside a chunk), give a row the same bits whatever its batch or thread
count, and PrepackedLinear must send it only decode-sized calls of fp32 weights up to its bound.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from engine.model.kernels import native_build
from engine.model.kernels.skinny import (
    MAX_ROWS,
    MAX_ROWS_BY_PANEL,
    MAX_WEIGHT_BYTES,
    SkinnyLinear,
    skinny_linear_kernel,
)
from engine.model.prepacked_linear import PrepackedLinear, prepacking_supported
from engine.model.runner import ModelRunner
from engine.model.weights import load_model

CPU = torch.device("cpu")


def _kernel() -> SkinnyLinear:
    kernel = skinny_linear_kernel()
    assert kernel is not None, "the kernel did not build here (is gcc installed?)"
    return kernel


def _cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.skipif(not Path("/proc/cpuinfo").is_file(), reason="reads /proc/cpuinfo")
def test_the_panel_is_one_vector_register_of_this_cpu() -> None:
    # A 16-float panel on a CPU without AVX-512 needs twice the registers it has: the kernel
    # spilled on every multiply-add (100m at B=8: 299 ms a step against 22 ms with 8).
    assert _kernel().panel == (16 if "avx512f" in _cpu_flags() else 8)


@pytest.mark.parametrize(
    ("out_features", "in_features"),
    [(512, 256), (259, 256), (256, 768), (80, 200), (5, 3)],
)
@pytest.mark.parametrize("rows", [1, 2, 7, 8, 9, 17, 32, 33, 64, 70])
def test_the_kernel_equals_float64(rows: int, out_features: int, in_features: int) -> None:
    kernel = _kernel()
    gen = torch.Generator().manual_seed(rows * out_features + in_features)
    weight = torch.randn(out_features, in_features, generator=gen) / in_features**0.5
    bias = torch.randn(out_features, generator=gen)
    x = torch.randn(rows, in_features, generator=gen)
    panels = _kernel().pack(weight)
    expected = x.double() @ weight.double().T
    got = kernel.matmul(x, panels, out_features, None)
    assert got.shape == (rows, out_features)
    assert torch.allclose(got.double(), expected, atol=1e-5)
    with_bias = kernel.matmul(x, panels, out_features, bias)
    assert torch.allclose(with_bias.double(), expected + bias.double(), atol=1e-5)


def test_a_row_gets_the_same_bits_alone_in_any_batch_and_thread_count() -> None:
    kernel = _kernel()
    gen = torch.Generator().manual_seed(5)
    weight = torch.randn(1536, 256, generator=gen)
    panels = _kernel().pack(weight)
    x = torch.randn(kernel.max_rows, 256, generator=gen)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel.matmul(x, panels, 1536, None)
        torch.set_num_threads(2)
        two = kernel.matmul(x, panels, 1536, None)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    for row in (0, 11, MAX_ROWS - 1, kernel.max_rows - 1):
        assert torch.equal(kernel.matmul(x[row : row + 1], panels, 1536, None)[0], two[row])
    # Rows that lie 512 floats apart (the first 256 columns of a wider tensor): the same bits.
    wide = torch.zeros(kernel.max_rows, 512)
    wide[:, :256] = x
    assert torch.equal(kernel.matmul(wide[:, :256], panels, 1536, None), two)


def test_only_fp32_cpu_weights_up_to_the_bound_are_taken() -> None:
    assert SkinnyLinear.takes(torch.zeros(1536, 256))
    assert SkinnyLinear.takes(torch.zeros(3072, 768))  # 9 MiB, streamed from memory: taken
    # Past the bound its packed copy beside oneDNN's would double too much memory (empty: the
    # pages are never touched).
    assert not SkinnyLinear.takes(torch.empty(MAX_WEIGHT_BYTES // 4 // 1024 + 1, 1024))
    assert not SkinnyLinear.takes(torch.zeros(256, 256, dtype=torch.bfloat16))
    with pytest.raises(ValueError):
        _kernel().matmul(torch.zeros(2, 128), _kernel().pack(torch.zeros(16, 256)), 16, None)


@pytest.mark.skipif(not prepacking_supported(CPU, torch.float32), reason="no oneDNN here")
def test_prepacked_linear_sends_decode_sized_calls_to_the_kernel_up_to_its_bound() -> None:
    torch.manual_seed(0)
    small = nn.Linear(256, 512, bias=True)
    through_kernel = PrepackedLinear(small, _kernel())
    onednn_only = PrepackedLinear(small)
    assert through_kernel.skinny is not None and onednn_only.skinny is None
    bound = _kernel().max_rows
    assert bound == MAX_ROWS_BY_PANEL[_kernel().panel] >= MAX_ROWS
    with torch.inference_mode():
        for rows in (1, MAX_ROWS, MAX_ROWS + 1, bound, bound + 1, 200):
            x = torch.randn(rows, 256)
            expected = small(x)
            assert torch.allclose(through_kernel(x), expected, atol=1e-5)
            assert torch.allclose(onednn_only(x), expected, atol=1e-5)
        # Up to the bound the call is the kernel's: a row's bits are its bits alone; past the
        # bound it is oneDNN's: the same bits as the oneDNN-only layer.
        x = torch.randn(bound, 256)
        alone = _kernel().matmul(x[-1:], through_kernel.panels, 512, small.bias.detach())
        assert torch.equal(through_kernel(x)[-1:], alone)
        x = torch.randn(bound + 1, 256)
        assert torch.equal(through_kernel(x), onednn_only(x))
    streamed = PrepackedLinear(nn.Linear(768, 3072), _kernel())
    assert streamed.skinny is not None and streamed.panels is not None
    with torch.device("meta"):
        oversized = nn.Linear(1024, MAX_WEIGHT_BYTES // 4 // 1024 + 1, bias=False)
    oversized.weight = nn.Parameter(torch.empty_like(oversized.weight, device="cpu"))
    large = PrepackedLinear(oversized, _kernel())
    assert large.skinny is None and large.panels is None


def test_the_runner_takes_the_kernel_for_fp32_prepacked_cpu_only(tiny_model_dir: Path) -> None:
    model, _ = load_model(tiny_model_dir, torch.float32, CPU)
    runner = ModelRunner(model, 64, 4, torch.float32, CPU, seed=0)
    assert (runner.skinny_linear is not None) == runner.prepacked
    model, _ = load_model(tiny_model_dir, torch.float32, CPU)
    assert (
        ModelRunner(
            model, 64, 4, torch.float32, CPU, seed=0, small_linear_kernel=False
        ).skinny_linear
        is None
    )
    model, _ = load_model(tiny_model_dir, torch.float32, CPU)
    assert (
        ModelRunner(model, 64, 4, torch.float32, CPU, seed=0, prepack=False).skinny_linear is None
    )
    model16, _ = load_model(tiny_model_dir, torch.bfloat16, CPU)
    assert ModelRunner(model16, 64, 4, torch.bfloat16, CPU, seed=0).skinny_linear is None


@pytest.mark.usefixtures("without_compiler")
def test_without_a_compiler_the_linears_keep_onednn(tiny_model_dir: Path) -> None:
    source = Path(native_build.__file__).with_name("skinny_linear.c")
    with pytest.raises(native_build.KernelBuildError):
        native_build.load_kernel(source)
    model, _ = load_model(tiny_model_dir, torch.float32, CPU)
    runner = ModelRunner(model, 64, 4, torch.float32, CPU, seed=0)
    assert runner.skinny_linear is None
    assert model.dense_logits([5, 6, 7]).shape[0] == 3
