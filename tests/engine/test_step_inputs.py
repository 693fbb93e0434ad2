"""Vectorized step inputs equal the per-token definition, across appends, frees and reused ids."""

from __future__ import annotations

import random

import torch

from engine.core.block_manager import BlockManager
from engine.core.request import RequestMetrics
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler_output import ScheduledChunk
from engine.core.sequence import Sequence
from engine.model.step_inputs import StepInputBuilder
from policies.request_class import RequestClass

CPU = torch.device("cpu")
BLOCK = 4


def _seq(seq_id: str, num_tokens: int, rng: random.Random) -> Sequence:
    return Sequence(
        seq_id=seq_id,
        request_class=RequestClass.INTERACTIVE,
        token_ids=[rng.randrange(250) for _ in range(num_tokens)],
        num_prompt_tokens=num_tokens,
        sampling=SamplingParams(),
        metrics=RequestMetrics(arrival_s=0.0),
    )


def _expected(chunks: list[ScheduledChunk]) -> tuple[list[int], list[int], list[int]]:
    ids, positions, slots = [], [], []
    for chunk in chunks:
        for pos in range(chunk.start_pos, chunk.end_pos):
            ids.append(chunk.seq.token_ids[pos])
            positions.append(pos)
            slots.append(chunk.seq.block_table[pos // BLOCK] * BLOCK + pos % BLOCK)
    return ids, positions, slots


def test_inputs_match_the_per_token_definition_over_many_steps() -> None:
    rng = random.Random(0)
    blocks = BlockManager(num_blocks=400, block_size=BLOCK, enable_prefix_caching=False)
    # Few rows and a narrow table to start with, so rows are reclaimed and the table grows.
    builder = StepInputBuilder(BLOCK, CPU)
    live: dict[str, Sequence] = {}
    next_id = 0
    checked_tokens = 0
    for _step in range(300):
        while len(live) < 24:
            # Ids are reused after a sequence ends: a new Sequence under an old id.
            seq_id = f"s{next_id % 40}"
            next_id += 1
            if seq_id not in live:
                live[seq_id] = _seq(seq_id, rng.randint(1, 40), rng)
        chunks = []
        for seq in rng.sample(list(live.values()), rng.randint(1, len(live))):
            if rng.random() < 0.05 and seq.block_table:
                blocks.free(seq)  # preempted: table cleared, recomputed from zero
            left = seq.num_tokens - seq.num_computed_tokens
            num = 1 if left == 0 else rng.randint(1, left)
            if left == 0:
                seq.token_ids.append(rng.randrange(250))
            assert blocks.allocate_slots(seq, num) is not None
            start = seq.num_computed_tokens
            chunks.append(ScheduledChunk(seq, start, num, start + num == seq.num_tokens))
        chunks.sort(key=lambda c: (c.num_tokens != 1, c.end_pos))
        inputs = builder.build(chunks)
        ids, positions, slots = _expected(chunks)
        assert inputs.input_ids.tolist() == ids
        assert inputs.positions.tolist() == positions
        assert inputs.slot_mapping.tolist() == slots
        assert inputs.context_lens.tolist() == [c.end_pos for c in chunks]
        assert inputs.all_single == all(c.num_tokens == 1 for c in chunks)
        assert inputs.num_single_chunks == sum(c.num_tokens == 1 for c in chunks)
        ends = [sum(c.num_tokens for c in chunks[: i + 1]) - 1 for i in range(len(chunks))]
        wanted_rows = [e for e, c in zip(ends, chunks, strict=True) if c.samples]
        got_rows = ends if inputs.sample_rows is None else inputs.sample_rows.tolist()
        if inputs.sample_rows is None:
            assert wanted_rows == ends
        assert got_rows == wanted_rows
        table = builder.block_tables.table
        for row, chunk in zip(inputs.rows.tolist(), chunks, strict=True):
            width = len(chunk.seq.block_table)
            assert table[row, :width].tolist() == chunk.seq.block_table
        checked_tokens += len(ids)
        for chunk in chunks:
            chunk.seq.num_computed_tokens = chunk.end_pos
            if chunk.seq.num_computed_tokens > 60:
                blocks.free(chunk.seq)
                del live[chunk.seq.seq_id]
    assert checked_tokens > 3_000
    assert builder.block_tables.table.shape[0] > 16  # grew past its first rows
