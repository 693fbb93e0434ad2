"""Loading Hugging Face safetensors checkpoints (single file or sharded) into LlamaModel."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from engine.model import Attention, LlamaModel
from engine.model_config import ModelConfig
from engine.rotary import RotaryEmbedding

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def checkpoint_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return sorted({model_dir / name for name in weight_map.values()})
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir}")
    return files


def _fused_name(name: str) -> tuple[str, int | None]:
    """Map a HF tensor name to ours, and the part index inside a fused tensor."""
    for part, proj in enumerate(("q_proj", "k_proj", "v_proj")):
        if f".self_attn.{proj}." in name:
            return name.replace(f".self_attn.{proj}.", ".self_attn.qkv_proj."), part
    for part, proj in enumerate(("gate_proj", "up_proj")):
        if f".mlp.{proj}." in name:
            return name.replace(f".mlp.{proj}.", ".mlp.gate_up_proj."), part
    return name, None


def load_model(
    model_dir: str | Path, dtype: torch.dtype, device: torch.device
) -> tuple[LlamaModel, ModelConfig]:
    model_dir = Path(model_dir)
    config = ModelConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = LlamaModel(config)
    model = model.to_empty(device=device).to(dtype)
    # Rotary tables are buffers computed at init; meta init left them empty: rebuild them.
    rotary = RotaryEmbedding(
        config.head_dim, config.max_position_embeddings, config.rope_theta, config.rope_scaling
    ).to(device)
    for module in model.modules():
        if isinstance(module, Attention):
            module.rotary = rotary
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    params = dict(model.named_parameters())
    parts: dict[str, dict[int, torch.Tensor]] = {}
    loaded: set[str] = set()
    for file in checkpoint_files(model_dir):
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for hf_name in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                name, part = _fused_name(hf_name.removeprefix("model."))
                if name == "lm_head.weight" and config.tie_word_embeddings:
                    continue
                if name not in params:
                    raise ValueError(f"unexpected tensor {hf_name} in {file.name}")
                tensor = handle.get_tensor(hf_name)
                if part is None:
                    _copy(params[name], tensor, hf_name)
                    loaded.add(name)
                else:
                    parts.setdefault(name, {})[part] = tensor
    for name, pieces in parts.items():
        _copy(params[name], torch.cat([pieces[i] for i in sorted(pieces)], dim=0), name)
        loaded.add(name)
    missing = set(params) - loaded - ({"lm_head.weight"} if config.tie_word_embeddings else set())
    if missing:
        raise ValueError(f"checkpoint is missing tensors: {sorted(missing)[:5]}")
    model.eval()
    return model, config


def _copy(param: torch.nn.Parameter, tensor: torch.Tensor, name: str) -> None:
    if param.shape != tensor.shape:
        raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != {tuple(param.shape)}")
    with torch.no_grad():
        param.copy_(tensor.to(param.dtype))
