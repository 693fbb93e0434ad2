"""The architecture facts the engine needs, read from a Hugging Face `config.json`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


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

    def num_parameters(self) -> int:
        h, i, layers = self.hidden_size, self.intermediate_size, self.num_hidden_layers
        q = h * self.num_attention_heads * self.head_dim
        kv = 2 * h * self.num_key_value_heads * self.head_dim
        o = self.num_attention_heads * self.head_dim * h
        per_layer = q + kv + o + 3 * h * i + 2 * h
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
            rope_theta=float(raw.get("rope_theta", 10000.0)),
            rope_scaling=raw.get("rope_scaling"),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=is_qwen2 or bool(raw.get("attention_bias", False)),
            o_proj_bias=(not is_qwen2) and bool(raw.get("attention_bias", False)),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            sliding_window=int(window) if window else None,
            eos_token_ids=eos_ids,
            bos_token_id=raw.get("bos_token_id"),
            torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
        )

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json in {model_dir}")
        return cls.from_dict(json.loads(path.read_text()))
