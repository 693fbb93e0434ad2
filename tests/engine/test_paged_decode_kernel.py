"""The paged decode kernel (engine/model/kernels/): exact attention over the cache in place.

Every query's output must equal softmax(q·K/sqrt(d))·V in float64 over exactly the keys of its
own context, read through its block table from blocks scattered in the cache; keys past a
row's context (the rest of its last block, padding in its table row) must never be read.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from engine.model.kernels import native_build
from engine.model.kernels.paged_decode import PagedDecodeKernel, paged_decode_kernel
from engine.model.runner import ModelRunner
from engine.model.weights import load_model

# Written into every cache slot no row may read: one such key in a softmax would swamp it.
POISON = 1e4


def _kernel() -> PagedDecodeKernel:
    kernel = paged_decode_kernel()
    assert kernel is not None, "the kernel did not build here (is gcc installed?)"
    return kernel


def _case(
    heads: int, kv_heads: int, head_dim: int, block_size: int, lengths: list[int], seed: int
) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    per_row = [-(-n // block_size) for n in lengths]
    num_blocks = sum(per_row) + 3
    k_cache = torch.full((num_blocks, block_size, kv_heads, head_dim), POISON)
    v_cache = torch.full((num_blocks, block_size, kv_heads, head_dim), POISON)
    order = list(range(num_blocks))
    random.Random(seed).shuffle(order)
    width = max(per_row) + 2  # padded rows, as the runner's persistent tables are
    tables = torch.full((len(lengths), width), order[-1], dtype=torch.long)
    taken = 0
    for row, (length, blocks) in enumerate(zip(lengths, per_row, strict=True)):
        ids = order[taken : taken + blocks]
        taken += blocks
        tables[row, :blocks] = torch.tensor(ids)
        for position in range(length):
            block, offset = ids[position // block_size], position % block_size
            shape = (kv_heads, head_dim)
            k_cache[block, offset] = torch.randn(shape, generator=generator)
            v_cache[block, offset] = torch.randn(shape, generator=generator)
    q = torch.randn(len(lengths), heads, head_dim, generator=generator)
    return q, k_cache, v_cache, tables, torch.tensor(lengths)


def float64_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    lengths: torch.Tensor,
) -> torch.Tensor:
    """Each row over its own blocks in float64 (also the Triton kernel's reference)."""
    q, k_cache, v_cache = q.cpu(), k_cache.cpu(), v_cache.cpu()
    tables, lengths = tables.cpu(), lengths.cpu()
    heads, kv_heads, head_dim = q.shape[1], k_cache.shape[2], q.shape[2]
    block_size = k_cache.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for row, length in enumerate(lengths.tolist()):
        blocks = tables[row, : -(-length // block_size)]
        keys = k_cache[blocks].flatten(0, 1)[:length].double()
        values = v_cache[blocks].flatten(0, 1)[:length].double()
        for h in range(heads):
            kv = h // (heads // kv_heads)
            scores = keys[:, kv] @ q[row, h].double() / math.sqrt(head_dim)
            out[row, h] = torch.softmax(scores, 0) @ values[:, kv]
    return out


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "block_size", "lengths"),
    [
        (8, 4, 32, 16, [1, 15, 16, 17, 300, 33]),  # the small preset's GQA shapes
        (12, 12, 64, 16, [130, 144, 2, 160]),  # 100m: no GQA
        (32, 8, 128, 16, [1, 40, 77]),  # an 8B model's heads
        (6, 2, 8, 1, [1, 5, 9]),  # one token per block
        (4, 1, 16, 4, [3, 4, 5, 8, 1, 12, 2, 7, 9, 6]),  # MQA, more rows than threads
    ],
)
def test_kernel_equals_float64_attention_over_scattered_blocks(
    heads: int, kv_heads: int, head_dim: int, block_size: int, lengths: list[int]
) -> None:
    assert PagedDecodeKernel.supports(heads, kv_heads, head_dim)
    q, k_cache, v_cache, tables, context = _case(heads, kv_heads, head_dim, block_size, lengths, 7)
    out = _kernel().attend(q, k_cache, v_cache, tables, context)
    expected = float64_reference(q, k_cache, v_cache, tables, context)
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "block_size", "lengths"),
    [(8, 4, 32, 16, [1, 17, 300, 33]), (12, 12, 64, 16, [130, 2]), (32, 8, 128, 16, [40, 77])],
)
def test_a_bf16_cache_equals_float64_attention_over_its_values(
    heads: int, kv_heads: int, head_dim: int, block_size: int, lengths: list[int]
) -> None:
    """bf16 K/V widened as they are read: the float64 attention over the same bf16 values, the
    answer rounded once to bf16 (q and the output are bf16 in a bf16 model)."""
    case = _case(heads, kv_heads, head_dim, block_size, lengths, 11)
    q, k_cache, v_cache = (t.bfloat16() for t in case[:3])
    tables, context = case[3], case[4]
    out = _kernel().attend(q, k_cache, v_cache, tables, context)
    assert out.dtype == torch.bfloat16
    expected = float64_reference(q, k_cache, v_cache, tables, context)
    # One bf16 rounding of the result (8 bits of mantissa) and fp32 sums before it.
    torch.testing.assert_close(out.double(), expected, atol=1e-2, rtol=2**-7)
    with pytest.raises(ValueError, match="no kernel for torch.float16"):
        _kernel().attend(q, k_cache.half(), v_cache.half(), tables, context)


