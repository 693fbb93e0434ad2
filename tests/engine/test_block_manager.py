"""BlockManager: all-or-nothing allocation, ref counts, prefix sharing, eviction order."""

from __future__ import annotations

from engine.core.block_manager import BlockManager
from engine.core.request import RequestMetrics
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence
from policies.request_class import RequestClass


def make_seq(seq_id: str, tokens: list[int]) -> Sequence:
    return Sequence(
        seq_id=seq_id,
        request_class=RequestClass.BULK,
        token_ids=list(tokens),
        num_prompt_tokens=len(tokens),
        sampling=SamplingParams(),
        metrics=RequestMetrics(arrival_s=0.0),
    )


def compute(manager: BlockManager, seq: Sequence, num_tokens: int) -> None:
    assert manager.allocate_slots(seq, num_tokens) is not None
    seq.num_computed_tokens += num_tokens
    manager.register_computed_blocks(seq)


def test_allocation_is_all_or_nothing() -> None:
    manager = BlockManager(num_blocks=3, block_size=4)
    seq = make_seq("a", list(range(20)))
    assert manager.allocate_slots(seq, 13) is None  # needs 4 blocks
    assert seq.block_table == []
    assert manager.num_free_blocks == 3
    assert manager.allocate_slots(seq, 12) is not None
    assert len(seq.block_table) == 3 and manager.num_free_blocks == 0


def test_allocate_only_missing_blocks() -> None:
    manager = BlockManager(num_blocks=8, block_size=4)
    seq = make_seq("a", list(range(10)))
    first = manager.allocate_slots(seq, 3)
    assert first is not None and len(first) == 1
    seq.num_computed_tokens = 3
    assert manager.allocate_slots(seq, 1) == []  # still fits in the first block
    seq.num_computed_tokens = 4
    more = manager.allocate_slots(seq, 5)
    assert more is not None and len(more) == 2


def test_prefix_sharing_reuses_blocks_and_counts_refs() -> None:
    manager = BlockManager(num_blocks=10, block_size=4)
    prefix = list(range(100, 112))  # three full blocks
    first = make_seq("a", prefix + [1, 2])
    compute(manager, first, first.num_tokens)
    second = make_seq("b", prefix + [3])
    matched = manager.match_prefix(second)
    assert matched == 12
    assert second.block_table == first.block_table[:3]
    assert all(manager.ref_counts[b] == 2 for b in second.block_table)
    manager.free(first)
    assert all(manager.ref_counts[b] == 1 for b in second.block_table)
    manager.free(second)
    assert manager.num_free_blocks == 10
    manager.check_invariants()


def test_last_token_is_never_matched() -> None:
    manager = BlockManager(num_blocks=10, block_size=4)
    tokens = list(range(8))
    first = make_seq("a", tokens)
    compute(manager, first, 8)
    same = make_seq("b", tokens)
    # Both blocks are cached, but the last token's logits are needed: only block 0 matches.
    assert manager.match_prefix(same) == 4


def test_different_prefix_does_not_match() -> None:
    manager = BlockManager(num_blocks=10, block_size=4)
    first = make_seq("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    compute(manager, first, 9)
    other = make_seq("b", [1, 2, 3, 99, 5, 6, 7, 8, 9])
    assert manager.match_prefix(other) == 0
    # Same second block but a different first block: the chain hash must not match it.
    shifted = make_seq("c", [9, 9, 9, 9, 5, 6, 7, 8, 1])
    assert manager.match_prefix(shifted) == 0


def test_freed_cached_blocks_are_reused_until_evicted() -> None:
    manager = BlockManager(num_blocks=4, block_size=2)
    first = make_seq("a", [1, 2, 3, 4, 5])
    compute(manager, first, 5)
    manager.free(first)
    again = make_seq("b", [1, 2, 3, 4, 6])
    assert manager.match_prefix(again) == 4  # still cached after free
    manager.free(again)
    filler = make_seq("c", list(range(50, 58)))
    assert manager.allocate_slots(filler, 8) is not None  # takes all four blocks: evicts
    manager.free(filler)
    late = make_seq("d", [1, 2, 3, 4, 7])
    assert manager.match_prefix(late) == 0


def test_tail_blocks_are_evicted_before_the_prefix() -> None:
    manager = BlockManager(num_blocks=4, block_size=2)
    first = make_seq("a", [1, 2, 3, 4, 5, 6, 7])
    compute(manager, first, 7)
    manager.free(first)
    filler = make_seq("f", [9, 9, 9, 9])
    # Takes two blocks: the unhashed partial block [7] and the cached tail block [5, 6].
    assert manager.allocate_slots(filler, 4) is not None
    again = make_seq("b", [1, 2, 3, 4, 5, 6, 8])
    assert manager.match_prefix(again) == 4  # blocks [1, 2] and [3, 4] survived


def test_free_restores_every_block() -> None:
    manager = BlockManager(num_blocks=16, block_size=4)
    seqs = [make_seq(str(i), list(range(i, i + 9))) for i in range(5)]
    for seq in seqs:
        compute(manager, seq, 9)
    assert manager.num_free_blocks == 1
    for seq in seqs:
        manager.free(seq)
    assert manager.num_free_blocks == 16 and manager.usage == 0.0
    manager.check_invariants()
