"""Pure-decode steps through static shapes, replayed as CUDA graphs.

Why: an eager forward of an 8B-shaped model launches ~1,200 kernels per decode step. On the
H200 machine this project was lent (`scripts/gpu-check`, torch 2.11), the host took ~29 ms to
launch a step whose kernels ran 6.7 ms: the GPU sat idle 77% of every step. A CUDA graph
replays the whole forward with one launch.

A graph needs fixed shapes and fixed tensor addresses, so a decode step is padded to a bucket:
its batch to the next of `BATCH_BUCKETS`, its block-table width to a multiple of
`WIDTH_BUCKET_BLOCKS`. Each (batch, width) bucket gets its own static input tensors and is
captured on first use. Padded rows decode token 0 at position 0, write their K/V into a scratch
block that no sequence owns (the runner allocates one block past the block manager's), and
their logits are dropped. Block-table columns past a row's own blocks are masked by its context
length, so stale ids there are harmless; a padded row's slot is reset to the scratch slot on
every replay, so it never writes into a block that was a real row's in an earlier step.

`capture=False` runs the same padded static path eagerly: the exactness tests run it on CPU,
where there are no graphs, so the padding and bucketing are tested on every machine.
"""

from __future__ import annotations

import bisect
import contextlib
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from engine.model.attention import (
    DecodeGroup,
    DecodeKernel,
    GatherBuffers,
    PagedAttention,
    PagedAttentionMetadata,
    additive_mask,
)
from engine.model.transformer import LlamaModel

__all__ = ["BATCH_BUCKETS", "WIDTH_BUCKET_BLOCKS", "DecodeGraphs", "graph_bucket"]

# Decode batch sizes a graph is captured for; a step pads up to the next one. Dense at the
# small end (a padded row costs a full row of every GEMM's activations, not of its weights).
BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256)
# Block-table widths are rounded up to a multiple of this many blocks (256 tokens at the
# default 16-token blocks): the padded columns are gathered and masked, ~1/8 extra at 2k.
WIDTH_BUCKET_BLOCKS = 16
# Graphs captured at most; a step whose bucket would be one more runs eagerly.
MAX_GRAPHS = 96