def test_a_strided_query_view_gives_the_same_answer() -> None:
    # The model hands attention a slice of its fused qkv projection, not a contiguous tensor.
    q, k_cache, v_cache, tables, context = _case(8, 4, 32, 16, [20, 50, 3], 1)
    wide = torch.cat([q, torch.zeros_like(q)], dim=2)[:, :, :32]
    assert not wide.is_contiguous()
    kernel = _kernel()
    assert torch.equal(
        kernel.attend(wide, k_cache, v_cache, tables, context),
        kernel.attend(q, k_cache, v_cache, tables, context),
    )


def test_one_thread_and_two_give_the_same_bits() -> None:
    # A (row, head) task runs on one thread, whichever: the answer must not depend on how many.
    q, k_cache, v_cache, tables, context = _case(8, 4, 32, 16, [200, 31, 64, 9, 128], 2)
    kernel = _kernel()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel.attend(q, k_cache, v_cache, tables, context)
        torch.set_num_threads(2)
        two = kernel.attend(q, k_cache, v_cache, tables, context)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


def test_shapes_outside_the_kernel_are_declined() -> None:
    assert not PagedDecodeKernel.supports(8, 3, 32)  # heads not a multiple of kv heads
    assert not PagedDecodeKernel.supports(8, 8, 1024)  # head_dim past the kernel's bound
    assert not PagedDecodeKernel.supports(128, 128, 128)  # heads x head_dim past its accumulator
    q, k_cache, v_cache, tables, context = _case(8, 4, 32, 16, [5, 6], 3)
    with pytest.raises(ValueError, match="refused"):
        _kernel().attend(q, k_cache, v_cache, tables, torch.tensor([5, 0]))  # an empty context
    with pytest.raises(ValueError, match="int64"):
        _kernel().attend(q, k_cache, v_cache, tables.int(), context)


def test_a_build_is_cached_per_source_and_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MIXGATE_KERNEL_CACHE", str(tmp_path))
    source = Path(native_build.__file__).with_name("paged_decode_attention.c")
    native_build.load_kernel(source)
    built = sorted(tmp_path.glob("paged_decode_attention-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    native_build.load_kernel(source)  # a second process finds it: no rebuild
    assert sorted(tmp_path.glob("*.so")) == built and built[0].stat().st_mtime_ns == stamp
    assert not list(tmp_path.glob(".build-*")), "the build's scratch folder was left behind"
    edited = tmp_path / "paged_decode_attention.c"
    edited.write_text(source.read_text() + "\n/* edited */\n")
    native_build.load_kernel(edited)  # another source: another library, the first one kept
    assert len(list(tmp_path.glob("paged_decode_attention-*.so"))) == 2


def test_an_unwritable_cache_is_a_build_error_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A file where the cache folder should be: the build cannot write there.
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("MIXGATE_KERNEL_CACHE", str(blocker / "kernels"))
    source = Path(native_build.__file__).with_name("paged_decode_attention.c")
    with pytest.raises(native_build.KernelBuildError, match="could not write"):
        native_build.load_kernel(source)


@pytest.mark.usefixtures("without_compiler")
def test_without_a_compiler_the_runner_keeps_gather_and_sdpa(tiny_model_dir: Path) -> None:
    source = Path(native_build.__file__).with_name("paged_decode_attention.c")
    with pytest.raises(native_build.KernelBuildError):
        native_build.load_kernel(source)
    model, _ = load_model(tiny_model_dir, torch.float32, torch.device("cpu"))
    runner = ModelRunner(model, 64, 4, torch.float32, torch.device("cpu"), seed=0)
    assert runner.decode_kernel is None


def test_the_runner_takes_the_kernel_for_fp32_and_bf16_on_cpu(tiny_model_dir: Path) -> None:
    cpu = torch.device("cpu")
    model, _ = load_model(tiny_model_dir, torch.float32, cpu)
    assert ModelRunner(model, 64, 4, torch.float32, cpu, seed=0).decode_kernel is not None
    without = ModelRunner(model, 64, 4, torch.float32, cpu, seed=0, paged_kernel=False)
    assert without.decode_kernel is None
    model16, _ = load_model(tiny_model_dir, torch.bfloat16, cpu)
    assert ModelRunner(model16, 64, 4, torch.bfloat16, cpu, seed=0).decode_kernel is not None
    model_half, _ = load_model(tiny_model_dir, torch.float16, cpu)
    assert ModelRunner(model_half, 64, 4, torch.float16, cpu, seed=0).decode_kernel is None
