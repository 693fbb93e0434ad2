"""Write a randomly initialised Llama (or Mixtral) checkpoint in Hugging Face's folder layout.

The folder (config, generation config, tokenizer, safetensors weights) loads in transformers,
vLLM and our own engine, so benchmarks compare executors on identical weights without a
download. Weights come from one seeded generator in a fixed order: the same seed gives
byte-identical files on any machine with the same torch version.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from engine.model.presets import PRESET_NAMES, ModelPreset, get_preset
from engine.text.tokenizer_builder import write_tokenizer

__all__ = ["PRESET_NAMES", "SAFETENSORS_INDEX", "make_model", "random_state_dict", "split_shards"]

SAFETENSORS_INDEX = "model.safetensors.index.json"
_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _tensor_shapes(preset: ModelPreset) -> list[tuple[str, tuple[int, ...]]]:
    """HF names and shapes, in the order HF's state_dict lists them (the shard order too)."""
    h, d = preset.hidden_size, preset.head_dim
    q_out, kv_out = preset.num_attention_heads * d, preset.num_key_value_heads * d
    shapes: list[tuple[str, tuple[int, ...]]] = [
        ("model.embed_tokens.weight", (preset.vocab_size, h))
    ]
    for layer in range(preset.num_hidden_layers):
        prefix = f"model.layers.{layer}"
        shapes += [
            (f"{prefix}.self_attn.q_proj.weight", (q_out, h)),
            (f"{prefix}.self_attn.k_proj.weight", (kv_out, h)),
            (f"{prefix}.self_attn.v_proj.weight", (kv_out, h)),
            (f"{prefix}.self_attn.o_proj.weight", (h, q_out)),
            *_mlp_shapes(preset, prefix),
            (f"{prefix}.input_layernorm.weight", (h,)),
            (f"{prefix}.post_attention_layernorm.weight", (h,)),
        ]
    shapes.append(("model.norm.weight", (h,)))
    if not preset.tie_word_embeddings:
        shapes.append(("lm_head.weight", (preset.vocab_size, h)))
    return shapes


def _mlp_shapes(preset: ModelPreset, prefix: str) -> list[tuple[str, tuple[int, ...]]]:
    h, i = preset.hidden_size, preset.intermediate_size
    if not preset.is_moe:
        return [
            (f"{prefix}.mlp.gate_proj.weight", (i, h)),
            (f"{prefix}.mlp.up_proj.weight", (i, h)),
            (f"{prefix}.mlp.down_proj.weight", (h, i)),
        ]
    # Mixtral's checkpoint layout (as on the Hub): a router, then w1 (gate), w2 (down) and
    # w3 (up) per expert. transformers 5 fuses the experts when it loads them; we stack them.
    moe = f"{prefix}.block_sparse_moe"
    shapes: list[tuple[str, tuple[int, ...]]] = [
        (f"{moe}.gate.weight", (preset.num_local_experts, h))
    ]
    for expert in range(preset.num_local_experts):
        shapes += [
            (f"{moe}.experts.{expert}.w1.weight", (i, h)),
            (f"{moe}.experts.{expert}.w2.weight", (h, i)),
            (f"{moe}.experts.{expert}.w3.weight", (i, h)),
        ]
    return shapes


def random_state_dict(
    preset: ModelPreset, seed: int, dtype: str, draw_device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """Seeded weights: N(0, initializer_range) matrices, RMSNorm weights of ones.

    `draw_device`: where the numbers are drawn (the tensors come back on the CPU). NOTE: CPU
    draws are one generator on one core (~35 s for the `8b` preset's 7 B numbers); a CUDA
    generator draws them in well under a second, but its numbers differ from the CPU's for the
    same seed, so a folder is reproducible per draw device, not across them.
    """
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {tuple(_DTYPES)}, got {dtype!r}")
    device = torch.device(draw_device)
    generator = torch.Generator(device=device).manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name, shape in _tensor_shapes(preset):
        if name.endswith("norm.weight"):
            tensor = torch.ones(shape, dtype=torch.float32, device=device)
        else:
            tensor = torch.empty(shape, dtype=torch.float32, device=device)
            tensor.normal_(mean=0.0, std=preset.initializer_range, generator=generator)
        # NOTE: always drawn in float32 and cast after, so a bf16 model is the fp32 one rounded.
        state[name] = tensor.to(_DTYPES[dtype]).contiguous().cpu()
    return state


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def split_shards(
    state: dict[str, torch.Tensor], max_shard_bytes: int
) -> list[dict[str, torch.Tensor]]:
    """Greedy split in key order, as huggingface_hub's split_torch_state_dict_into_shards."""
    shards: list[dict[str, torch.Tensor]] = []
    current: dict[str, torch.Tensor] = {}
    current_bytes = 0
    for name, tensor in state.items():
        size = _nbytes(tensor)
        if size > max_shard_bytes:
            # A tensor over the limit gets a shard to itself (HF appends it right away).
            shards.append({name: tensor})
            continue
        if current_bytes + size > max_shard_bytes:
            shards.append(current)
            current, current_bytes = {}, 0
        current[name] = tensor
        current_bytes += size
    if current:
        shards.append(current)
    return shards


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _save(tensors: dict[str, torch.Tensor], path: Path) -> None:
    save_file(tensors, str(path), metadata={"format": "pt"})
    # safetensors writes through a private temp file (mode 0600); a server running as another
    # user (a vLLM container) must be able to read the weights like the JSON files beside them.
    path.chmod(0o644)


def _write_weights(out: Path, state: dict[str, torch.Tensor], max_shard_bytes: int | None) -> None:
    total_bytes = sum(_nbytes(t) for t in state.values())
    if max_shard_bytes is None or total_bytes <= max_shard_bytes:
        _save(state, out / "model.safetensors")
        return
    shards = split_shards(state, max_shard_bytes)
    weight_map: dict[str, str] = {}
    for index, shard in enumerate(shards, start=1):
        filename = f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        _save(shard, out / filename)
        weight_map.update(dict.fromkeys(shard, filename))
    _write_json(
        out / SAFETENSORS_INDEX,
        {"metadata": {"total_size": total_bytes}, "weight_map": weight_map},
    )


def _remove_stale_weights(out: Path) -> None:
    # Rewriting a folder with a different shard count must not leave old shards behind:
    # loaders trust the index or glob for *.safetensors.
    for path in out.glob("model*.safetensors"):
        path.unlink()
    (out / SAFETENSORS_INDEX).unlink(missing_ok=True)


def make_model(
    out_dir: str | Path,
    preset: str,
    seed: int = 0,
    dtype: str = "float32",
    max_shard_bytes: int | None = None,
    draw_device: str = "cpu",
) -> Path:
    """Write config, generation config, tokenizer and seeded weights of `preset` into out_dir."""
    spec = get_preset(preset)
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {tuple(_DTYPES)}, got {dtype!r}")
    if not 0 <= seed < 2**63:
        raise ValueError("seed must be a non-negative 63-bit integer")
    if max_shard_bytes is not None and max_shard_bytes <= 0:
        raise ValueError("max_shard_bytes must be positive")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = write_tokenizer(out, model_max_length=spec.max_position_embeddings)
    if tokenizer.vocab_size != spec.vocab_size:
        raise ValueError("the preset's vocab_size must equal the tokenizer's")
    config = spec.to_config_dict(
        dtype=dtype, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    _write_json(out / "config.json", config)
    _write_json(
        out / "generation_config.json",
        {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id},
    )
    _remove_stale_weights(out)
    _write_weights(out, random_state_dict(spec, seed, dtype, draw_device), max_shard_bytes)
    return out