def graph_bucket(batch: int, width_blocks: int) -> tuple[int, int] | None:
    """The (batch, width) a step of `batch` decodes over `width_blocks` blocks pads to."""
    index = bisect.bisect_left(BATCH_BUCKETS, batch)
    if index == len(BATCH_BUCKETS):
        return None
    width = -(-max(1, width_blocks) // WIDTH_BUCKET_BLOCKS) * WIDTH_BUCKET_BLOCKS
    return BATCH_BUCKETS[index], width


@dataclass(slots=True)
class _StaticDecode:
    """One bucket's fixed input tensors, its output, and its graph (None when not captured)."""

    input_ids: torch.Tensor  # [batch]
    positions: torch.Tensor  # [batch]
    slot_mapping: torch.Tensor  # [batch]
    context_lens: torch.Tensor  # [batch]
    block_tables: torch.Tensor  # [batch, width]
    logits: torch.Tensor | None = None  # [batch, vocab], written by every run
    graph: torch.cuda.CUDAGraph | None = None


class DecodeGraphs:
    """Runs pure-decode steps through per-bucket static tensors (and CUDA graphs)."""

    def __init__(
        self,
        model: LlamaModel,
        kv_cache: torch.Tensor,
        block_size: int,
        scratch_block: int,
        *,
        capture: bool,
        decode_kernel: DecodeKernel | None = None,
    ):
        if scratch_block >= kv_cache.shape[2]:
            raise ValueError("the scratch block must be a block of the cache")
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.scratch_block = scratch_block
        self.capture = capture
        # Attends each row over its own blocks in place (no gather, no mask) where one runs.
        self.decode_kernel = decode_kernel
        self.device = kv_cache.device
        self._buckets: dict[tuple[int, int], _StaticDecode] = {}
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        # Set when a capture failed: every later step runs eagerly (the reason is kept for
        # the benchmark's report and the engine's log).
        self.disabled_reason: str | None = None
        # Steps served through the static path, and of those, graph replays.
        self.steps_served = 0
        self.replays = 0
        # Which SDPA kernels the captured graphs run ("default" or "math"), once one is.
        self.sdpa_backends: str | None = None

    @property
    def graphs_captured(self) -> int:
        return sum(entry.graph is not None for entry in self._buckets.values())

    def logits(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        context_lens: torch.Tensor,
        block_tables: torch.Tensor,
        width_blocks: int,
    ) -> torch.Tensor | None:
        """Logits [rows, vocab] of a pure-decode step (one token per row), or None when the
        step fits no bucket (the caller runs it eagerly). `block_tables`: [rows, >= width]."""
        if self.disabled_reason is not None:
            return None
        rows = input_ids.shape[0]
        bucket = graph_bucket(rows, width_blocks)
        if bucket is None:
            return None
        entry = self._buckets.get(bucket)
        if entry is None:
            if len(self._buckets) >= MAX_GRAPHS:
                return None
            entry = self._new_entry(*bucket)
        self._fill(entry, rows, input_ids, positions, slot_mapping, context_lens, block_tables)
        if entry.logits is None:
            if not self._prepare(entry, bucket):
                return None
        elif entry.graph is not None:
            entry.graph.replay()
            self.replays += 1
        else:
            entry.logits = self._forward(entry)
        assert entry.logits is not None
        self.steps_served += 1
        return entry.logits[:rows]

    def _new_entry(self, batch: int, width: int) -> _StaticDecode:
        def longs(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.long, device=self.device)

        entry = _StaticDecode(
            input_ids=longs(batch),
            positions=longs(batch),
            slot_mapping=longs(batch).fill_(self.scratch_block * self.block_size),
            context_lens=longs(batch).fill_(1),
            block_tables=longs(batch, width).fill_(self.scratch_block),
        )
        self._buckets[(batch, width)] = entry
        return entry

    def _fill(
        self,
        entry: _StaticDecode,
        rows: int,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        context_lens: torch.Tensor,
        block_tables: torch.Tensor,
    ) -> None:
        entry.input_ids[:rows].copy_(input_ids)
        entry.positions[:rows].copy_(positions)
        entry.slot_mapping[:rows].copy_(slot_mapping)
        entry.context_lens[:rows].copy_(context_lens)
        width = min(entry.block_tables.shape[1], block_tables.shape[1])
        entry.block_tables[:rows, :width].copy_(block_tables[:, :width])
        if rows < entry.input_ids.shape[0]:
            # Rows a larger step filled last time: back to the scratch slot and one key.
            entry.slot_mapping[rows:].fill_(self.scratch_block * self.block_size)
            entry.context_lens[rows:].fill_(1)

    def _forward(self, entry: _StaticDecode) -> torch.Tensor:
        """The padded step's forward over the entry's tensors (what a graph records)."""
        batch, width = entry.block_tables.shape
        if self.decode_kernel is not None:
            group = DecodeGroup(0, batch, entry.block_tables, None, entry.context_lens)
        else:
            # Made here, inside what a graph records (its memory then belongs to the graph):
            # a tensor kept and grown outside would leave older graphs reading freed memory.
            key_pos = torch.arange(width * self.block_size, device=self.device)
            visible = key_pos.unsqueeze(0) < entry.context_lens.unsqueeze(1)
            mask = additive_mask(visible, self.kv_cache.dtype).view(batch, 1, 1, -1)
            group = DecodeGroup(0, batch, entry.block_tables, mask)
        meta = PagedAttentionMetadata(entry.slot_mapping, (group,), ())
        # Buffers of its own: inside a capture they come from the graph's pool, and no other
        # forward may grow or reuse them.
        attention = PagedAttention(self.kv_cache, meta, GatherBuffers(), self.decode_kernel)
        hidden = self.model(entry.input_ids, entry.positions, attention)
        return self.model.compute_logits(hidden)

    def _prepare(self, entry: _StaticDecode, bucket: tuple[int, int]) -> bool:
        """First use of a bucket: capture its graph (or, without capture, just run it)."""
        if not self.capture:
            entry.logits = self._forward(entry)
            return True
        errors = []
        # SDPA's own choice first (cuDNN's kernel on an H100/H200); its math kernel (plain
        # matmuls and softmax, always capturable) if that cannot be captured.
        for backends in (None, [SDPBackend.MATH]):
            try:
                graph, logits = self._capture(entry, backends)
            except RuntimeError as error:
                errors.append(f"{backends or 'default'}: {error}")
                continue
            self.sdpa_backends = "default" if backends is None else "math"
            entry.graph, entry.logits = graph, logits
            graph.replay()
            self.replays += 1
            return True
        # No capture worked: stay eager from now on.
        self.disabled_reason = f"capture of bucket {bucket} failed: " + "; ".join(errors)
        self._buckets.clear()
        return False

    def _capture(
        self, entry: _StaticDecode, backends: list[SDPBackend] | None
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        chosen = sdpa_kernel(backends) if backends else contextlib.nullcontext()
        with chosen:
            # Warm on a side stream first (cuBLAS and cuDNN pick and cache their kernels on a
            # first call, which a capture must not record). It computes this very step, so its
            # K/V writes are the ones the replay makes again.
            side = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                self._forward(entry)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                logits = self._forward(entry)
        return graph, logits
