"""Loading Hugging Face safetensors checkpoints (single file or sharded) into LlamaModel.

Mixtral checkpoints keep one tensor per expert (`block_sparse_moe.experts.E.w1/w2/w3`); they
are copied into the stacked expert weights of `engine.model.moe.SparseMoeBlock` as they stream in.
transformers 5's own fused names (`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`) load too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import safe_open

from engine.model.config import ModelConfig
from engine.model.rotary import RotaryEmbedding
from engine.model.transformer import LlamaModel

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


# layers.N.block_sparse_moe.experts.E.wK.weight: w1 gate, w3 up (fused as gate_up), w2 down.
_EXPERT = re.compile(r"^(layers\.\d+)\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight$")
_EXPERT_TARGET = {"w1": ("gate_up_proj", 0), "w3": ("gate_up_proj", 1), "w2": ("down_proj", 0)}


def _expert_target(name: str) -> tuple[str, int, int] | None:
    """A per-expert Mixtral tensor's stacked parameter, expert index and half (0, or 1 = up)."""
    match = _EXPERT.match(name)
    if match is None:
        return None
    layer, expert, which = match.groups()
    param, half = _EXPERT_TARGET[which]
    return f"{layer}.mlp.{param}", int(expert), half


def _fused_name(name: str) -> tuple[str, int | None]:
    """Map a HF tensor name to ours, and the part index inside a fused tensor."""
    name = name.replace(".block_sparse_moe.gate.", ".mlp.gate.")
    name = name.replace(".mlp.experts.gate_up_proj", ".mlp.gate_up_proj")
    name = name.replace(".mlp.experts.down_proj", ".mlp.down_proj")
    for part, proj in enumerate(("q_proj", "k_proj", "v_proj")):
        if f".self_attn.{proj}." in name:
            return name.replace(f".self_attn.{proj}.", ".self_attn.qkv_proj."), part
    for part, proj in enumerate(("gate_proj", "up_proj")):
        if f".mlp.{proj}." in name:
            return name.replace(f".mlp.{proj}.", ".mlp.gate_up_proj."), part
    return name, None


# torch's modules that draw random initial values in their constructors (the only ones LlamaModel
# builds); every parameter they make is overwritten from the checkpoint.
_RANDOMLY_INITIALISED = (torch.nn.Linear, torch.nn.Embedding)


@contextmanager
def _without_random_init() -> Iterator[None]:
    """Skip nn.Linear's and nn.Embedding's reset_parameters while the model is built on meta.

    Random init on meta runs torch's Python reference decompositions, whose first use imports
    torch._dynamo: ~1.5 s of every engine start, for values the checkpoint replaces (transformers'
    `no_init_weights` skips init for the same reason).
    """
    saved = [(cls, cls.reset_parameters) for cls in _RANDOMLY_INITIALISED]
    for cls, _ in saved:
        cls.reset_parameters = _no_reset  # type: ignore[method-assign]
    try:
        yield
    finally:
        for cls, method in saved:
            cls.reset_parameters = method  # type: ignore[method-assign]


def _no_reset(self: torch.nn.Module) -> None:
    return None


def load_model(
    model_dir: str | Path, dtype: torch.dtype, device: torch.device
) -> tuple[LlamaModel, ModelConfig]:
    model_dir = Path(model_dir)
    config = ModelConfig.from_pretrained(model_dir)
    with torch.device("meta"), _without_random_init():
        model = LlamaModel(config)
    model = model.to_empty(device=device).to(dtype)
    # Rotary tables are buffers computed at init; meta init left them empty: rebuild them.
    model.rotary = RotaryEmbedding(
        config.head_dim, config.max_position_embeddings, config.rope_theta, config.rope_scaling
    ).to(device)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    params = dict(model.named_parameters())
    parts: dict[str, dict[int, torch.Tensor]] = {}
    loaded: set[str] = set()
    experts_loaded: dict[str, set[tuple[int, int]]] = {}
    for file in checkpoint_files(model_dir):
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for hf_name in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                expert = _expert_target(hf_name.removeprefix("model."))
                if expert is not None and expert[0] in params:
                    _copy_expert(params[expert[0]], expert[1:], handle.get_tensor(hf_name), hf_name)
                    experts_loaded.setdefault(expert[0], set()).add(expert[1:])
                    continue
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
    loaded |= _complete_expert_stacks(params, experts_loaded)
    missing = set(params) - loaded - ({"lm_head.weight"} if config.tie_word_embeddings else set())
    if missing:
        raise ValueError(f"checkpoint is missing tensors: {sorted(missing)[:5]}")
    model.eval()
    return model, config


def _copy(param: torch.Tensor, tensor: torch.Tensor, name: str) -> None:
    if param.shape != tensor.shape:
        raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != {tuple(param.shape)}")
    with torch.no_grad():
        param.copy_(tensor.to(param.dtype))


def _copy_expert(
    param: torch.nn.Parameter, where: tuple[int, int], tensor: torch.Tensor, name: str
) -> None:
    expert, half = where
    num_experts = param.shape[0]
    if expert >= num_experts:
        raise ValueError(f"{name}: expert {expert} of a layer with {num_experts} experts")
    # gate_up_proj stacks [2I, H] per expert: w1 fills the first I rows, w3 the rest.
    halves = 2 if name.endswith((".w1.weight", ".w3.weight")) else 1
    size = param.shape[1] // halves
    _copy(param[expert, half * size : (half + 1) * size], tensor, name)


def _complete_expert_stacks(
    params: dict[str, torch.nn.Parameter], experts_loaded: dict[str, set[tuple[int, int]]]
) -> set[str]:
    """The stacked expert parameters every piece of which came from the checkpoint."""
    complete = set()
    for name, pieces in experts_loaded.items():
        halves = 2 if name.endswith("gate_up_proj") else 1
        expected = {(e, h) for e in range(params[name].shape[0]) for h in range(halves)}
        if pieces == expected:
            complete.add(name)
    return complete
