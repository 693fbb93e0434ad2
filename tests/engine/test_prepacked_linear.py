"""oneDNN-prepacked linears: the engine uses them on CPU unless told not to, and they compute
what torch's own linears compute (fp32 to rounding)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.model.prepacked_linear import (
    PrepackedLinear,
    bucketed_rows,
    prepacking_supported,
    warm_row_buckets,
)
from tests.engine.test_engine_exactness import run_greedy

PROMPT = [5, 17, 99, 3, 250, 41, 8, 8, 120, 64, 7]


def _engine(model_dir: Path, prepack: bool) -> LLMEngine:
    config = EngineConfig(
        max_active_seqs=2, num_kv_blocks=16, device="cpu", dtype="float32", prepack_linears=prepack
    )
    return LLMEngine(model_dir, config)


def _kinds(model: nn.Module) -> tuple[int, int]:
    linears = sum(isinstance(m, nn.Linear) for m in model.modules())
    return linears, sum(isinstance(m, PrepackedLinear) for m in model.modules())


@pytest.mark.skipif(
    not prepacking_supported(torch.device("cpu"), torch.float32), reason="no oneDNN here"
)
def test_prepacked_on_by_default_and_off_when_asked(tiny_model_dir: Path) -> None:
    packed, plain = _engine(tiny_model_dir, True), _engine(tiny_model_dir, False)
    layers = packed.model_config.num_hidden_layers
    # qkv, o, gate_up, down per layer, and lm_head.
    assert _kinds(packed.runner.model) == (0, 4 * layers + 1)
    assert _kinds(plain.runner.model) == (4 * layers + 1, 0)
    with torch.inference_mode():
        ours = packed.runner.model.dense_logits(PROMPT)
        reference = plain.runner.model.dense_logits(PROMPT)
    error = float((ours - reference).norm() / reference.norm())
    assert error < 1e-5
    assert torch.equal(ours.argmax(-1), reference.argmax(-1))


def test_not_supported_off_cpu() -> None:
    assert not prepacking_supported(torch.device("cuda"), torch.float32)
    assert not prepacking_supported(torch.device("cpu"), torch.int8)


def test_row_counts_are_bucketed_so_onednn_sees_few_shapes() -> None:
    """oneDNN caches a primitive per row count (~0.6 MB each): a step budget's every count
    would grow the engine's RSS by hundreds of MiB, so counts above 16 are padded to 16s."""
    seen = {bucketed_rows(rows) for rows in range(1, 545)}
    assert len(seen) == 16 + (544 - 16) // 16
    assert all(bucketed_rows(r) >= r and bucketed_rows(r) - r < 16 for r in range(1, 545))
    assert [bucketed_rows(r) for r in (1, 16, 17, 32, 33)] == [1, 16, 32, 32, 48]


@pytest.mark.skipif(
    not prepacking_supported(torch.device("cpu"), torch.float32), reason="no oneDNN here"
)
@pytest.mark.parametrize("rows", [1, 7, 16, 17, 31, 33, 100])
def test_padded_rows_do_not_change_the_real_rows(rows: int) -> None:
    torch.manual_seed(rows)
    linear = nn.Linear(64, 96, bias=True)
    packed = PrepackedLinear(linear)
    x = torch.randn(rows, 64)
    out = packed(x)
    assert out.shape == (rows, 96)
    torch.testing.assert_close(out, linear(x), rtol=1e-5, atol=1e-5)
    # Leading dimensions other than rows are kept.
    assert packed(x.reshape(1, rows, 64)).shape == (1, rows, 96)


@pytest.mark.skipif(
    not prepacking_supported(torch.device("cpu"), torch.float32), reason="no oneDNN here"
)
def test_warming_runs_each_weight_shape_once_per_onednn_row_bucket(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir, True)
    linears = [m for m in engine.runner.model.modules() if isinstance(m, PrepackedLinear)]
    shapes = {(m.in_features, m.out_features, m.bias is not None) for m in linears}
    buckets = {bucketed_rows(rows) for rows in range(1, 201)}
    one_per_shape = {(m.in_features, m.out_features, m.bias is not None): m for m in linears}
    expected = sum(
        len([b for b in buckets if not (m.skinny is not None and b <= m.skinny.max_rows)])
        for m in one_per_shape.values()
    )
    assert len(shapes) < len(linears)  # one per shape, not one per linear
    assert expected > 0  # past the kernel's bound: oneDNN's row buckets
    assert warm_row_buckets(engine.runner.model, 200) == expected


def test_a_prewarmed_engine_gives_the_same_tokens(tiny_model_dir: Path) -> None:
    def greedy(prewarm: bool) -> list[int]:
        config = EngineConfig(
            max_active_seqs=2, num_kv_blocks=16, device="cpu", dtype="float32", prewarm=prewarm
        )
        engine = LLMEngine(tiny_model_dir, config)
        if prewarm:
            engine.runner.wait_kv_cache_committed()
        outputs, _ = run_greedy(engine, [PROMPT, PROMPT[3:]], 12)
        return outputs["r0"] + outputs["r1"]

    assert greedy(True) == greedy(False)
