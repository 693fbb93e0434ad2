"""Attention backends: how a layer's fresh q/k/v meet the cache.

The model computes q, k, v for a flattened batch of tokens and hands them to a backend:
`DenseCausalAttention` (one sequence, no cache: the reference and the parity tests) or
`PagedAttention` (the engine: writes K/V into the paged cache through a slot mapping, then
attends each sequence over its own blocks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F


class AttentionBackend(Protocol):
    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [T, heads, d], k/v: [T, kv_heads, d] -> [T, heads, d]."""
        ...


class DenseCausalAttention:
    """A single sequence attending causally over itself, with no cache."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1),
            k.transpose(0, 1),
            v.transpose(0, 1),
            is_causal=True,
            enable_gqa=True,
        )
        return out.transpose(0, 1)


@dataclass(frozen=True, slots=True)
class PrefillSpan:
    # Rows [query_start, query_end) of the flattened batch belong to this chunk.
    query_start: int
    query_end: int
    # Tokens of the sequence in the cache once this chunk is written (start_pos + chunk).
    context_len: int
    # Block ids covering [0, context_len).
    block_table: torch.Tensor


@dataclass(frozen=True, slots=True)
class PagedAttentionMetadata:
    # Cache slot (block * block_size + offset) of every token of the flattened batch.
    slot_mapping: torch.Tensor
    # Single-token chunks come first: rows [0, num_decodes).
    num_decodes: int
    # [num_decodes, max_blocks] block tables, padded with block 0 (masked out).
    decode_block_tables: torch.Tensor | None
    # [num_decodes, 1, 1, max_blocks * block_size]: True where a key position is valid.
    decode_mask: torch.Tensor | None
    prefills: tuple[PrefillSpan, ...]


class PagedAttention:
    """K/V cache per layer: [num_blocks, block_size, kv_heads, head_dim] for K and for V."""

    def __init__(self, kv_cache: torch.Tensor, metadata: PagedAttentionMetadata):
        # kv_cache: [layers, 2, num_blocks, block_size, kv_heads, head_dim]
        self.kv_cache = kv_cache
        self.meta = metadata

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k_cache, v_cache = self.kv_cache[layer, 0], self.kv_cache[layer, 1]
        kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
        k_cache.view(-1, kv_heads, head_dim).index_copy_(0, self.meta.slot_mapping, k)
        v_cache.view(-1, kv_heads, head_dim).index_copy_(0, self.meta.slot_mapping, v)
        out = torch.empty_like(q)
        meta = self.meta
        if meta.decode_block_tables is not None and meta.decode_mask is not None:
            out[: meta.num_decodes] = self._decode(
                q[: meta.num_decodes],
                k_cache,
                v_cache,
                meta.decode_block_tables,
                meta.decode_mask,
            )
        for span in meta.prefills:
            rows = slice(span.query_start, span.query_end)
            out[rows] = self._prefill(q[rows], k[rows], v[rows], k_cache, v_cache, span)
        return out

    @staticmethod
    def _decode(
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """All single-token queries at once over their padded, gathered blocks."""
        batch, max_blocks = block_tables.shape
        # NOTE: index_select copies whole blocks (memcpy speed); advanced indexing with a 2-D
        # index was 1.3x slower. The copy is the price of paging without a custom kernel.
        flat = block_tables.flatten()
        keys = k_cache.index_select(0, flat).view(batch, -1, *k_cache.shape[2:]).transpose(1, 2)
        values = v_cache.index_select(0, flat).view(batch, -1, *v_cache.shape[2:]).transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q.view(batch, -1, 1, q.shape[-1]), keys, values, attn_mask=mask, enable_gqa=True
        )
        return out.view(batch, -1, q.shape[-1])

    @staticmethod
    def _prefill(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        span: PrefillSpan,
    ) -> torch.Tensor:
        num_queries = q.shape[0]
        if span.context_len == num_queries:
            # A first chunk: its own fresh K/V are the whole context.
            keys, values, mask, causal = k, v, None, True
        else:
            keys = k_cache.index_select(0, span.block_table).flatten(0, 1)[: span.context_len]
            values = v_cache.index_select(0, span.block_table).flatten(0, 1)[: span.context_len]
            start = span.context_len - num_queries
            query_pos = torch.arange(start, span.context_len, device=q.device).unsqueeze(1)
            key_pos = torch.arange(span.context_len, device=q.device).unsqueeze(0)
            mask, causal = key_pos <= query_pos, False
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1),
            keys.transpose(0, 1),
            values.transpose(0, 1),
            attn_mask=mask,
            is_causal=causal,
            enable_gqa=True,
        )
        return out.transpose(0, 1)
