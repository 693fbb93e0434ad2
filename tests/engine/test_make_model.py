from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from engine.model.config import ModelConfig
from engine.model.make_model import (
    PRESET_NAMES,
    SAFETENSORS_INDEX,
    make_model,
    split_shards,
)
from engine.model.presets import PRESETS, ModelPreset, get_preset
from engine.text.tokenizer_builder import IM_END, VOCAB_SIZE, special_token_id
from tests.dependencies import require_module

# Expected parameter ranges per preset (the name promises a size; keep it honest).
PARAM_RANGES = {
    "tiny": (50_000, 200_000),
    "small": (3_000_000, 5_000_000),
    "100m": (100e6, 130e6),
    "tiny-moe": (150_000, 400_000),
    "moe-small": (100e6, 120e6),
    # Llama-3-8B's layers with the byte vocabulary (no 1.05 B-parameter embedding and head).
    "8b": (6.9e9, 7.1e9),
}


def _load_all(folder: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        state.update(load_file(path))
    return state


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("tiny"), "tiny", seed=0)


def test_preset_names_are_the_presets() -> None:
    assert PRESET_NAMES == ("tiny", "small", "100m", "8b", "tiny-moe", "moe-small")
    assert set(PRESETS) == set(PRESET_NAMES)
    with pytest.raises(ValueError, match="unknown preset"):
        get_preset("huge")


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_preset_param_count_in_range(name: str) -> None:
    preset = get_preset(name)
    config = ModelConfig.from_dict(
        preset.to_config_dict(dtype="float32", eos_token_id=258, pad_token_id=256)
    )
    low, high = PARAM_RANGES[name]
    assert low <= config.num_parameters() <= high
    assert config.vocab_size == VOCAB_SIZE


def test_preset_validation() -> None:
    with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
        ModelPreset("x", 64, 1, 4, 3, 128, 1024, 1e4)
    with pytest.raises(ValueError, match="hidden_size must be positive"):
        ModelPreset("x", 0, 1, 4, 2, 128, 1024, 1e4)
    with pytest.raises(ValueError, match="num_local_experts"):
        ModelPreset("x", 64, 1, 4, 2, 128, 1024, 1e4, architecture="MixtralForCausalLM")
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        ModelPreset("x", 64, 1, 4, 2, 128, 1024, 1e4, architecture="MixtralForCausalLM",
                    num_local_experts=4, num_experts_per_tok=5)  # fmt: skip
    with pytest.raises(ValueError, match="num_local_experts"):
        ModelPreset("x", 64, 1, 4, 2, 128, 1024, 1e4, num_local_experts=4)


def test_moe_folder_has_mixtral_config_and_per_expert_tensors(tmp_path: Path) -> None:
    folder = make_model(tmp_path / "moe", "tiny-moe", seed=1)
    raw = json.loads((folder / "config.json").read_text())
    assert raw["architectures"] == ["MixtralForCausalLM"] and raw["model_type"] == "mixtral"
    assert (raw["num_local_experts"], raw["num_experts_per_tok"]) == (4, 2)
    assert raw["router_jitter_noise"] == 0.0
    config = ModelConfig.from_pretrained(folder)
    assert config.is_moe and config.num_active_parameters() < config.num_parameters()
    state = load_file(folder / "model.safetensors")
    assert sum(t.numel() for t in state.values()) == config.num_parameters()
    prefix = "model.layers.1.block_sparse_moe"
    assert state[f"{prefix}.gate.weight"].shape == (4, 64)
    assert state[f"{prefix}.experts.3.w1.weight"].shape == (128, 64)
    assert state[f"{prefix}.experts.3.w2.weight"].shape == (64, 128)
    assert state[f"{prefix}.experts.3.w3.weight"].shape == (128, 64)
    assert not any(".mlp." in name for name in state)


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_written_folder_reads_back(name: str, tmp_path: Path) -> None:
    folder = make_model(tmp_path / name, name, seed=1)
    config = ModelConfig.from_pretrained(folder)
    preset = get_preset(name)
    assert config.architecture == "LlamaForCausalLM"
    assert config.hidden_size == preset.hidden_size
    assert config.num_key_value_heads == preset.num_key_value_heads
    assert config.head_dim == preset.hidden_size // preset.num_attention_heads
    assert config.eos_token_ids == (special_token_id(IM_END),)
    assert config.bos_token_id is None
    assert config.torch_dtype == "float32"
    state = load_file(folder / "model.safetensors")
    assert sum(t.numel() for t in state.values()) == config.num_parameters()
    assert not (folder / SAFETENSORS_INDEX).exists()
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["eos_token_id"] == special_token_id(IM_END)


