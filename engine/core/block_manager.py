"""Paged KV allocation: fixed-size blocks, a free list, ref counts, and prefix sharing.

Full, computed blocks are registered under a hash of their tokens chained to the previous
block's hash, so two sequences with the same prefix share the same physical blocks. A block
whose ref count drops to zero stays in the cache (and in the free list, least recently used
first) until its slot is needed again.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

from engine.core.sequence import Sequence


def hash_block(parent_hash: bytes, token_ids: list[int]) -> bytes:
    """Content hash of one block, chained to its prefix.

    NOTE: sha256 rather than Python's hash(): tenants share the cache, and a crafted prompt
    must not be able to collide with another tenant's prefix and read its K/V.
    """
    return hashlib.sha256(parent_hash + array("q", token_ids).tobytes()).digest()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be at least 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        # Free blocks, least recently freed first; those with a hash still hold reusable K/V.
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self._hash_to_block: dict[bytes, int] = {}
        self._block_hash: dict[int, bytes] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by running sequences (cached-but-free blocks count as free)."""
        return 1.0 - len(self._free) / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def match_prefix(self, seq: Sequence) -> int:
        """Attach cached blocks for the longest cached prefix of a sequence without blocks.

        Returns the number of tokens matched. The last token is never matched: its logits are
        needed, so it is always computed (and the block it lands in is never a shared one).
        """
        if seq.block_table:
            raise ValueError(f"sequence {seq.seq_id} already has blocks")
        if not self.enable_prefix_caching:
            return 0
        parent = b""
        matched_blocks = 0
        for start in range(0, seq.num_tokens - 1 - self.block_size + 1, self.block_size):
            block_hash = hash_block(parent, seq.token_ids[start : start + self.block_size])
            block = self._hash_to_block.get(block_hash)
            if block is None:
                break
            self._ref(block)
            seq.block_table.append(block)
            seq.block_hashes.append(block_hash)
            parent = block_hash
            matched_blocks += 1
        seq.num_computed_tokens = matched_blocks * self.block_size
        return seq.num_computed_tokens

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> list[int] | None:
        """Make room for `num_new_tokens` more computed tokens; all or nothing.

        Returns the newly allocated block ids (possibly empty), or None when the free list
        cannot cover them (the caller then preempts or waits).
        """
        needed = self.blocks_needed(seq.num_computed_tokens + num_new_tokens)
        missing = needed - len(seq.block_table)
        if missing <= 0:
            return []
        if missing > len(self._free):
            return None
        new_blocks = [self._take_free_block() for _ in range(missing)]
        seq.block_table.extend(new_blocks)
        return new_blocks

    def register_computed_blocks(self, seq: Sequence) -> None:
        """Hash the sequence's blocks that became full and computed, so others can share them."""
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        for index in range(len(seq.block_hashes), num_full):
            parent = seq.block_hashes[-1] if seq.block_hashes else b""
            start = index * self.block_size
            block_hash = hash_block(parent, seq.token_ids[start : start + self.block_size])
            seq.block_hashes.append(block_hash)
            block = seq.block_table[index]
            # An identical block computed concurrently may already be registered: keep that one.
            if block_hash not in self._hash_to_block and block not in self._block_hash:
                self._hash_to_block[block_hash] = block
                self._block_hash[block] = block_hash

    def free(self, seq: Sequence) -> None:
        """Release a sequence's blocks; tail blocks first so shared prefixes are evicted last."""
        for block in reversed(seq.block_table):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] < 0:
                raise RuntimeError(f"block {block} freed more often than allocated")
            if self.ref_counts[block] == 0:
                self._free[block] = None
        seq.block_table.clear()
        seq.block_table_epoch += 1
        seq.block_hashes.clear()
        seq.num_computed_tokens = 0

    def check_invariants(self) -> None:
        """Free list and ref counts agree (tests and debug builds call this after steps)."""
        for block, count in enumerate(self.ref_counts):
            if count < 0 or (count == 0) != (block in self._free):
                free = block in self._free
                raise AssertionError(f"block {block}: ref count {count}, free={free}")

    def _ref(self, block: int) -> None:
        if self.ref_counts[block] == 0:
            del self._free[block]
        self.ref_counts[block] += 1

    def _take_free_block(self) -> int:
        block, _ = self._free.popitem(last=False)
        old_hash = self._block_hash.pop(block, None)
        if old_hash is not None:
            del self._hash_to_block[old_hash]  # evicted: its K/V is about to be overwritten
        self.ref_counts[block] = 1
        return block
