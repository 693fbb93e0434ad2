"""A sequence: one request's tokens, how many of them have K/V in the cache, and its blocks."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from engine.core.request import RequestMetrics
from engine.core.sampling_params import SamplingParams
from policies.request_class import RequestClass


class SequenceStatus(Enum):
    WAITING = "waiting"  # new, or preempted (its blocks freed, to be recomputed)
    RUNNING = "running"  # holds KV blocks; gets a chunk or a decode token each step it fits
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    """No prefill/decode phase flag: `num_computed_tokens` catches up with `num_tokens`."""

    seq_id: str
    request_class: RequestClass
    token_ids: list[int]
    num_prompt_tokens: int
    sampling: SamplingParams
    metrics: RequestMetrics
    # Tokens whose K/V are in this sequence's blocks (prefix-cache hits included).
    num_computed_tokens: int = 0
    # Physical KV block ids, in order; block i holds tokens [i*block_size, (i+1)*block_size).
    block_table: list[int] = field(default_factory=list)
    # Bumped whenever block_table is cleared (blocks are otherwise only appended), so a
    # persistent copy of the table (engine/model/step_inputs.py) knows to rewrite it.
    block_table_epoch: int = 0
    # Content hashes of this sequence's full, computed blocks (prefix caching).
    block_hashes: list[bytes] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    # Engine admission order, for "oldest first" and "youngest preempted first".
    admit_order: int = 0
    # Sampled tokens so far decode to no text (a multi-byte character's first bytes, a held-
    # back stop string): the client's first token is still to come. Only for detokenized ones.
    awaits_first_text: bool = False

    @property
    def arrival_s(self) -> float:
        return self.metrics.arrival_s

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_decoding(self) -> bool:
        """True when the only token left to compute is the last sampled one."""
        return self.num_output_tokens > 0 and self.num_uncomputed_tokens == 1

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
