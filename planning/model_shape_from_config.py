"""A ``ModelShape`` from a Hugging Face ``config.json`` (already parsed: a dict in, no I/O).

Parameters are counted from the architecture numbers, the way the checkpoints lay them out:

- embeddings ``vocab × hidden``, plus an ``lm_head`` of the same size unless tied;
- per layer: attention ``q`` (hidden × heads·head_dim), ``k`` and ``v`` (hidden × kv_heads·
  head_dim each: grouped-query attention shrinks these and the KV cache), ``o`` (heads·head_dim ×
  hidden), their biases where the family has them (Qwen2: q/k/v; Llama: ``attention_bias``),
  Qwen3's per-head q/k norms, two RMSNorm vectors; the MLP: a SwiGLU of three ``hidden ×
  intermediate`` matrices (gate, up, down);
- MoE layers instead: a router (hidden × E), E routed experts of three ``hidden × expert
  intermediate`` matrices each, and Qwen-MoE's shared expert (three matrices of
  ``shared_expert_intermediate_size``, plus its hidden × 1 gate), which every token uses;
- the final norm.

Families: Llama, Mistral, Qwen2 (dense); Mixtral (``num_local_experts``, ``intermediate_size``
per expert); Qwen2-MoE and Qwen3-MoE (``num_experts``, ``moe_intermediate_size``,
``decoder_sparse_step``, ``mlp_only_layers``). A config with experts it cannot read raises
ValueError rather than being costed as dense. Sliding windows are ignored (KV is costed for
the whole context: pessimistic for Mistral beyond its window).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from planning.costmodel_shape import ModelShape

__all__ = ["shape_from_hf_config"]

# Logits are kept in fp32 whatever the model dtype (sampling needs the precision).
_LOGIT_BYTES = 4


def _int(raw: Mapping[str, object], key: str, default: int | None = None) -> int:
    value = raw.get(key, default)
    if value is None:
        if default is None:
            raise ValueError(f"config.json lacks {key!r}")
        value = default
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise ValueError(f"config.json {key!r} must be an integer, got {value!r}")
    return int(value)


@dataclass(frozen=True, slots=True)
class _Experts:
    count: int  # E routed experts per MoE layer
    per_token: int  # k
    intermediate: int  # intermediate size of one routed expert
    shared_intermediate: int  # Qwen-MoE's shared expert (0: none)
    moe_layers: int  # layers with experts; the others have a dense MLP


def _architecture(raw: Mapping[str, object]) -> str:
    architectures = raw.get("architectures")
    if isinstance(architectures, list) and architectures:
        return str(architectures[0])
    return str(raw.get("model_type", "llama"))


def _moe_layer_count(raw: Mapping[str, object], layers: int) -> int:
    """Qwen-MoE: every ``decoder_sparse_step``-th layer has experts unless it is listed in
    ``mlp_only_layers``; Mixtral: every layer."""
    step = _int(raw, "decoder_sparse_step", 1)
    dense_only = raw.get("mlp_only_layers") or []
    if not isinstance(dense_only, list):
        raise ValueError("config.json 'mlp_only_layers' must be a list")
    if step < 1:
        return 0
    return sum(1 for layer in range(layers) if layer not in dense_only and (layer + 1) % step == 0)


def _experts(raw: Mapping[str, object], layers: int) -> _Experts | None:
    if "num_local_experts" in raw:  # Mixtral: experts are full-size SwiGLU MLPs
        return _Experts(
            count=_int(raw, "num_local_experts"),
            per_token=_int(raw, "num_experts_per_tok", 2),  # transformers' MixtralConfig default
            intermediate=_int(raw, "intermediate_size"),
            shared_intermediate=0,
            moe_layers=layers,
        )
    if _int(raw, "num_experts", 0) > 0:  # Qwen2-MoE / Qwen3-MoE
        if "moe_intermediate_size" not in raw:
            raise ValueError("an MoE config with num_experts needs moe_intermediate_size")
        return _Experts(
            count=_int(raw, "num_experts"),
            per_token=_int(raw, "num_experts_per_tok"),
            intermediate=_int(raw, "moe_intermediate_size"),
            shared_intermediate=_int(raw, "shared_expert_intermediate_size", 0),
            moe_layers=_moe_layer_count(raw, layers),
        )
    if any(key in raw for key in ("n_routed_experts", "num_experts_per_tok", "moe_num_experts")):
        raise ValueError("unsupported MoE config: expected num_local_experts or num_experts")
    return None


def _attention_parameters(raw: Mapping[str, object], arch: str) -> tuple[int, int, int]:
    """Per-layer attention parameters, query dim, kv dim."""
    hidden = _int(raw, "hidden_size")
    heads = _int(raw, "num_attention_heads")
    kv_heads = _int(raw, "num_key_value_heads", heads)
    head_dim = _int(raw, "head_dim", hidden // heads)
    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    params = hidden * q_dim + 2 * hidden * kv_dim + q_dim * hidden
    qwen2_family = arch.startswith("Qwen2")  # Qwen2 and Qwen2-MoE: q/k/v biases always
    if qwen2_family or raw.get("attention_bias"):
        params += q_dim + 2 * kv_dim
    if raw.get("attention_bias") and not qwen2_family:
        params += hidden  # Llama's attention_bias also biases o_proj
    if arch.startswith("Qwen3"):
        params += 2 * head_dim  # q_norm and k_norm over each head
    return params, q_dim, kv_dim


def shape_from_hf_config(
    raw: Mapping[str, object], dtype_bytes: int, kv_dtype_bytes: int | None = None
) -> ModelShape:
    """Parameters, bytes, KV per token, attention flops and experts of a ``config.json``.

    ``dtype_bytes``: bytes per weight (2 for bf16); ``kv_dtype_bytes``: bytes per cached K/V
    element (default: the same).
    """
    if dtype_bytes < 1 or (kv_dtype_bytes is not None and kv_dtype_bytes < 1):
        raise ValueError("dtype sizes must be at least 1 byte")
    kv_element_bytes = kv_dtype_bytes or dtype_bytes
    arch = _architecture(raw)
    hidden = _int(raw, "hidden_size")
    layers = _int(raw, "num_hidden_layers")
    heads = _int(raw, "num_attention_heads")
    kv_heads = _int(raw, "num_key_value_heads", heads)
    head_dim = _int(raw, "head_dim", hidden // heads)
    vocab = _int(raw, "vocab_size")
    if min(hidden, layers, heads, kv_heads, head_dim, vocab) < 1:
        raise ValueError("config.json sizes must be positive")
    attention, q_dim, kv_dim = _attention_parameters(raw, arch)
    experts = _experts(raw, layers)
    if experts is not None and experts.moe_layers == 0:
        experts = None  # every layer listed in mlp_only_layers: a dense model after all
    dense_intermediate = _int(raw, "intermediate_size")
    per_layer_fixed = attention + 2 * hidden  # attention and the two norms
    dense_mlp = 3 * hidden * dense_intermediate
    expert_parameters = 0
    mlp_total = layers * dense_mlp
    active_intermediate = dense_intermediate
    if experts is not None:
        if not 1 <= experts.per_token <= experts.count:
            raise ValueError("num_experts_per_tok must be in [1, number of experts]")
        one_expert = 3 * hidden * experts.intermediate
        shared = 3 * hidden * experts.shared_intermediate + (
            hidden if experts.shared_intermediate else 0
        )
        router = hidden * experts.count
        expert_parameters = experts.moe_layers * experts.count * one_expert
        dense_layers = layers - experts.moe_layers
        mlp_total = dense_layers * dense_mlp + experts.moe_layers * (router + shared)
        mlp_total += expert_parameters
        active_intermediate = experts.per_token * experts.intermediate
        active_intermediate += experts.shared_intermediate
    tied = bool(raw.get("tie_word_embeddings", False))
    embeddings = vocab * hidden * (1 if tied else 2)
    num_parameters = layers * per_layer_fixed + mlp_total + embeddings + hidden
    # Per token in flight: residual and normed hidden states, q/k/v, the MLP's gate/up/act,
    # in the model dtype; and a row of fp32 logits (counted for every token: pessimistic).
    activation_elements = 4 * hidden + q_dim + 2 * kv_dim + 3 * active_intermediate
    activation_bytes = activation_elements * dtype_bytes + vocab * _LOGIT_BYTES
    return ModelShape(
        num_parameters=num_parameters,
        weight_bytes=num_parameters * dtype_bytes,
        kv_bytes_per_token=2 * layers * kv_heads * head_dim * kv_element_bytes,
        attention_flops_per_query_key=4 * layers * heads * head_dim,
        activation_bytes_per_token=activation_bytes,
        num_experts=experts.count if experts else 0,
        experts_per_token=experts.per_token if experts else 0,
        expert_parameters=expert_parameters,
        expert_weight_bytes=expert_parameters * dtype_bytes,
    )
