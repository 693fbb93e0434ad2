"""A step's input tensors built with vectorized ops, over block tables that persist across steps.

Each running sequence owns a row of one [rows, width] block-table tensor. A row is written
once per new block (the block manager only appends to a table, or clears it on free: the
table's epoch then changes and the row is rewritten), so a decode step copies no block ids
at all. Positions and slot mappings for the whole flattened batch come from a few tensor ops
over per-chunk (row, start, count) triples; the only Python per step is one pass over the
chunks to read those triples and their token ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.scheduler_output import ScheduledChunk
from engine.core.sequence import Sequence


@dataclass(slots=True)
class _Row:
    seq: Sequence
    index: int
    # Block ids of seq.block_table[:written] are in the tensor, for table epoch `epoch`.
    epoch: int
    written: int


class BlockTables:
    """Persistent block tables: one tensor row per sequence, appended to as blocks arrive.

    NOTE: rows are reclaimed lazily (from sequences absent from the step that needs a row)
    rather than on finish, so the executor needs no extra hook from the step loop; a row
    holds a reference to its Sequence, so `row.seq is seq` tells a reused request id apart.
    """

    def __init__(self, device: torch.device, rows: int = 16, width_blocks: int = 16):
        self.device = device
        self.table = torch.zeros(rows, width_blocks, dtype=torch.long, device=device)
        self._rows: dict[str, _Row] = {}
        self._free_rows = list(range(rows - 1, -1, -1))

    def rows_for(self, seqs: list[Sequence]) -> list[int]:
        """Each sequence's row, with its tail of new block ids written into the tensor."""
        widest = max(len(seq.block_table) for seq in seqs)
        if widest > self.table.shape[1]:
            self._widen(max(widest, 2 * self.table.shape[1]))
        rows = []
        for seq in seqs:
            row = self._rows.get(seq.seq_id)
            if row is None or row.seq is not seq:
                row = self._assign(seq, seqs)
            table = seq.block_table
            if row.epoch != seq.block_table_epoch:
                row.epoch, row.written = seq.block_table_epoch, 0
            if row.written != len(table):
                new = table[row.written :]
                self.table[row.index, row.written : len(table)] = torch.tensor(new)
                row.written = len(table)
            rows.append(row.index)
        return rows

    def _assign(self, seq: Sequence, step_seqs: list[Sequence]) -> _Row:
        old = self._rows.pop(seq.seq_id, None)
        if old is not None:
            self._free_rows.append(old.index)
        if not self._free_rows:
            self._reclaim({s.seq_id for s in step_seqs})
        row = _Row(seq, self._free_rows.pop(), seq.block_table_epoch, 0)
        self._rows[seq.seq_id] = row
        return row

    def _reclaim(self, live: set[str]) -> None:
        for seq_id in [s for s in self._rows if s not in live]:
            self._free_rows.append(self._rows.pop(seq_id).index)
        if not self._free_rows:  # every row is in this step: grow
            rows, width = self.table.shape
            grown = torch.zeros(2 * rows, width, dtype=torch.long, device=self.device)
            grown[:rows] = self.table
            self.table = grown
            self._free_rows = list(range(2 * rows - 1, rows - 1, -1))

    def _widen(self, width: int) -> None:
        rows, old = self.table.shape
        wide = torch.zeros(rows, width, dtype=torch.long, device=self.device)
        wide[:, :old] = self.table
        self.table = wide


@dataclass(frozen=True, slots=True)
class StepInputs:
    """The flattened batch: one entry per token, chunks laid end to end in `chunks` order."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    # Per chunk: its block-table row, first position, token count, and context length.
    rows: torch.Tensor
    row_ids: list[int]
    context_lens: torch.Tensor
    # Rows of the flattened batch whose logits are sampled, and the chunks they belong to.
    sample_rows: torch.Tensor | None
    sampling_chunks: list[ScheduledChunk]
    # Chunks of one token (the runner sorts them first: decode attention takes them).
    num_single_chunks: int

    @property
    def all_single(self) -> bool:
        """Every chunk is one token (pure decode): rows of the batch == chunks."""
        return self.num_single_chunks == len(self.row_ids)


class StepInputBuilder:
    """Builds StepInputs; owns the persistent block tables and a reusable arange."""

    def __init__(self, block_size: int, device: torch.device):
        self.block_size = block_size
        self.device = device
        self.block_tables = BlockTables(device)
        self._arange = torch.arange(1024, dtype=torch.long, device=device)

    def arange(self, n: int) -> torch.Tensor:
        """[0, n) as a view of a persistent tensor (no allocation once it is large enough)."""
        if n > self._arange.shape[0]:
            self._arange = torch.arange(max(n, 2 * self._arange.shape[0]), device=self.device)
        return self._arange[:n]

    def build(self, chunks: list[ScheduledChunk]) -> StepInputs:
        rows = self.block_tables.rows_for([c.seq for c in chunks])
        ids: list[int] = []
        starts, counts, sample_rows = [], [], []
        sampling = []
        total = singles = 0
        for chunk in chunks:
            ids += chunk.seq.token_ids[chunk.start_pos : chunk.end_pos]
            starts.append(chunk.start_pos)
            counts.append(chunk.num_tokens)
            total += chunk.num_tokens
            singles += chunk.num_tokens == 1
            if chunk.samples:
                sample_rows.append(total - 1)
                sampling.append(chunk)
        all_single = singles == len(chunks)
        # One host tensor for every per-chunk integer: a single copy to the device.
        packed = torch.tensor([rows, starts, counts], dtype=torch.long).to(self.device)
        row_t, start_t, count_t = packed[0], packed[1], packed[2]
        if all_single:
            positions, token_rows = start_t, row_t
        else:
            token_rows = torch.repeat_interleave(row_t, count_t, output_size=total)
            first_row = torch.cumsum(count_t, 0) - count_t
            offset = torch.repeat_interleave(start_t - first_row, count_t, output_size=total)
            positions = self.arange(total) + offset
        size = self.block_size
        blocks = self.block_tables.table[token_rows, positions // size]
        slots = blocks * size + positions % size
        if len(sample_rows) == total:
            picked = None  # every row samples: no index_select needed
        else:
            picked = torch.tensor(sample_rows, dtype=torch.long).to(self.device)
        return StepInputs(
            input_ids=torch.tensor(ids, dtype=torch.long).to(self.device),
            positions=positions,
            slot_mapping=slots,
            rows=row_t,
            row_ids=rows,
            context_lens=start_t + count_t,
            sample_rows=picked,
            sampling_chunks=sampling,
            num_single_chunks=singles,
        )
