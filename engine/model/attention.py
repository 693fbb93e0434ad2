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

# bf16/fp16 decode attention on CPU runs over fp32 copies (see PagedAttention._decode); a
# module switch so that a benchmark can time both in one process.
UPCAST_CPU_DECODE = True


def decode_attention_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype decode attention runs in (and its mask is built in) for a cache of `dtype`."""
    if UPCAST_CPU_DECODE and dtype != torch.float32 and device.type == "cpu":
        return torch.float32
    return dtype


class DecodeKernel(Protocol):
    """Decode attention over the paged cache in place: the C kernel on CPU
    (engine/model/kernels/paged_decode.py), Triton's on CUDA (paged_decode_triton.py)."""

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
    ) -> torch.Tensor:
        """q [rows, heads, d]; one layer's caches [blocks, block_size, kv_heads, d];
        block_tables int64 [rows, width]; context_lens int64 [rows] -> [rows, heads, d]."""
        ...


class PrefillKernel(Protocol):
    """Causal chunk attention over the paged cache in place: the C kernel for fp32 caches on
    CPU (engine/model/kernels/paged_prefill.py)."""

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_table: torch.Tensor,
        start_pos: int,
    ) -> torch.Tensor:
        """q [rows, heads, d], row i at position start_pos + i; one layer's caches [blocks,
        block_size, kv_heads, d]; block_table int64 [blocks of the sequence] -> [rows, heads,
        d]."""
        ...


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where a key is visible, -inf where not: SDPA's own form of a boolean mask.

    NOTE: built once per step and shared by every layer. Handed a boolean mask, SDPA converts
    it with `where` inside every call (two per call, ~1 ms of a 4-layer mixed step on the small
    preset); the float mask is what it would have built, so outputs are the same bits.
    """
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill_(visible.logical_not(), float("-inf"))


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
    # [chunk, context_len] additive causal mask (0 or -inf) over the whole context; None for
    # a first chunk, whose own fresh K/V are the whole context (plain causal attention), and
    # for every chunk when the prefill kernel attends (it masks by position).
    mask: torch.Tensor | None


@dataclass(frozen=True, slots=True)
class DecodeGroup:
    """Single-token queries of similar context length, attended in one call."""

    # Rows [row_start, row_end) of the flattened batch.
    row_start: int
    row_end: int
    # [rows, max_blocks] block tables, padded with block 0 (masked out).
    block_tables: torch.Tensor
    # [rows, 1, 1, max_blocks * block_size]: 0 where a key position is valid, -inf elsewhere;
    # None for the paged kernel, which reads `context_lens` instead.
    mask: torch.Tensor | None
    # [rows] int64 keys per row: set when the paged decode kernel attends the group in place.
    context_lens: torch.Tensor | None = None


@dataclass(frozen=True, slots=True)
class PagedAttentionMetadata:
    # Cache slot (block * block_size + offset) of every token of the flattened batch.
    slot_mapping: torch.Tensor
    # Single-token chunks come first, grouped by length (padding to the longest in a group).
    decodes: tuple[DecodeGroup, ...]
    prefills: tuple[PrefillSpan, ...]


class GatherBuffers:
    """Reused K/V gather buffers.

    NOTE: a fresh tensor for every gathered context (two per layer per step) costs page
    faults: measured 8-10 ms to gather 17 MB into new memory vs 0.8 ms into a reused buffer.
    The buffers grow to the largest gather seen and are shared by every layer (each layer's
    attention consumes them before the next layer gathers).
    """

    def __init__(self) -> None:
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def take(self, num_blocks: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Two [num_blocks, *like.shape[1:]] views for `like`-shaped cache blocks."""
        if self._k is None or self._k.shape[0] < num_blocks or self._k.shape[1:] != like.shape[1:]:
            capacity = max(num_blocks, int(num_blocks * 1.5))
            shape = (capacity, *like.shape[1:])
            self._k = torch.empty(shape, dtype=like.dtype, device=like.device)
            self._v = torch.empty(shape, dtype=like.dtype, device=like.device)
        assert self._v is not None
        return self._k[:num_blocks], self._v[:num_blocks]


