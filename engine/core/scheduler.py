"""Class-aware continuous batching: which tokens of which sequences run in the next step.

Each step fills `step_token_budget` with at most `max_active_seqs` running bulk sequences, and
interactive ones beside them up to `max_running_seqs` (the overcommit): interactive decodes,
bulk decodes, interactive prefill chunks (oldest first), then bulk prefill chunks capped per
step (see policies/step_budget.py for the split; whether the cap holds with no interactive
sequence in: policies/interactive_presence.py). A step for a chat's first token (its prefill,
or a decode whose tokens made no text yet) leaves bulk out, decodes too, unless the step before
did (`defers_bulk`). When KV blocks run out a sequence is preempted by recompute: bulk first,
youngest first; an interactive sequence is never preempted to make room for bulk.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, deque
from collections.abc import Iterator

from engine.core.block_manager import BlockManager
from engine.core.config import EngineConfig
from engine.core.scheduler_output import Preemption, SchedulerOutput
from engine.core.sequence import Sequence, SequenceStatus
from engine.core.step_invariants import check_step
from engine.core.step_state import StepState, tokens_by_kind
from policies.bulk_guarantee import bulk_owed_after_step
from policies.interactive_presence import InteractivePresence
from policies.request_class import RequestClass
from policies.scheduling_policy import SchedulingPolicy
from policies.step_budget import (
    StepBudgetPlan,
    bulk_prefill_cap_after_interactive,
    defers_bulk,
    owes_bulk_share,
    plan_step_budget,
)

INTERACTIVE, BULK = RequestClass.INTERACTIVE, RequestClass.BULK


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager):
        self.config = config
        self.blocks = block_manager
        # Waiting sequences per class, sorted by admit order (FCFS; a preempted one returns).
        self.waiting: dict[RequestClass, deque[Sequence]] = {INTERACTIVE: deque(), BULK: deque()}
        self.running: list[Sequence] = []
        # Every unfinished sequence by id (abort without a scan), per-class counts by the
        # sequence's own class, and waiting prompt tokens per queue, all kept as they change.
        # NOTE: a waiting sequence's tokens do not change while it waits: the sums stay exact.
        self._by_id: dict[str, Sequence] = {}
        self._running_count: Counter[RequestClass] = Counter()
        self._waiting_count: Counter[RequestClass] = Counter()
        self._waiting_tokens: Counter[RequestClass] = Counter()
        self._next_admit_order = 0
        self._step_index = 0
        self.policy = SchedulingPolicy(config.scheduling_policy)
        self._interactive_presence = InteractivePresence(config.interactive_linger_s)
        # Whether the last step deferred bulk (`defers_bulk`), and what aged bulk is owed
        # (policies/bulk_guarantee.py).
        self._bulk_deferred_last_step = False
        self._bulk_owed_tokens = 0

    def queue_of(self, seq: Sequence) -> RequestClass:
        """The class the scheduler treats a sequence as: its own, or one for all under fcfs."""
        return seq.request_class if self.policy.has_classes else INTERACTIVE

    # -- bookkeeping -------------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        seq.admit_order = self._next_admit_order
        self._next_admit_order += 1
        seq.status = SequenceStatus.WAITING
        self._by_id[seq.seq_id] = seq
        self.waiting[self.queue_of(seq)].append(seq)
        self._counted_waiting(seq, 1)

    def abort(self, seq_id: str) -> Sequence | None:
        seq = self._by_id.get(seq_id)
        if seq is None:
            return None
        if seq.status is SequenceStatus.RUNNING:
            self.finish(seq, "abort")
        else:
            self.waiting[self.queue_of(seq)].remove(seq)
            self._counted_waiting(seq, -1)
            self._mark_finished(seq, "abort")
        return seq

    def finish(self, seq: Sequence, reason: str) -> None:
        self._remove_running(seq)
        self._mark_finished(seq, reason)

    def _counted_waiting(self, seq: Sequence, sign: int) -> None:
        self._waiting_count[seq.request_class] += sign
        self._waiting_tokens[self.queue_of(seq)] += sign * seq.num_tokens

    def _remove_running(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._running_count[seq.request_class] -= 1

    def _mark_finished(self, seq: Sequence, reason: str) -> None:
        self._by_id.pop(seq.seq_id, None)
        self.blocks.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def has_unfinished(self) -> bool:
        return bool(self.running or self.waiting[INTERACTIVE] or self.waiting[BULK])

    def num_running(self, request_class: RequestClass) -> int:
        return self._running_count[request_class]

    def num_waiting(self, request_class: RequestClass) -> int:
        return self._waiting_count[request_class]

    # -- the step ----------------------------------------------------------------------------

    def schedule(self, now_s: float) -> SchedulerOutput:
        state = StepState(self.config.step_token_budget)
        self._schedule_decodes(INTERACTIVE, state)
        bulk_aged = self._bulk_aged(now_s)
        defer_bulk = self.policy.caps_bulk_prefill and defers_bulk(
            first_token_pending=self._interactive_first_token_pending(),
            deferred_last_step=self._bulk_deferred_last_step,
        )
        if not defer_bulk:
            self._schedule_decodes(BULK, state)
        interactive_demand_tokens = self._prefill_demand_tokens(INTERACTIVE)
        plan = self._plan(state, now_s, bulk_aged, defer_bulk, interactive_demand_tokens)
        interactive_decode_tokens = self._tokens(state, INTERACTIVE)
        self._schedule_prefills(
            INTERACTIVE, plan.interactive_prefill_limit_tokens, state, now_s, bulk_aged
        )
        interactive_prefill_tokens = self._tokens(state, INTERACTIVE) - interactive_decode_tokens
        # NOTE: a pending interactive prompt gets in by preempting unaged bulk; if one still
        # does not, this step runs without bulk all the same, and the next one does not defer.
        bulk_prefill_cap = plan.bulk_prefill_cap_tokens
        if self.policy.caps_bulk_prefill:
            bulk_prefill_cap = bulk_prefill_cap_after_interactive(
                plan, interactive_prefill_tokens=interactive_prefill_tokens, deferred=defer_bulk
            )
        self._schedule_prefills(BULK, bulk_prefill_cap, state, now_s, bulk_aged)
        self._bulk_deferred_last_step = defer_bulk
        self._bulk_owed_tokens = bulk_owed_after_step(
            owed_tokens=self._bulk_owed_tokens,
            step_token_budget=self.config.step_token_budget,
            bulk_min_share=self.config.bulk_min_share,
            accrues=owes_bulk_share(
                bulk_aged=bulk_aged,
                interactive_prefill_demand_tokens=interactive_demand_tokens,
                deferred=defer_bulk,
            ),
            bulk_tokens_run=self._tokens(state, BULK),
        )

        chunks = sorted(state.chunks.values(), key=lambda c: not c.is_decode)
        output = SchedulerOutput(
            step_index=self._step_index,
            chunks=tuple(chunks),
            preemptions=tuple(state.preemptions),
            bulk_guaranteed_tokens=plan.bulk_guaranteed_tokens,
            tokens_by_kind=tokens_by_kind(chunks),
        )
        self._step_index += 1
        check_step(
            output,
            self.config,
            running=self.running,
            running_bulk_seqs=self._running_count[BULK],
            block_size_tokens=self.blocks.block_size,
        )
        return output

    def _schedule_decodes(self, request_class: RequestClass, state: StepState) -> None:
        for seq in self._running(request_class, decoding=True):
            if seq.status is SequenceStatus.RUNNING and self._reserve_running(seq, 1, state):
                state.add(seq, 1)

    def _plan(
        self, state: StepState, now_s: float, bulk_aged: bool, deferred: bool, demand_tokens: int
    ) -> StepBudgetPlan:
        return plan_step_budget(
            step_token_budget=self.config.step_token_budget,
            interactive_decode_tokens=self._tokens(state, INTERACTIVE),
            bulk_decode_tokens=self._tokens(state, BULK),
            bulk_prefill_demand_tokens=self._prefill_demand_tokens(BULK),
            interactive_prefill_demand_tokens=demand_tokens,
            bulk_aged=bulk_aged,
            # Without the cap (priority, fcfs) bulk prefill takes whatever budget is left.
            bulk_prefill_chunk_tokens=(
                self.config.bulk_prefill_chunk_tokens
                if self.policy.caps_bulk_prefill
                else self.config.step_token_budget
            ),
            bulk_min_share=self.config.bulk_min_share,
            bulk_owed_tokens=self._bulk_owed_tokens,
            deferred=deferred,
            # Counted by the sequences' own class: without classes (fcfs) the cap is off anyway;
            # with none in, held or lifted as interactive_linger_s says.
            interactive_present=self._interactive_presence.observe(
                bool(self.waiting[INTERACTIVE]) or self._running_count[INTERACTIVE] > 0, now_s
            ),
        )

    def _interactive_first_token_pending(self) -> bool:
        """An interactive prompt waits or is in its prefill, or its sampled tokens make no text
        yet (`defers_bulk`: the client's first token is its first text)."""
        return bool(self.waiting[INTERACTIVE]) or any(
            self.queue_of(s) is INTERACTIVE and (not s.is_decoding or s.awaits_first_text)
            for s in self.running
        )

    def update(self, output: SchedulerOutput, sampled: dict[str, int], now_s: float) -> None:
        """Advance computed tokens, register full blocks, append sampled tokens."""
        self._interactive_presence.step_ended(now_s)
        for chunk in output.chunks:
            seq = chunk.seq
            if seq.status is not SequenceStatus.RUNNING:
                continue  # aborted between schedule and update
            seq.num_computed_tokens = chunk.end_pos
            self.blocks.register_computed_blocks(seq)
            if chunk.samples:
                seq.token_ids.append(sampled[seq.seq_id])
                if seq.metrics.first_token_s is None:
                    seq.metrics.first_token_s = now_s
                seq.metrics.token_times_s.append(now_s)

    # -- prefill -----------------------------------------------------------------------------

    def _schedule_prefills(
        self,
        request_class: RequestClass,
        limit_tokens: int,
        state: StepState,
        now_s: float,
        bulk_aged: bool,
    ) -> None:
        tokens_left = min(limit_tokens, state.budget_left_tokens)
        for seq in self._running(request_class, decoding=False):
            if tokens_left <= 0:
                return
            if seq.status is not SequenceStatus.RUNNING or seq.seq_id in state.chunks:
                continue
            num = self._fit_chunk(seq, min(seq.num_uncomputed_tokens, tokens_left))
            if num == 0 and self._reserve_running(seq, 1, state):
                num = 1  # memory is full: preemption made room for at least one token
            if num > 0:
                state.add(seq, num)
                tokens_left -= num
        queue = self.waiting[request_class]
        while queue and tokens_left > 0:
            num = self._admit(queue[0], state, bulk_aged, tokens_left)
            if num == 0:
                return
            seq = queue.popleft()
            self._counted_waiting(seq, -1)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self._running_count[seq.request_class] += 1
            if seq.metrics.first_scheduled_s is None:
                seq.metrics.first_scheduled_s = now_s
                seq.metrics.num_cached_prompt_tokens = seq.num_computed_tokens
            state.add(seq, num)
            tokens_left -= num
            tokens_left = min(tokens_left, state.budget_left_tokens)

    def _admit(self, seq: Sequence, state: StepState, bulk_aged: bool, max_tokens: int) -> int:
        """Give a waiting sequence a slot and blocks for its next chunk; 0 leaves it waiting."""
        interactive = self.queue_of(seq) is INTERACTIVE
        bulk_running = sum(1 for s in self.running if self.queue_of(s) is BULK)
        # Interactive admission may preempt bulk (youngest first). Once bulk has aged it keeps
        # a floor of running sequences, so its guaranteed share has someone to go to.
        # NOTE: without preemption here, slow (capped) bulk prefills hold every slot but the
        # reserved ones, and a burst of chats waits for bulk jobs to finish: measured 1.1 s
        # TTFT p50 vs 60 ms with it, under a 400-job backlog.
        bulk_floor = self._bulk_floor_seqs() if bulk_aged else 0
        may_preempt_bulk = interactive and self.policy.preempts_to_admit
        # With no bulk running at all, aged bulk gets the last free slot.
        leave_slot_for_bulk = (
            interactive and bulk_aged and bulk_running == 0 and bool(self.waiting[BULK])
        )
        if leave_slot_for_bulk and len(self.running) >= self.config.max_active_seqs - 1:
            return 0

        def preempt_bulk() -> bool:
            running_bulk = sum(1 for s in self.running if self.queue_of(s) is BULK)
            if not may_preempt_bulk or running_bulk <= bulk_floor:
                return False
            return self._preempt_youngest(BULK, None, state, INTERACTIVE)

        if interactive:
            # Overcommit first: slots above bulk's cap take nothing from running bulk work.
            while len(self.running) >= self.config.max_running_seqs:
                if not preempt_bulk():
                    return 0
        elif (
            bulk_running >= self.config.max_active_seqs
            or len(self.running) >= self.config.max_running_seqs
        ):
            return 0
        if not seq.block_table:
            self.blocks.match_prefix(seq)
        num = min(seq.num_uncomputed_tokens, max_tokens)
        while self.blocks.allocate_slots(seq, num) is None:
            if not preempt_bulk():
                self.blocks.free(seq)  # undo the prefix match; it stays waiting
                return 0
        return num

    def _fit_chunk(self, seq: Sequence, wanted: int) -> int:
        """The largest chunk up to `wanted` that the free blocks cover without preemption."""
        free_slots = (len(seq.block_table) + self.blocks.num_free_blocks) * self.blocks.block_size
        num = max(0, min(wanted, free_slots - seq.num_computed_tokens))
        if num and self.blocks.allocate_slots(seq, num) is None:
            raise RuntimeError("free-block arithmetic disagrees with the block manager")
        return num

    # -- preemption --------------------------------------------------------------------------

    def _reserve_running(self, seq: Sequence, num_tokens: int, state: StepState) -> bool:
        """Blocks for a running sequence, preempting if needed; False if it preempted itself."""
        while self.blocks.allocate_slots(seq, num_tokens) is None:
            own = self.queue_of(seq)
            if self._preempt_youngest(BULK, seq, state, own):
                continue
            if own is INTERACTIVE and self._preempt_youngest(INTERACTIVE, seq, state, own):
                continue
            self._preempt(seq, state, own)
            return False
        return True

    def _preempt_youngest(
        self,
        victim_class: RequestClass,
        for_seq: Sequence | None,
        state: StepState,
        beneficiary: RequestClass,
    ) -> bool:
        """Preempt the youngest running sequence of a class (younger than `for_seq` if given)."""
        if victim_class is INTERACTIVE and beneficiary is BULK:
            raise RuntimeError("an interactive sequence is never preempted for bulk")
        candidates = [
            s
            for s in self.running
            if self.queue_of(s) is victim_class
            and s is not for_seq
            and (
                for_seq is None
                or self.queue_of(s) is not self.queue_of(for_seq)
                or s.admit_order > for_seq.admit_order
            )
        ]
        if not candidates:
            return False
        self._preempt(max(candidates, key=lambda s: s.admit_order), state, beneficiary)
        return True

    def _preempt(self, seq: Sequence, state: StepState, beneficiary: RequestClass) -> None:
        state.take_back(seq)
        self._remove_running(seq)
        self.blocks.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.metrics.num_preemptions += 1
        queue = self.waiting[self.queue_of(seq)]
        queue.insert(bisect.bisect(queue, seq.admit_order, key=lambda s: s.admit_order), seq)
        self._counted_waiting(seq, 1)
        state.preemptions.append(Preemption(seq.seq_id, seq.request_class, beneficiary))

    # -- helpers -----------------------------------------------------------------------------

    def _running(self, request_class: RequestClass, *, decoding: bool) -> Iterator[Sequence]:
        matching = [
            s
            for s in self.running
            if self.queue_of(s) is request_class and s.is_decoding == decoding
        ]
        yield from sorted(matching, key=lambda s: s.admit_order)

    def _tokens(self, state: StepState, request_class: RequestClass) -> int:
        chunks = state.chunks.values()
        return sum(c.num_tokens for c in chunks if self.queue_of(c.seq) is request_class)

    def _bulk_floor_seqs(self) -> int:
        """Bulk sequences kept running once bulk has aged (its min share, in slots, >= 1)."""
        return max(1, math.ceil(self.config.bulk_min_share * self.config.max_active_seqs))

    def _bulk_aged(self, now_s: float) -> bool:
        """Bulk prefill work that has waited past the aging threshold since it arrived."""
        threshold_s = now_s - self.config.bulk_aging_s
        if not self.policy.ages_bulk:
            return False
        pending = [s for s in self.running if s.request_class is BULK and not s.is_decoding]
        return any(s.arrival_s <= threshold_s for s in pending) or any(
            s.arrival_s <= threshold_s for s in self.waiting[BULK]
        )

    def _prefill_demand_tokens(self, queue: RequestClass) -> int:
        running = [s for s in self.running if self.queue_of(s) is queue and not s.is_decoding]
        return sum(s.num_uncomputed_tokens for s in running) + self._waiting_tokens[queue]
