"""Per-step records and the rolling rates admission reads from them."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from engine.core.step_cost_fit import StepCostFit
from policies.bulk_prefill_pace import BulkPrefillPace
from policies.request_class import RequestClass
from policies.step_cost import StepCost


@dataclass(frozen=True, slots=True)
class StepRecord:
    step_index: int
    started_s: float
    duration_s: float
    # Tokens scheduled by (class, "prefill" | "decode").
    tokens_by_kind: dict[tuple[RequestClass, str], int]
    running_by_class: dict[RequestClass, int]
    waiting_by_class: dict[RequestClass, int]
    kv_usage: float
    num_preemptions: int

    @property
    def num_tokens(self) -> int:
        return sum(self.tokens_by_kind.values())

    def tokens_of(self, kind: str) -> int:
        return sum(n for (_, k), n in self.tokens_by_kind.items() if k == kind)


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    """What admission and the dispatcher need to know about the engine, at one moment."""

    running_by_class: dict[RequestClass, int]
    waiting_by_class: dict[RequestClass, int]
    kv_usage: float
    num_free_blocks: int
    recent_step_s: float | None
    # Throughput over the recent window (None until steps of that kind were measured).
    prefill_tokens_per_s: float | None
    decode_tokens_per_s: float | None
    total_preemptions: int
    steps: int
    # Threads the engine core's steps run on now, where it adapts them to contention
    # (engine/process/thread_governor.py); None where the count is fixed.
    threads: int | None = None
    # The recent steps' time as fixed + per token (engine/core/step_cost_fit.py); None until
    # the window can tell the two apart.
    step_cost: StepCost | None = None
    # The pace of bulk prefill while bulk had prompts (`StepHistory.bulk_prefill_pace`); None
    # until measured.
    bulk_prefill: BulkPrefillPace | None = None


# Steps with bulk prefill work before their rate stands in for the envelope's chunk.
MIN_BULK_PREFILL_STEPS = 32


class StepHistory:
    """The last `capacity` steps, and throughput rates over them.

    NOTE: the async engine publishes a load snapshot after every step, so the rates are kept
    as running sums (added on append, taken off on eviction) rather than recomputed over the
    whole window each step.
    """

    KINDS = ("prefill", "decode")

    def __init__(self, capacity: int = 256):
        self.records: deque[StepRecord] = deque(maxlen=capacity)
        self.total_preemptions = 0
        self.total_steps = 0
        # Per kind: tokens of that kind, and seconds of the steps that carried any of them.
        self._tokens = dict.fromkeys(self.KINDS, 0)
        self._seconds = dict.fromkeys(self.KINDS, 0.0)
        self._cost_fit = StepCostFit()
        # Bulk prefill tokens, and the steps in which bulk had a prompt to prefill (count, time).
        self._bulk_prefill_tokens = 0
        self._bulk_prefill_steps = 0
        self._bulk_prefill_seconds = 0.0

    def add(self, record: StepRecord) -> None:
        if len(self.records) == self.records.maxlen:
            self._count(self.records[0], -1)
        self.records.append(record)
        self._count(record, +1)
        self.total_preemptions += record.num_preemptions
        self.total_steps += 1

    def _count(self, record: StepRecord, sign: int) -> None:
        self._cost_fit.add(record.num_tokens, record.duration_s, sign)
        bulk_prefill = record.tokens_by_kind.get((RequestClass.BULK, "prefill"), 0)
        if bulk_prefill or record.waiting_by_class.get(RequestClass.BULK, 0):
            self._bulk_prefill_tokens += sign * bulk_prefill
            self._bulk_prefill_steps += sign
            self._bulk_prefill_seconds += sign * record.duration_s
        for kind in self.KINDS:
            tokens = record.tokens_of(kind)
            if tokens:
                self._tokens[kind] += sign * tokens
                self._seconds[kind] += sign * record.duration_s

    def recent_step_s(self, window: int = 16) -> float | None:
        count = min(window, len(self.records))
        if not count:
            return None
        durations = sorted(self.records[-i].duration_s for i in range(1, count + 1))
        return durations[len(durations) // 2]

    def rate_tokens_per_s(self, kind: str) -> float | None:
        """Tokens of a kind per second of the steps that carried them.

        NOTE: a mixed step's time is charged to both kinds, so each rate is a lower bound of
        what that kind alone would get; admission errs on the side of rejecting.
        """
        seconds = self._seconds[kind]
        return self._tokens[kind] / seconds if seconds > 1e-12 else None

    def bulk_prefill_pace(self) -> BulkPrefillPace | None:
        """Bulk prompt tokens per step and the mean step time over the window's steps in which
        bulk had a prompt to prefill (some scheduled, or a bulk request waiting): the pace a
        bulk backlog's prompts drain at, with what else those steps carry (the running
        sequences' decodes, a chat's prefill, the steps that held bulk back for one). None
        before `MIN_BULK_PREFILL_STEPS` such steps, or with no bulk prefill in them.

        Measured, not derived from the envelope: its chunk (or the aged guarantee) is only a
        cap, and only while chats are present. In a simulated GPU-scale backlog (70B on 8
        H100s) the engine ran 62 bulk prefill tokens a step beside chats where admission
        assumed 103, and 260-430 once the chats stopped (the cap lifts)."""
        steps = self._bulk_prefill_steps
        if steps < MIN_BULK_PREFILL_STEPS or self._bulk_prefill_tokens <= 0:
            return None
        step_s = self._bulk_prefill_seconds / steps
        if step_s <= 0.0:
            return None  # steps of no measurable time (a clock's resolution, a test's records)
        return BulkPrefillPace(self._bulk_prefill_tokens / steps, step_s)

    def step_cost(self) -> StepCost | None:
        """The window's steps fit as fixed + per-token costs (None: not separable yet)."""
        return self._cost_fit.fit()