class PagedAttention:
    """K/V cache per layer: [num_blocks, block_size, kv_heads, head_dim] for K and for V."""

    def __init__(
        self,
        kv_cache: torch.Tensor,
        metadata: PagedAttentionMetadata,
        buffers: GatherBuffers,
        decode_kernel: DecodeKernel | None = None,
        prefill_kernel: PrefillKernel | None = None,
    ):
        # kv_cache: [layers, 2, num_blocks, block_size, kv_heads, head_dim]
        self.kv_cache = kv_cache
        self.meta = metadata
        self.buffers = buffers
        # Attends the decode groups that carry context_lens, over the cache in place.
        self.decode_kernel = decode_kernel
        # Attends every prefill span over the cache in place (no gather, no mask).
        self.prefill_kernel = prefill_kernel

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k_cache, v_cache = self.kv_cache[layer, 0], self.kv_cache[layer, 1]
        kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
        k_cache.view(-1, kv_heads, head_dim).index_copy_(0, self.meta.slot_mapping, k)
        v_cache.view(-1, kv_heads, head_dim).index_copy_(0, self.meta.slot_mapping, v)
        meta = self.meta
        # One decode group or one prefill span covering the batch: its output is the answer
        # (no empty buffer, no copy into it).
        if len(meta.decodes) + len(meta.prefills) == 1:
            if meta.decodes:
                return self._decode(q, k_cache, v_cache, meta.decodes[0])
            return self._prefill(q, k, v, k_cache, v_cache, meta.prefills[0])
        out = torch.empty_like(q)
        for group in meta.decodes:
            rows = slice(group.row_start, group.row_end)
            out[rows] = self._decode(q[rows], k_cache, v_cache, group)
        for span in meta.prefills:
            rows = slice(span.query_start, span.query_end)
            out[rows] = self._prefill(q[rows], k[rows], v[rows], k_cache, v_cache, span)
        return out

    def _gather(
        self, k_cache: torch.Tensor, v_cache: torch.Tensor, blocks: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # NOTE: index_select copies whole blocks (memcpy speed) into the reused buffers; the
        # copy is the price of paging without a custom attention kernel (~20% of a
        # chat-over-backlog step on the small preset: 30 decodes over 100-1,500 tokens and a
        # 256-token chunk). Measured against it (torch 2.13 CPU, 2 threads, interleaved,
        # medians, noisy shared machine):
        # - flex_attention over the cache in place, compiled (dynamic shapes, 7-10 s once)
        #   with a BlockMask from the block tables (BlockMask.from_kv_blocks; create_block_mask
        #   costs 28-114 ms per call): 1.4-1.55x faster on 100m shapes once rows x context
        #   >= ~6k (B=32 ctx 1000: 13.6 vs 19.8 ms per layer), slower below (B=8 ctx 200:
        #   0.90 vs 0.65 ms); eager flex ~50x slower; inductor's CPU flex kernel failed to
        #   compile (CppCompileError) for small's GQA shapes (8 heads / 4 kv heads, d 32).
        # - decode as matmuls (q·K^T, softmax, ·V over the gathered [B, ctx] layout, GQA by
        #   grouping q heads): 2.0-2.3x slower than SDPA's flash kernel on the same gather.
        # - SDPA per sequence over views, as if each sequence's blocks were contiguous (the
        #   upper bound of a block-contiguous allocator): 1.7 vs 3.7 ms a layer (small, 30
        #   decodes) - but one call per sequence loses to one call per group at short contexts,
        #   and contiguity needs a reserving allocator, which paging exists to avoid; one
        #   exact packed gather + per-sequence calls was not a consistent win (small 0.64x,
        #   100m 1.29x).
        # - one index_select of a [blocks, 2, ...] K/V layout: slower (1.03 vs 0.67 ms: the
        #   K/V split copies).
        # - a head-major cache ([kv_heads, blocks, block_size, d], each head's gathered keys
        #   contiguous for SDPA): whole steps, in one process, interleaved, 1 thread: small
        #   mixed 52.1 vs 52.9 ms (even), 100m mixed 835 vs 773 ms and decodes alone 399 vs
        #   343 ms (worse: the gather copies kv_heads times smaller pieces).
        k_buf, v_buf = self.buffers.take(blocks.shape[0], k_cache)
        torch.index_select(k_cache, 0, blocks, out=k_buf)
        torch.index_select(v_cache, 0, blocks, out=v_buf)
        return k_buf, v_buf

    def _decode(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, group: DecodeGroup
    ) -> torch.Tensor:
        """A group of single-token queries at once over their padded, gathered blocks."""
        if group.context_lens is not None:
            assert self.decode_kernel is not None, "a kernel group needs the decode kernel"
            return self.decode_kernel.attend(
                q, k_cache, v_cache, group.block_tables, group.context_lens
            )
        assert group.mask is not None
        batch = group.block_tables.shape[0]
        k_buf, v_buf = self._gather(k_cache, v_cache, group.block_tables.flatten())
        keys = k_buf.view(batch, -1, *k_cache.shape[2:]).transpose(1, 2)
        values = v_buf.view(batch, -1, *v_cache.shape[2:]).transpose(1, 2)
        queries = q.view(batch, -1, 1, q.shape[-1])
        if decode_attention_dtype(q.dtype, q.device) != q.dtype:
            # NOTE: torch 2.13's CPU SDPA kernel for bf16 single-token queries was the largest
            # part of a bf16 100m decode step (69% at B=32); over fp32 copies of the gathered
            # K/V it is 1.5x faster (B=32, 12 heads, 144 keys: 2.45 -> 1.63 ms) and no less
            # exact (the bf16 kernel accumulates in fp32 too).
            queries, keys, values = queries.float(), keys.float(), values.float()
        # The mask was built in decode_attention_dtype; `.to` is a no-op unless a benchmark
        # flipped UPCAST_CPU_DECODE after the metadata was built.
        out = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=group.mask.to(queries.dtype), enable_gqa=True
        )
        return out.to(q.dtype).view(batch, -1, q.shape[-1])

    def _prefill(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        span: PrefillSpan,
    ) -> torch.Tensor:
        if self.prefill_kernel is not None:
            start_pos = span.context_len - (span.query_end - span.query_start)
            return self.prefill_kernel.attend(q, k_cache, v_cache, span.block_table, start_pos)
        if span.mask is None:
            # Metadata built for the kernel carries no masks: it must not reach SDPA.
            assert span.context_len == q.shape[0], "a later chunk needs its mask without the kernel"
            keys, values, causal = k, v, True
        else:
            k_buf, v_buf = self._gather(k_cache, v_cache, span.block_table)
            keys = k_buf.flatten(0, 1)[: span.context_len]
            values = v_buf.flatten(0, 1)[: span.context_len]
            causal = False
        # NOTE: 4-D (a batch of one), not 3-D: torch 2.13's CPU dispatcher sends 3-D inputs
        # with a mask or GQA to the math kernel (bmm + softmax + isneginf checks over the
        # whole [heads, chunk, context] score matrix): a 256-token chunk over 1,256 keys on the
        # small preset took 11.5 ms a layer there, 2.5 ms in the flash kernel.
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0),
            keys.transpose(0, 1).unsqueeze(0),
            values.transpose(0, 1).unsqueeze(0),
            attn_mask=span.mask,
            is_causal=causal,
            enable_gqa=True,
        )
        return out.squeeze(0).transpose(0, 1)
