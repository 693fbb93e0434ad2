"""ModelShape from config.json: parameter counts checked against published totals and the
engine's own count, KV bytes per token by hand, MoE fields for Mixtral and Qwen-MoE."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.model.config import ModelConfig
from engine.model.presets import PRESETS
from planning.model_shape_from_config import shape_from_hf_config

CONFIGS = Path(__file__).resolve().parents[2] / "bench" / "configs"


def _config(name: str) -> dict[str, object]:
    loaded: dict[str, object] = json.loads((CONFIGS / f"{name}.json").read_text())
    return loaded


def test_llama_3_8b_matches_its_published_parameter_count() -> None:
    shape = shape_from_hf_config(_config("llama-3-8b"), dtype_bytes=2)
    # Meta-Llama-3-8B on the Hugging Face Hub: 8,030,261,248 parameters.
    assert shape.num_parameters == 8_030_261_248
    assert shape.weight_bytes == 2 * 8_030_261_248
    # 2 (K, V) · 32 layers · 8 KV heads · 128 dims · 2 bytes = 131 072 bytes per token.
    assert shape.kv_bytes_per_token == 131_072
    assert shape.attention_flops_per_query_key == 4 * 32 * 32 * 128
    assert not shape.is_moe
    # An fp8 KV cache halves the cache, not the weights.
    fp8_kv = shape_from_hf_config(_config("llama-3-8b"), dtype_bytes=2, kv_dtype_bytes=1)
    assert (fp8_kv.kv_bytes_per_token, fp8_kv.weight_bytes) == (65_536, shape.weight_bytes)


def test_llama_3_70b_parameter_count() -> None:
    # Meta-Llama-3-70B: 70,553,706,496 parameters.
    assert shape_from_hf_config(_config("llama-3-70b"), 2).num_parameters == 70_553_706_496


def test_mixtral_counts_every_expert_and_computes_with_two() -> None:
    shape = shape_from_hf_config(_config("mixtral-8x7b"), dtype_bytes=2)
    # Mixtral-8x7B: 46,702,792,704 parameters in all.
    assert shape.num_parameters == 46_702_792_704
    assert (shape.num_experts, shape.experts_per_token) == (8, 2)
    # Experts: 32 layers · 8 · 3 · 4096 · 14336.
    assert shape.expert_parameters == 32 * 8 * 3 * 4096 * 14336
    # Active: all but 6 of 8 experts: 12.88 B (Mistral quotes "12.9B active").
    assert shape.active_parameters == pytest.approx(12_879_925_248)


def test_qwen_moe_shared_expert_is_dense_and_routed_experts_are_not() -> None:
    # Qwen1.5-MoE-A2.7B: 60 routed experts of 1408, 4 per token, a shared expert of 5632.
    raw = {
        "architectures": ["Qwen2MoeForCausalLM"],
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "vocab_size": 151936,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "tie_word_embeddings": False,
    }
    shape = shape_from_hf_config(raw, dtype_bytes=2)
    # Published: 14.3 B in all, 2.7 B activated (Qwen's model card).
    assert shape.num_parameters == pytest.approx(14.3e9, rel=0.01)
    assert shape.active_parameters == pytest.approx(2.7e9, rel=0.03)
    assert shape.expert_parameters == 24 * 60 * 3 * 2048 * 1408
    # Two layers made dense by mlp_only_layers: fewer routed experts, more dense MLP.
    fewer = shape_from_hf_config({**raw, "mlp_only_layers": [0, 1]}, dtype_bytes=2)
    assert fewer.expert_parameters == 22 * 60 * 3 * 2048 * 1408


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_agree_with_the_engines_count(name: str) -> None:
    raw = PRESETS[name].to_config_dict(dtype="float32", eos_token_id=0, pad_token_id=None)
    shape = shape_from_hf_config(raw, dtype_bytes=4)
    engine_config = ModelConfig.from_dict(raw)
    assert shape.num_parameters == engine_config.num_parameters()
    assert shape.kv_bytes_per_token == 4 * engine_config.kv_bytes_per_token_per_byte_dtype


def test_tied_embeddings_are_counted_once() -> None:
    raw = {**_config("llama-3-8b"), "tie_word_embeddings": True}
    assert shape_from_hf_config(raw, 2).num_parameters == 8_030_261_248 - 128256 * 4096


@pytest.mark.parametrize(
    "raw",
    [
        {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4},  # no vocab
        {**_config("llama-3-8b"), "n_routed_experts": 64},  # an MoE layout it cannot read
        {**_config("llama-3-8b"), "num_experts": 8, "num_experts_per_tok": 2},  # no expert size
        {**_config("mixtral-8x7b"), "num_experts_per_tok": 9},
        {**_config("llama-3-8b"), "hidden_size": "big"},
    ],
)
def test_unreadable_configs_raise(raw: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        shape_from_hf_config(raw, 2)
