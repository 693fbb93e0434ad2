"""The MoE block on its own: transformers' routing math, grouping tokens by expert (only the
picked experts run), the batched block against a token-by-token reference, parameter counts."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.model.config import ModelConfig
from engine.model.make_model import make_model
from engine.model.moe import SparseMoeBlock, group_by_expert, route, touched_experts
from engine.model.presets import get_preset
from engine.model.weights import load_model


def _config(preset: str) -> ModelConfig:
    raw = get_preset(preset).to_config_dict(dtype="float32", eos_token_id=258, pad_token_id=256)
    return ModelConfig.from_dict(raw)


def _random_block(seed: int) -> SparseMoeBlock:
    block = SparseMoeBlock(_config("tiny-moe"))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in block.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    return block


def test_route_is_softmax_top_k_renormalised_in_fp32() -> None:
    logits = torch.randn(5, 6, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    weights, experts = route(logits, top_k=2)
    assert weights.dtype == torch.float32 and experts.shape == (5, 2)
    probs = torch.softmax(logits.float(), dim=-1)
    for token in range(5):
        ranked = probs[token].argsort(descending=True)[:2]
        assert experts[token].tolist() == ranked.tolist()
        expected = probs[token, ranked] / probs[token, ranked].sum()
        assert torch.allclose(weights[token], expected)
    assert torch.allclose(weights.sum(dim=-1), torch.ones(5))


def test_touched_experts_is_the_union_of_each_tokens_top_k() -> None:
    # Token 0 prefers experts 0 and 1, token 1 experts 1 and 2: expert 3 (and 4) is never read.
    logits = torch.tensor([[5.0, 4.0, 0.0, -1.0, -2.0], [0.0, 5.0, 4.0, -1.0, -2.0]])
    assert touched_experts(logits, top_k=2) == [0, 1, 2]
    assert touched_experts(logits[:1], top_k=2) == [0, 1]
    groups = group_by_expert(logits, top_k=2)
    assert groups.expert_ids == [0, 1, 2]
    # Each expert's run holds exactly the tokens that picked it.
    runs = [groups.tokens[start:end].tolist() for start, end in groups.bounds]
    assert runs == [[0], [0, 1], [1]]


def test_only_the_picked_experts_are_computed() -> None:
    block = _random_block(seed=1)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(2))
    picked = touched_experts(block.gate(x).detach(), block.top_k)
    unpicked = sorted(set(range(block.num_experts)) - set(picked))
    assert unpicked, "the seed was chosen so that some expert is left out"
    with torch.no_grad():
        # NaN weights poison any output they touch (NaN x 0 is NaN): running an unpicked
        # expert, even with a zero routing weight, would show.
        block.gate_up_proj[unpicked] = math.nan
        block.down_proj[unpicked] = math.nan
    block.touched_log = []
    with torch.inference_mode():
        out = block(x)
    assert torch.isfinite(out).all()
    assert block.touched_log == [len(picked)]


def _per_token_reference(block: SparseMoeBlock, x: torch.Tensor) -> torch.Tensor:
    """Each token alone: its top-k experts' SwiGLU outputs, weighted and summed."""
    size = block.down_proj.shape[2]
    rows = []
    for token in x:
        weights, experts = route(block.gate(token[None]), block.top_k)
        total = torch.zeros_like(token)
        for weight, expert in zip(weights[0], experts[0].tolist(), strict=True):
            w13 = block.gate_up_proj[expert]
            hidden = torch.nn.functional.silu(w13[:size] @ token) * (w13[size:] @ token)
            total += weight * (block.down_proj[expert] @ hidden)
        rows.append(total)
    return torch.stack(rows)


def test_batched_block_equals_token_by_token() -> None:
    block = _random_block(seed=3)
    x = torch.randn(40, 64, generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        block.touched_log = []
        batched = block(x)
        reference = _per_token_reference(block, x)
    # 40 tokens over 4 experts, top-2: every expert gets tokens, so every run is exercised.
    assert block.touched_log == [4]
    # fp32, the same products summed in another order: rounding only.
    relative_error = float((batched - reference).abs().max() / reference.abs().max())
    assert relative_error < 1e-5


def test_parameter_counts_match_the_written_weights(tmp_path: Path) -> None:
    folder = make_model(tmp_path / "moe", "tiny-moe", seed=0)
    config = ModelConfig.from_pretrained(folder)
    state = load_file(folder / "model.safetensors")
    assert config.num_parameters() == sum(t.numel() for t in state.values())
    experts, top_k = config.num_local_experts, config.num_experts_per_tok
    assert (experts, top_k) == (4, 2)
    unused = (experts - top_k) * config.expert_parameters * config.num_hidden_layers
    assert config.num_active_parameters() == config.num_parameters() - unused
    dense = _config("tiny")
    assert dense.num_active_parameters() == dense.num_parameters()
    assert not dense.is_moe and dense.num_local_experts == 0


def test_moe_small_has_the_promised_shape() -> None:
    config = _config("moe-small")
    assert config.architecture == "MixtralForCausalLM"
    assert 100e6 <= config.num_parameters() <= 120e6
    assert 25e6 <= config.num_active_parameters() <= 40e6


def test_config_validation() -> None:
    raw = get_preset("tiny-moe").to_config_dict(dtype="float32", eos_token_id=1, pad_token_id=0)
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        ModelConfig.from_dict({**raw, "num_experts_per_tok": 5})
    with pytest.raises(ValueError, match="num_local_experts"):
        ModelConfig.from_dict({**raw, "num_local_experts": 0})
    # Keys left out get MixtralConfig's defaults; transformers 5's rope_parameters is read.
    bare = {k: v for k, v in raw.items() if k not in ("num_experts_per_tok", "rope_theta")}
    config = ModelConfig.from_dict({**bare, "rope_parameters": {"rope_theta": 123.0}})
    assert config.num_experts_per_tok == 2 and config.rope_theta == 123.0


def test_a_checkpoint_missing_one_experts_half_does_not_load(tmp_path: Path) -> None:
    folder = make_model(tmp_path / "moe", "tiny-moe", seed=0)
    load_model(folder, torch.float32, torch.device("cpu"))  # complete: loads
    path = folder / "model.safetensors"
    state = load_file(path)
    del state["model.layers.1.block_sparse_moe.experts.2.w3.weight"]
    save_file(state, str(path), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing tensors: \['layers.1.mlp.gate_up_proj'\]"):
        load_model(folder, torch.float32, torch.device("cpu"))
