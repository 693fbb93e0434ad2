"""Rotary position embeddings (Hugging Face's rotate-half layout), with Llama-3 scaling."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch


def inverse_frequencies(
    head_dim: int, theta: float, scaling: dict[str, Any] | None
) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if not scaling:
        return inv_freq
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(scaling["factor"])
    if rope_type == "llama3":
        return _llama3_scaled(inv_freq, scaling)
    raise ValueError(f"rope_scaling type {rope_type!r} is not supported (default, linear, llama3)")


def _llama3_scaled(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1's frequency-dependent scaling, as transformers computes it."""
    factor = float(scaling["factor"])
    low_freq_factor = float(scaling.get("low_freq_factor", 1.0))
    high_freq_factor = float(scaling.get("high_freq_factor", 4.0))
    old_context = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(torch.nn.Module):
    """Precomputed cos/sin tables indexed by each token's absolute position."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(
        self, head_dim: int, max_positions: int, theta: float, scaling: dict[str, Any] | None
    ):
        super().__init__()
        if torch.get_default_device().type == "meta":
            # A meta-device build (weights.load_model) rebuilds this module on the real device
            # after; computing the tables on meta runs torch's Python decompositions, whose first
            # use imports torch._dynamo: ~1.5 s of every engine start, for tables thrown away.
            shape = (max_positions, head_dim)
            self.register_buffer("cos", torch.empty(shape), persistent=False)
            self.register_buffer("sin", torch.empty(shape), persistent=False)
            return
        inv_freq = inverse_frequencies(head_dim, theta, scaling)
        positions = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)
        table = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", table.cos(), persistent=False)
        self.register_buffer("sin", table.sin(), persistent=False)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> RotaryTables:
        """cos/sin rows for a step's positions; computed once per step, shared by every layer."""
        cos = self.cos[positions].unsqueeze(1).to(dtype)
        sin = self.sin[positions].unsqueeze(1).to(dtype)
        half = sin.shape[-1] // 2
        # rotate_half(x) * sin == roll(x, half) * [-sin_1, sin_2]: the sign moves onto the
        # table (exact: negation commutes with rounding), so a layer needs no neg and no cat.
        signed_sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        return RotaryTables(cos, signed_sin)


class RotaryTables(NamedTuple):
    cos: torch.Tensor  # [T, 1, head_dim]
    signed_sin: torch.Tensor  # [T, 1, head_dim], first half negated

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, heads, head_dim] (q and k side by side) -> a rotated copy."""
        half = x.shape[-1] // 2
        rotated: torch.Tensor = x * self.cos + x.roll(half, dims=-1) * self.signed_sin
        return rotated
