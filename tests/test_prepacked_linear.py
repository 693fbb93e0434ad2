"""oneDNN-prepacked linears: the engine uses them on CPU unless told not to, and they compute
what torch's own linears compute (fp32 to rounding)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.prepacked_linear import PrepackedLinear, prepacking_supported

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
