"""The architecture facts the engine needs, read from a Hugging Face `config.json`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "MixtralForCausalLM",
)
# transformers' MixtralConfig defaults, for keys a Mixtral config.json leaves out.
_MIXTRAL_DEFAULTS = {"num_local_experts": 8, "num_experts_per_tok": 2, "rope_theta": 1e6}


@dataclass(frozen=True, slots=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    # rope_scaling as in config.json (None, or a dict with "rope_type"/"type").
    rope_scaling: dict[str, Any] | None
    tie_word_embeddings: bool
    # Qwen2 always has q/k/v biases; Llama has them when attention_bias is set.
    qkv_bias: bool
    o_proj_bias: bool
    mlp_bias: bool
    # Mistral's window; None when attention is global.
    sliding_window: int | None
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    # The dtype the checkpoint was saved in ("float32", "bfloat16", ...).
    torch_dtype: str
    # Mixtral: experts per layer and experts each token is routed to; 0 and 0 for a dense
    # MLP. intermediate_size is then one expert's.
    num_local_experts: int = 0
    num_experts_per_tok: int = 0

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {self.architecture!r}; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if (self.architecture == "MixtralForCausalLM") != (self.num_local_experts > 0):
            raise ValueError("num_local_experts must be positive for Mixtral and 0 otherwise")
        if self.is_moe and not 1 <= self.num_experts_per_tok <= self.num_local_experts:
            raise ValueError("num_experts_per_tok must be between 1 and num_local_experts")

    @property
    def is_moe(self) -> bool:
        return self.num_local_experts > 0

    @property
    def max_context_tokens(self) -> int:
        """Longest sequence the engine runs exactly (a sliding window caps it: see NOTE)."""
        # NOTE: the engine keeps full attention; within the window the result is identical,
        # so a windowed model is limited to its window instead of silently diverging.
        if self.sliding_window is not None:
            return min(self.max_position_embeddings, self.sliding_window)
        return self.max_position_embeddings

    @property
    def kv_bytes_per_token_per_byte_dtype(self) -> int:
        """K and V elements per token over all layers (multiply by the dtype's size)."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim

    @property
    def expert_parameters(self) -> int:
        """One SwiGLU MLP (gate, up, down): one expert of an MoE layer, or a dense layer's MLP."""
        return 3 * self.hidden_size * self.intermediate_size

    def num_parameters(self) -> int:
        """Every parameter stored (all experts of an MoE model)."""
        return self._count(self.num_local_experts if self.is_moe else 1)

    def num_active_parameters(self) -> int:
        """Parameters one token computes with: its top-k experts, not all of them (dense: all)."""
        return self._count(self.num_experts_per_tok if self.is_moe else 1)

    def _count(self, experts_per_layer: int) -> int:
        h, layers = self.hidden_size, self.num_hidden_layers
        q = h * self.num_attention_heads * self.head_dim
        kv = 2 * h * self.num_key_value_heads * self.head_dim
        o = self.num_attention_heads * self.head_dim * h
        router = h * self.num_local_experts  # 0 for a dense model
        mlp = experts_per_layer * self.expert_parameters + router
        per_layer = q + kv + o + mlp + 2 * h
        embed = self.vocab_size * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return layers * per_layer + embed + head + h

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        architectures = raw.get("architectures") or ["LlamaForCausalLM"]
        architecture = architectures[0]
        heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        window = raw.get("sliding_window")
        if raw.get("use_sliding_window") is False:
            window = None  # Qwen2 ships a window value but leaves it switched off.
        is_qwen2 = architecture == "Qwen2ForCausalLM"
        is_mixtral = architecture == "MixtralForCausalLM"
        # transformers 5 writes rope_theta inside rope_parameters.
        rope_theta = raw.get("rope_theta") or (raw.get("rope_parameters") or {}).get("rope_theta")
        if rope_theta is None:
            rope_theta = _MIXTRAL_DEFAULTS["rope_theta"] if is_mixtral else 10000.0
        return cls(
            architecture=architecture,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            rope_scaling=raw.get("rope_scaling"),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=is_qwen2 or bool(raw.get("attention_bias", False)),
            o_proj_bias=(not is_qwen2) and bool(raw.get("attention_bias", False)),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            sliding_window=int(window) if window else None,
            eos_token_ids=eos_ids,
            bos_token_id=raw.get("bos_token_id"),
            torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
            **(_moe_fields(raw) if is_mixtral else {}),
        )

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json in {model_dir}")
        return cls.from_dict(json.loads(path.read_text()))


def _moe_fields(raw: dict[str, Any]) -> dict[str, int]:
    # NOTE: router_jitter_noise (and the aux-loss keys) only act in training: not read.
    return {
        name: int(raw.get(name, _MIXTRAL_DEFAULTS[name]))
        for name in ("num_local_experts", "num_experts_per_tok")
    }
