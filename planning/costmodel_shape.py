"""What the cost model needs to know about a model: parameters, bytes, KV per token, experts.

A dense model reads all its weights every step. An MoE model (``num_experts > 0``) has a dense
part (embeddings, attention, norms, shared experts, the router) read every step, and routed
experts of which a step reads only the union its tokens picked (``planning.costmodel_routing``).
Compute follows the *active* parameters (``k`` of ``E`` experts per token); memory traffic
follows the union. ``planning.model_shape_from_config`` builds one from a ``config.json``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planning.costmodel_routing import expected_experts_touched

__all__ = ["ModelShape"]


@dataclass(frozen=True, slots=True)
class ModelShape:
    num_parameters: int  # P: every parameter, every expert counted (what memory holds)
    weight_bytes: int  # W: bytes of all weights (num_parameters × bytes per parameter)
    kv_bytes_per_token: int  # K and V of one token over all layers
    # Attention flops per (query token, cached key token) pair over all layers: QKᵀ and the
    # weighted sum of V, 2 flops per multiply-add, so 4 · layers · query heads · head_dim.
    # 0 leaves attention arithmetic out: the seed's formula exactly.
    attention_flops_per_query_key: int = 0
    # Temporary buffers per token in flight (activations, logits): the planner's memory budget.
    activation_bytes_per_token: int = 0
    # MoE (all 0 for a dense model). E routed experts per MoE layer, k picked per token.
    num_experts: int = 0
    experts_per_token: int = 0
    expert_parameters: int = 0  # parameters of all routed experts, all layers
    expert_weight_bytes: int = 0  # their bytes
    # Routing assumption, not architecture: 0 uniform, s > 0 Zipf-like expert popularity.
    routing_skew: float = 0.0

    def __post_init__(self) -> None:
        if self.num_parameters < 1 or self.weight_bytes < 1:
            raise ValueError("num_parameters and weight_bytes must be at least 1")
        non_negative = (
            self.kv_bytes_per_token,
            self.attention_flops_per_query_key,
            self.activation_bytes_per_token,
            self.expert_parameters,
            self.expert_weight_bytes,
        )
        if min(non_negative) < 0:
            raise ValueError("byte, flop and parameter counts must be non-negative")
        if not (math.isfinite(self.routing_skew) and self.routing_skew >= 0):
            raise ValueError("routing_skew must be finite and non-negative")
        if self.num_experts == 0:
            if self.experts_per_token or self.expert_parameters or self.expert_weight_bytes:
                raise ValueError("a dense shape (num_experts=0) has no expert fields")
            return
        if not 1 <= self.experts_per_token <= self.num_experts:
            raise ValueError("experts_per_token must be in [1, num_experts]")
        if not 0 < self.expert_parameters <= self.num_parameters:
            raise ValueError("expert_parameters must be in (0, num_parameters]")
        if not 0 < self.expert_weight_bytes <= self.weight_bytes:
            raise ValueError("expert_weight_bytes must be in (0, weight_bytes]")

    @classmethod
    def dense(
        cls,
        num_parameters: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        bytes_per_parameter: int = 2,
        kv_bytes_per_element: int = 2,
        *,
        num_attention_heads: int | None = None,
    ) -> ModelShape:
        """From architecture numbers: a K and a V vector per layer and KV head per token.

        ``num_attention_heads`` (query heads) adds attention arithmetic; None leaves it out.
        """
        dims = (num_layers, num_kv_heads, head_dim, bytes_per_parameter, kv_bytes_per_element)
        if min(dims) < 1 or (num_attention_heads is not None and num_attention_heads < 1):
            raise ValueError("architecture numbers must be at least 1")
        query_heads = num_attention_heads or 0
        return cls(
            num_parameters=num_parameters,
            weight_bytes=num_parameters * bytes_per_parameter,
            kv_bytes_per_token=2 * num_layers * num_kv_heads * head_dim * kv_bytes_per_element,
            attention_flops_per_query_key=4 * num_layers * query_heads * head_dim,
        )

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def active_parameters(self) -> float:
        """Parameters one token goes through: the dense part and ``k / E`` of the experts."""
        if not self.is_moe:
            return float(self.num_parameters)
        unused_share = 1 - self.experts_per_token / self.num_experts
        return self.num_parameters - self.expert_parameters * unused_share

    @property
    def dense_weight_bytes(self) -> int:
        """Bytes read every step whatever the routing (all weights of a dense model)."""
        return self.weight_bytes - self.expert_weight_bytes

    @property
    def active_weight_bytes(self) -> float:
        """Bytes one token's path reads: the dense part and ``k / E`` of the expert bytes."""
        if not self.is_moe:
            return float(self.weight_bytes)
        return self.dense_weight_bytes + self.expert_weight_bytes * (
            self.experts_per_token / self.num_experts
        )

    def experts_touched(self, tokens: int) -> float:
        """Expected distinct experts per MoE layer read by a step of ``tokens`` tokens."""
        if not self.is_moe:
            return 0.0
        return expected_experts_touched(
            self.num_experts, self.experts_per_token, tokens, self.routing_skew
        )

    def weight_bytes_read(self, tokens: int) -> float:
        """Weight bytes a step of ``tokens`` tokens reads: ``W`` for a dense model;
        ``dense + expert_bytes · touched(T) / E`` for an MoE model."""
        if not self.is_moe:
            return float(self.weight_bytes)
        touched_share = self.experts_touched(tokens) / self.num_experts
        return self.dense_weight_bytes + self.expert_weight_bytes * touched_share

    def as_active_dense(self) -> ModelShape:
        """The naive view of an MoE model: a dense model of its active parameters and bytes.

        This is the extrapolation the seed warns against: its step time at any batch size reads
        only ``k / E`` of the experts, as if every token of the batch picked the same ones.
        """
        return ModelShape(
            num_parameters=max(1, round(self.active_parameters)),
            weight_bytes=max(1, round(self.active_weight_bytes)),
            kv_bytes_per_token=self.kv_bytes_per_token,
            attention_flops_per_query_key=self.attention_flops_per_query_key,
            activation_bytes_per_token=self.activation_bytes_per_token,
        )
