"""Runs one step: one forward over a flattened batch mixing prefill chunks and decode tokens."""

from __future__ import annotations

import torch

from engine.attention import PagedAttention, PagedAttentionMetadata, PrefillSpan
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

    @torch.inference_mode()
    def execute(self, output: SchedulerOutput) -> dict[str, int]:
        """Run the step's forward and return the token sampled for each chunk that samples."""
        # Single-token chunks first: the attention backend batches them in one call.
        chunks = sorted(output.chunks, key=lambda c: c.num_tokens != 1)
        input_ids, positions, slots = self._flatten(chunks)
        meta = self._metadata(chunks, slots)
        hidden = self.model(input_ids, positions, PagedAttention(self.kv_cache, meta))
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
        tables = masks = None
        if singles:
            max_blocks = max(-(-c.end_pos // self.block_size) for c in singles)
            padded = [
                c.seq.block_table[:max_blocks] + [0] * (max_blocks - len(c.seq.block_table))
                for c in singles
            ]
            tables = torch.tensor(padded, dtype=torch.long, device=self.device)
            key_pos = torch.arange(max_blocks * self.block_size, device=self.device)
            lengths = torch.tensor([c.end_pos for c in singles], device=self.device)
            masks = (key_pos.unsqueeze(0) < lengths.unsqueeze(1)).view(len(singles), 1, 1, -1)
        spans = []
        start = len(singles)
        for chunk in chunks[len(singles) :]:
            num_blocks = -(-chunk.end_pos // self.block_size)
            table = torch.tensor(chunk.seq.block_table[:num_blocks], device=self.device)
            spans.append(PrefillSpan(start, start + chunk.num_tokens, chunk.end_pos, table))
            start += chunk.num_tokens
        return PagedAttentionMetadata(slots, len(singles), tables, masks, tuple(spans))
