"""Named shapes for generated models: Llama `tiny` for tests, `small` and `100m` for benchmarks,
`8b` (Llama-3-8B's layers) for GPU benchmarks; Mixtral (sparse MoE) `tiny-moe` for tests and
`moe-small` for measuring a batch's expert union.

The vocabulary is the byte tokenizer's, exactly: a padded vocabulary would leave ids that
vLLM and transformers could sample but not decode.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from types import MappingProxyType
from typing import Any

from engine.text.tokenizer_builder import VOCAB_SIZE

__all__ = ["PRESETS", "PRESET_NAMES", "ModelPreset", "get_preset", "preset_configs"]

_DTYPES = ("float32", "bfloat16")
_ARCHITECTURES = ("LlamaForCausalLM", "MixtralForCausalLM")


@dataclass(frozen=True, slots=True)
class ModelPreset:
    name: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    # Fewer than num_attention_heads means grouped-query attention.
    num_key_value_heads: int
    # One expert's for a Mixtral preset.
    intermediate_size: int
    max_position_embeddings: int
    rope_theta: float
    rms_norm_eps: float = 1e-5
    # Std of the normal init of every linear weight and the embedding (HF's convention).
    initializer_range: float = 0.02
    tie_word_embeddings: bool = False
    vocab_size: int = VOCAB_SIZE
    architecture: str = "LlamaForCausalLM"
    # Mixtral only: experts per layer and experts each token is routed to.
    num_local_experts: int = 0
    num_experts_per_tok: int = 0

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a preset needs a name")
        for field_name in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "intermediate_size",
            "max_position_embeddings",
            "vocab_size",
        ):
            if getattr(self, field_name) <= 0:
                raise ValueError(f"{field_name} must be positive")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even (rotary embeddings rotate pairs)")
        if self.rope_theta <= 0 or self.rms_norm_eps <= 0 or self.initializer_range <= 0:
            raise ValueError("rope_theta, rms_norm_eps and initializer_range must be positive")
        if self.architecture not in _ARCHITECTURES:
            raise ValueError(f"presets are one of {_ARCHITECTURES}")
        if self.is_moe != (self.num_local_experts > 0):
            raise ValueError("num_local_experts must be positive for Mixtral and 0 for Llama")
        if self.is_moe and not 1 <= self.num_experts_per_tok <= self.num_local_experts:
            raise ValueError("num_experts_per_tok must be between 1 and num_local_experts")

    @property
    def is_moe(self) -> bool:
        return self.architecture == "MixtralForCausalLM"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_config_dict(
        self, *, dtype: str, eos_token_id: int, pad_token_id: int | None
    ) -> dict[str, Any]:
        """The `config.json` content, with every field a Llama (or Mixtral) loader reads."""
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, got {dtype!r}")
        config = {
            "architectures": [self.architecture],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": None,
            "eos_token_id": eos_token_id,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "initializer_range": self.initializer_range,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "mlp_bias": False,
            "model_type": "llama",
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "pad_token_id": pad_token_id,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": dtype,
            "use_cache": True,
            "vocab_size": self.vocab_size,
        }
        if self.is_moe:
            # MixtralConfig has no attention/MLP bias switches; it has router settings.
            del config["attention_bias"], config["mlp_bias"]
            config.update(
                model_type="mixtral",
                num_local_experts=self.num_local_experts,
                num_experts_per_tok=self.num_experts_per_tok,
                output_router_logits=False,
                router_aux_loss_coef=0.001,
                router_jitter_noise=0.0,
                sliding_window=None,
            )
        return config


_ALL = (
    ModelPreset(
        name="tiny",
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=1024,
        rope_theta=10000.0,
    ),
    ModelPreset(
        name="small",
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        intermediate_size=768,
        max_position_embeddings=8192,
        rope_theta=500000.0,
    ),
    ModelPreset(
        name="100m",
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=12,
        intermediate_size=3072,
        max_position_embeddings=8192,
        rope_theta=500000.0,
    ),
    # Llama-3-8B's layers (GQA 32/8 heads, d 128, SwiGLU 14,336): the shape a GPU step is timed
    # on. With the byte vocabulary its embedding and head are ~2 M parameters, not 8B's 1.05 B,
    # so the weights are 6.98 B parameters (13.96 GB in bf16), not 8.03 B.
    ModelPreset(
        name="8b",
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=14336,
        max_position_embeddings=8192,
        rope_theta=500000.0,
    ),
    ModelPreset(
        name="tiny-moe",
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=1024,
        rope_theta=10000.0,
        architecture="MixtralForCausalLM",
        num_local_experts=4,
        num_experts_per_tok=2,
    ),
    # ~107M parameters, ~32M active per token: fp32 experts are 403 MB against 101 MB for
    # one token's top-2, so whether a batch reads the union or the active set shows on a CPU.
    ModelPreset(
        name="moe-small",
        hidden_size=512,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        intermediate_size=1024,
        max_position_embeddings=8192,
        rope_theta=1e6,
        architecture="MixtralForCausalLM",
        num_local_experts=8,
        num_experts_per_tok=2,
    ),
)

PRESETS: Mapping[str, ModelPreset] = MappingProxyType({p.name: p for p in _ALL})
PRESET_NAMES: tuple[str, ...] = tuple(PRESETS)


def get_preset(name: str) -> ModelPreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(
            f"unknown preset {name!r}; choose one of {', '.join(PRESET_NAMES)}"
        ) from None


def preset_configs() -> dict[str, Callable[[], dict[str, Any]]]:
    """Every preset's config.json (fp32, the generated tokenizer's ids), built on demand: what
    `mixgate plan` and calibration accept for `--model` besides a folder."""
    return {
        name: partial(preset.to_config_dict, dtype="float32", eos_token_id=0, pad_token_id=None)
        for name, preset in PRESETS.items()
    }
