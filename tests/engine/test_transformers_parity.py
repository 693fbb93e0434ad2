"""Our model's logits against transformers' reference implementations, on the same folders.

Each folder is a `make_model` checkpoint, edited where needed into a Qwen2, Mistral or
Llama-3-rope-scaled variant; transformers loads it with its own class and eager attention.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.model.make_model import SAFETENSORS_INDEX, make_model
from engine.model.transformer import LlamaModel
from engine.model.weights import load_model
from tests.dependencies import require_module

transformers = require_module("transformers")

CPU = torch.device("cpu")
# Prompts of different lengths (1 token, a short one, and one past the llama3 rope's
# original context below, so scaled frequencies matter).
PROMPTS = (
    [72],
    [72, 101, 108, 108, 111, 44, 32, 119],
    [(i * 37 + 11) % 256 for i in range(150)],
)
# fp32 against fp32: the same math in a different order.
FP32_REL_TOL = 1e-4
# NOTE: bf16 keeps 8 mantissa bits (relative rounding ~4e-3 per weight and per activation);
# over 2 layers the logits drift by about 0.5% of their range, so 5% is loose but still
# catches a wrong cast, a missing tensor or a scrambled fused projection.
BF16_REL_TOL = 5e-2

ConfigEdit = Callable[[dict[str, Any]], None]


def _relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours - theirs).abs().max() / theirs.abs().max())


def _ours(folder: Path, dtype: torch.dtype = torch.float32) -> LlamaModel:
    model, _ = load_model(folder, dtype, CPU)
    return model


def _theirs(folder: Path, cls_name: str) -> Any:
    cls = getattr(transformers, cls_name)
    model = cls.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    return model.eval()


@torch.inference_mode()
def _hf_logits(model: Any, token_ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([token_ids])).logits[0].float()


def _assert_parity(ours: LlamaModel, theirs: Any) -> None:
    for prompt in PROMPTS:
        mine = ours.dense_logits(prompt)
        reference = _hf_logits(theirs, prompt)
        assert mine.shape == reference.shape == (len(prompt), 259)
        error = _relative_error(mine, reference)
        assert error < FP32_REL_TOL, f"prompt of {len(prompt)} tokens: relative error {error}"


def _variant(base: Path, dest: Path, edit: ConfigEdit) -> Path:
    shutil.copytree(base, dest)
    path = dest / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))
    return dest


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("parity-base"), "tiny", seed=3)


def test_llama_matches_transformers(base_dir: Path) -> None:
    _assert_parity(_ours(base_dir), _theirs(base_dir, "LlamaForCausalLM"))


def _to_qwen2(config: dict[str, Any]) -> None:
    config.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2")
    config.pop("attention_bias", None)
    config.pop("mlp_bias", None)


def _add_qkv_biases(folder: Path, num_layers: int) -> None:
    path = folder / "model.safetensors"
    state = load_file(path)
    generator = torch.Generator().manual_seed(11)
    for layer in range(num_layers):
        prefix = f"model.layers.{layer}.self_attn"
        for proj in ("q_proj", "k_proj", "v_proj"):
            rows = state[f"{prefix}.{proj}.weight"].shape[0]
            # Large enough (vs weights of std 0.02) to move the logits visibly.
            state[f"{prefix}.{proj}.bias"] = torch.randn(rows, generator=generator) * 0.5
    save_file(state, str(path), metadata={"format": "pt"})


def test_qwen2_with_qkv_biases_matches_transformers(base_dir: Path, tmp_path: Path) -> None:
    folder = _variant(base_dir, tmp_path / "qwen2", _to_qwen2)
    _add_qkv_biases(folder, num_layers=2)
    ours = _ours(folder)
    assert ours.layers[0].self_attn.qkv_proj.bias is not None
    _assert_parity(ours, _theirs(folder, "Qwen2ForCausalLM"))
    # The biases were loaded and matter: without them the logits are different.
    prompt = PROMPTS[1]
    assert _relative_error(ours.dense_logits(prompt), _ours(base_dir).dense_logits(prompt)) > 1e-2


def _to_mistral(config: dict[str, Any]) -> None:
    config.update(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=None)


def test_mistral_matches_transformers(base_dir: Path, tmp_path: Path) -> None:
    folder = _variant(base_dir, tmp_path / "mistral", _to_mistral)
    ours = _ours(folder)
    assert ours.config.architecture == "MistralForCausalLM"
    assert ours.config.sliding_window is None
    _assert_parity(ours, _theirs(folder, "MistralForCausalLM"))


def _llama3_rope(config: dict[str, Any]) -> None:
    # A short original context so the tiny model's 16-dim heads have low, medium and high
    # frequency bands (wavelengths from 6 to ~20k positions) and all three code paths run.
    config["rope_scaling"] = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }


def test_llama3_rope_scaling_matches_transformers(base_dir: Path, tmp_path: Path) -> None:
    folder = _variant(base_dir, tmp_path / "llama3-rope", _llama3_rope)
    ours = _ours(folder)
    _assert_parity(ours, _theirs(folder, "LlamaForCausalLM"))
    # The scaling is not a no-op on the long prompt: unscaled rope gives other logits.
    long_prompt = PROMPTS[2]
    unscaled = _ours(base_dir).dense_logits(long_prompt)
    assert _relative_error(ours.dense_logits(long_prompt), unscaled) > 1e-3


def test_sharded_checkpoint_loads_to_the_same_logits(base_dir: Path, tmp_path: Path) -> None:
    sharded = make_model(tmp_path / "sharded", "tiny", seed=3, max_shard_bytes=40_000)
    assert (sharded / SAFETENSORS_INDEX).is_file()
    assert len(list(sharded.glob("model-*.safetensors"))) > 2
    assert not (sharded / "model.safetensors").exists()
    single, split = _ours(base_dir), _ours(sharded)
    for prompt in PROMPTS:
        assert torch.equal(single.dense_logits(prompt), split.dense_logits(prompt))


def test_bf16_weights_give_finite_logits_close_to_fp32(base_dir: Path, tmp_path: Path) -> None:
    bf16_dir = make_model(tmp_path / "bf16", "tiny", seed=3, dtype="bfloat16")
    model = _ours(bf16_dir, torch.bfloat16)
    assert model.embed_tokens.weight.dtype == torch.bfloat16
    reference = _ours(base_dir)
    for prompt in PROMPTS:
        logits = model.dense_logits(prompt)
        assert logits.dtype == torch.float32  # compute_logits upcasts for sampling
        assert torch.isfinite(logits).all()
        error = _relative_error(logits, reference.dense_logits(prompt))
        assert 0 < error < BF16_REL_TOL, f"prompt of {len(prompt)} tokens: {error}"
