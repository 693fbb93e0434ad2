"""Runs one step: one forward over a flattened batch mixing prefill chunks and decode tokens."""

from __future__ import annotations

import torch

from engine.attention import (
    DecodeGroup,
    GatherBuffers,
    PagedAttention,
    PagedAttentionMetadata,
    PrefillSpan,
)
from engine.model import LlamaModel
from engine.model_config import ModelConfig
from engine.sampler import Sampler
from engine.scheduler_output import ScheduledChunk, SchedulerOutput


def kv_block_bytes(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one KV block takes over all layers (K and V)."""
    element_bytes = torch.empty((), dtype=dtype).element_size()
    return (
        2
        * config.num_hidden_layers
        * block_size
        * config.num_key_value_heads
        * (config.head_dim * element_bytes)
    )


class ModelRunner:
    """Owns the model, the paged KV cache and the sampler; the executor of the torch engine."""

    def __init__(
        self,
        model: LlamaModel,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        seed: int,
    ):
        config = model.config
        self.model = model
        self.block_size = block_size
        self.device = device
        self.kv_cache = torch.zeros(
            config.num_hidden_layers,
            2,
            num_blocks,
            block_size,
            config.num_key_value_heads,
            config.head_dim,
            dtype=dtype,
            device=device,
        )
        self.sampler = Sampler(device, seed)
        self.gather_buffers = GatherBuffers()

    @torch.inference_mode()
    def execute(self, output: SchedulerOutput) -> dict[str, int]:
        """Run the step's forward and return the token sampled for each chunk that samples."""
        # Single-token chunks first, shortest context first: the attention backend batches
        # them by similar length.
        chunks = sorted(output.chunks, key=lambda c: (c.num_tokens != 1, c.end_pos))
        input_ids, positions, slots = self._flatten(chunks)
        meta = self._metadata(chunks, slots)
        attention = PagedAttention(self.kv_cache, meta, self.gather_buffers)
        hidden = self.model(input_ids, positions, attention)
        sample_rows, sampling = [], []
        row = 0
        for chunk in chunks:
            row += chunk.num_tokens
            if chunk.samples:
                sample_rows.append(row - 1)
                sampling.append(chunk)
        if not sampling:
            return {}
        rows = torch.tensor(sample_rows, device=self.device)
        logits = self.model.compute_logits(hidden.index_select(0, rows))
        ids = [c.seq.seq_id for c in sampling]
        tokens = self.sampler.sample(logits, ids, [c.seq.sampling for c in sampling])
        return dict(zip(ids, tokens, strict=True))

    def _flatten(
        self, chunks: list[ScheduledChunk]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        size = self.block_size
        for chunk in chunks:
            table = chunk.seq.block_table
            ids.extend(chunk.seq.token_ids[chunk.start_pos : chunk.end_pos])
            span = range(chunk.start_pos, chunk.end_pos)
            positions.extend(span)
            slots.extend(table[p // size] * size + p % size for p in span)
        device = self.device
        return (
            torch.tensor(ids, dtype=torch.long, device=device),
            torch.tensor(positions, dtype=torch.long, device=device),
            torch.tensor(slots, dtype=torch.long, device=device),
        )

    def _metadata(
        self, chunks: list[ScheduledChunk], slots: torch.Tensor
    ) -> PagedAttentionMetadata:
        singles = [c for c in chunks if c.num_tokens == 1]
        groups = []
        start = 0
        for group in _length_groups([self._blocks(c) for c in singles]):
            members = singles[start : start + group]
            groups.append(self._decode_group(members, start))
            start += group
        spans = []
        for chunk in chunks[len(singles) :]:
            table = torch.tensor(chunk.seq.block_table[: self._blocks(chunk)], device=self.device)
            mask = None
            if chunk.start_pos > 0:
                query_pos = torch.arange(chunk.start_pos, chunk.end_pos, device=self.device)
                key_pos = torch.arange(chunk.end_pos, device=self.device)
                mask = key_pos.unsqueeze(0) <= query_pos.unsqueeze(1)
            spans.append(PrefillSpan(start, start + chunk.num_tokens, chunk.end_pos, table, mask))
            start += chunk.num_tokens
        return PagedAttentionMetadata(slots, tuple(groups), tuple(spans))

    def _blocks(self, chunk: ScheduledChunk) -> int:
        return -(-chunk.end_pos // self.block_size)

    def _decode_group(self, members: list[ScheduledChunk], row_start: int) -> DecodeGroup:
        max_blocks = max(self._blocks(c) for c in members)
        padded = [
            c.seq.block_table[:max_blocks] + [0] * (max_blocks - len(c.seq.block_table))
            for c in members
        ]
        tables = torch.tensor(padded, dtype=torch.long, device=self.device)
        key_pos = torch.arange(max_blocks * self.block_size, device=self.device)
        lengths = torch.tensor([c.end_pos for c in members], device=self.device)
        mask = (key_pos.unsqueeze(0) < lengths.unsqueeze(1)).view(len(members), 1, 1, -1)
        return DecodeGroup(row_start, row_start + len(members), tables, mask)


def _length_groups(block_counts: list[int]) -> list[int]:
    """Split ascending block counts into runs whose padding stays small; returns run sizes.

    NOTE: one padded gather for every decode copies the longest context for each sequence;
    with mixed lengths that was nearly twice the blocks needed. A run closes once the next
    sequence needs more than 1.5x (+1) the blocks of the run's first.
    """
    sizes: list[int] = []
    first = -1
    for count in block_counts:
        if not sizes or count > first * 1.5 + 1:
            sizes.append(0)
            first = count
        sizes[-1] += 1
    return sizes