def test_weights_follow_the_init(tiny_dir: Path) -> None:
    state = load_file(tiny_dir / "model.safetensors")
    assert torch.equal(state["model.norm.weight"], torch.ones(64))
    assert torch.equal(state["model.layers.1.input_layernorm.weight"], torch.ones(64))
    embed = state["model.embed_tokens.weight"]
    assert embed.shape == (VOCAB_SIZE, 64)
    assert abs(embed.std().item() - 0.02) < 0.002
    assert state["model.layers.0.self_attn.k_proj.weight"].shape == (2 * 16, 64)
    assert not torch.equal(state["lm_head.weight"], embed)


def test_same_seed_same_bytes_other_seed_differs(tiny_dir: Path, tmp_path: Path) -> None:
    again = make_model(tmp_path / "again", "tiny", seed=0)
    other = make_model(tmp_path / "other", "tiny", seed=1)
    for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (again / name).read_bytes() == (tiny_dir / name).read_bytes()
    assert (other / "model.safetensors").read_bytes() != (
        tiny_dir / "model.safetensors"
    ).read_bytes()


def test_sharded_output_matches_unsharded(tiny_dir: Path, tmp_path: Path) -> None:
    max_shard_bytes = 100_000
    folder = make_model(tmp_path / "sharded", "tiny", seed=0, max_shard_bytes=max_shard_bytes)
    assert not (folder / "model.safetensors").exists()
    index = json.loads((folder / SAFETENSORS_INDEX).read_text())
    shards = sorted(folder.glob("model-*-of-*.safetensors"))
    assert len(shards) >= 2
    assert set(index["weight_map"].values()) == {p.name for p in shards}
    whole = load_file(tiny_dir / "model.safetensors")
    assert set(index["weight_map"]) == set(whole)
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in whole.values())
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            names = list(f.keys())
            shard_bytes = sum(f.get_tensor(n).numel() * 4 for n in names)
        assert all(index["weight_map"][n] == shard.name for n in names)
        # Only a tensor larger than the limit may make a shard exceed it, and it sits alone.
        assert shard_bytes <= max_shard_bytes or len(names) == 1
    loaded = _load_all(folder)
    assert all(torch.equal(loaded[name], tensor) for name, tensor in whole.items())


def test_split_puts_oversized_tensor_alone() -> None:
    state = {
        "a": torch.zeros(10),
        "big": torch.zeros(100),
        "b": torch.zeros(10),
        "c": torch.zeros(10),
    }
    shards = split_shards(state, max_shard_bytes=80)
    assert [list(s) for s in shards] == [["big"], ["a", "b"], ["c"]]


def test_resharding_removes_stale_files(tmp_path: Path) -> None:
    folder = make_model(tmp_path / "m", "tiny", max_shard_bytes=100_000)
    make_model(folder, "tiny")
    assert sorted(p.name for p in folder.glob("*.safetensors")) == ["model.safetensors"]
    assert not (folder / SAFETENSORS_INDEX).exists()


def test_bfloat16_is_the_rounded_float32(tiny_dir: Path, tmp_path: Path) -> None:
    folder = make_model(tmp_path / "bf16", "tiny", seed=0, dtype="bfloat16")
    assert ModelConfig.from_pretrained(folder).torch_dtype == "bfloat16"
    bf16 = load_file(folder / "model.safetensors")
    fp32 = load_file(tiny_dir / "model.safetensors")
    assert all(t.dtype == torch.bfloat16 for t in bf16.values())
    assert all(torch.equal(bf16[n], fp32[n].to(torch.bfloat16)) for n in fp32)


def test_bad_arguments_raise(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="dtype"):
        make_model(tmp_path, "tiny", dtype="float16")
    with pytest.raises(ValueError, match="max_shard_bytes"):
        make_model(tmp_path, "tiny", max_shard_bytes=0)
    with pytest.raises(ValueError, match="unknown preset"):
        make_model(tmp_path, "nope")


def test_transformers_loads_config_and_weights(tiny_dir: Path, tmp_path: Path) -> None:
    transformers = require_module("transformers")
    config = transformers.AutoConfig.from_pretrained(tiny_dir)
    assert config.model_type == "llama"
    assert config.num_key_value_heads == 2
    assert config.vocab_size == VOCAB_SIZE
    sharded = make_model(tmp_path / "sharded", "tiny", max_shard_bytes=100_000)
    for folder in (tiny_dir, sharded):
        model, info = transformers.LlamaForCausalLM.from_pretrained(
            folder, output_loading_info=True
        )
        assert not info["missing_keys"]
        assert not info["unexpected_keys"]
        assert not info["mismatched_keys"]
        expected = load_file(tiny_dir / "model.safetensors")["model.layers.0.mlp.up_proj.weight"]
        assert torch.equal(model.model.layers[0].mlp.up_proj.weight.detach(), expected)
        logits = model(torch.tensor([[1, 2, 3]])).logits
        assert logits.shape == (1, 3, VOCAB_SIZE)
