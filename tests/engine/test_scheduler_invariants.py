"""Budget invariants of the class-aware scheduler over randomized workloads (no model needed).

A fake executor samples a random token for every chunk that reaches the end of its sequence,
so thousands of steps run in milliseconds against the real Scheduler and BlockManager.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from engine.core.block_manager import BlockManager
from engine.core.config import EngineConfig
from engine.core.request import RequestMetrics
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler
from engine.core.scheduler_output import SchedulerOutput
from engine.core.sequence import Sequence, SequenceStatus
from policies.request_class import RequestClass

INTERACTIVE, BULK = RequestClass.INTERACTIVE, RequestClass.BULK


@dataclass
class Harness:
    config: EngineConfig
    num_blocks: int
    seed: int
    now_s: float = 0.0
    step_s: float = 0.05
    rng: random.Random = field(init=False)
    blocks: BlockManager = field(init=False)
    scheduler: Scheduler = field(init=False)
    counter: int = 0
    finished: list[Sequence] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.blocks = BlockManager(self.num_blocks, self.config.block_size_tokens)
        self.scheduler = Scheduler(self.config, self.blocks)

    def add(self, request_class: RequestClass, prompt_len: int, max_tokens: int) -> Sequence:
        self.counter += 1
        prompt = [self.rng.randrange(50) for _ in range(prompt_len)]
        seq = Sequence(
            seq_id=f"{request_class.value}-{self.counter}",
            request_class=request_class,
            token_ids=prompt,
            num_prompt_tokens=prompt_len,
            sampling=SamplingParams(max_tokens=max_tokens),
            metrics=RequestMetrics(arrival_s=self.now_s),
        )
        self.scheduler.add(seq)
        return seq

    def step(self) -> SchedulerOutput:
        output = self.scheduler.schedule(self.now_s)
        sampled = {c.seq.seq_id: self.rng.randrange(50) for c in output.chunks if c.samples}
        self.now_s += self.step_s
        self.scheduler.update(output, sampled, self.now_s)
        for chunk in output.chunks:
            seq = chunk.seq
            if chunk.samples and seq.num_output_tokens >= seq.sampling.max_tokens:
                self.scheduler.finish(seq, "length")
                self.finished.append(seq)
        self.blocks.check_invariants()
        return output


def decoding_interactive(scheduler: Scheduler) -> set[str]:
    return {s.seq_id for s in scheduler.running if s.request_class is INTERACTIVE and s.is_decoding}


@pytest.mark.parametrize("overcommit", [0, 2])
@pytest.mark.parametrize("seed", range(8))
def test_budget_slots_and_class_rules_hold_every_step(seed: int, overcommit: int) -> None:
    config = EngineConfig(
        max_active_seqs=6,
        interactive_overcommit_seqs=overcommit,
        step_token_budget=24,
        bulk_prefill_chunk_tokens=8,
        bulk_min_share=0.25,
        bulk_aging_s=0.5,
        block_size_tokens=4,
    )
    h = Harness(config, num_blocks=48, seed=seed)
    for _ in range(400):
        if h.rng.random() < 0.3:
            request_class = INTERACTIVE if h.rng.random() < 0.5 else BULK
            h.add(request_class, h.rng.randint(1, 40), h.rng.randint(1, 12))
        if h.rng.random() < 0.03 and h.scheduler.running:
            victim = h.rng.choice(h.scheduler.running)
            assert h.scheduler.abort(victim.seq_id) is victim
        must_decode = decoding_interactive(h.scheduler)
        bulk_present = any(s.request_class is BULK for s in h.scheduler.running)
        output = h.step()

        assert output.num_scheduled_tokens <= config.step_token_budget
        assert len(h.scheduler.running) <= config.max_active_seqs + overcommit
        bulk_running = sum(1 for s in h.scheduler.running if s.request_class is BULK)
        assert bulk_running <= config.max_active_seqs
        for preemption in output.preemptions:
            assert not (
                preemption.victim_class is INTERACTIVE and preemption.beneficiary_class is BULK
            ), "an interactive sequence was preempted for bulk"
        scheduled = {c.seq.seq_id for c in output.chunks}
        preempted_for_interactive = {p.seq_id for p in output.preemptions}
        if bulk_present:
            # Every decoding interactive sequence got its token (unless KV pressure among
            # interactive sequences themselves preempted it: never for bulk, checked above).
            assert must_decode <= scheduled | preempted_for_interactive
    assert h.finished, "the workload should finish requests"


def test_no_leaked_blocks_after_everything_finishes_or_aborts() -> None:
    config = EngineConfig(max_active_seqs=4, step_token_budget=16, block_size_tokens=4)
    h = Harness(config, num_blocks=30, seed=7)
    seqs = [h.add(INTERACTIVE if i % 2 else BULK, 5 + 3 * i, 6) for i in range(10)]
    for step in range(200):
        if step == 3:
            assert h.scheduler.abort(seqs[0].seq_id) is not None  # mid-prefill or decode
        if step == 6:
            h.scheduler.abort(seqs[9].seq_id)  # possibly still waiting
        if not h.scheduler.has_unfinished():
            break
        h.step()
    assert not h.scheduler.has_unfinished()
    assert h.blocks.num_free_blocks == 30
    assert all(s.status is SequenceStatus.FINISHED for s in seqs)


def run_flood(bulk_min_share: float, steps: int) -> tuple[Harness, list[SchedulerOutput]]:
    """A steady interactive flood of long prompts over a bulk backlog."""
    config = EngineConfig(
        max_active_seqs=8,
        step_token_budget=64,
        bulk_prefill_chunk_tokens=16,
        bulk_min_share=bulk_min_share,
        bulk_aging_s=1.0,
        block_size_tokens=8,
    )
    h = Harness(config, num_blocks=400, seed=3)
    bulk = [h.add(BULK, 120, 1) for _ in range(4)]
    outputs = []
    for _ in range(steps):
        for _ in range(2):
            h.add(INTERACTIVE, 96, 2)
        outputs.append(h.step())
    return h, [o for o in outputs if o.chunks and bulk]


def test_aged_bulk_gets_its_min_share_under_an_interactive_flood() -> None:
    h, outputs = run_flood(bulk_min_share=0.25, steps=300)
    guaranteed_steps = [o for o in outputs if o.bulk_guaranteed_tokens > 0]
    assert guaranteed_steps, "bulk should age during the flood"
    for output in guaranteed_steps:
        bulk_tokens = output.tokens_for(BULK)
        bulk_running = any(c.seq.request_class is BULK for c in output.chunks)
        if bulk_running:
            remaining = min(
                c.seq.num_uncomputed_tokens for c in output.chunks if c.seq.request_class is BULK
            )
            assert bulk_tokens >= min(output.bulk_guaranteed_tokens, remaining)
    finished_bulk = [s for s in h.finished if s.request_class is BULK]
    assert len(finished_bulk) == 4, "aged bulk must finish while the flood goes on"


def test_without_a_min_share_the_same_flood_starves_bulk() -> None:
    # The contrast that shows the previous test measures something: no share, no progress.
    h, _ = run_flood(bulk_min_share=0.0, steps=300)
    assert not [s for s in h.finished if s.request_class is BULK]


def test_interactive_decodes_preempt_bulk_when_blocks_run_out() -> None:
    config = EngineConfig(max_active_seqs=4, step_token_budget=64, block_size_tokens=4)
    h = Harness(config, num_blocks=10, seed=1)
    chat = h.add(INTERACTIVE, 4, 20)
    h.step()  # chat prefilled and decoding
    bulk = h.add(BULK, 30, 4)
    preempted: list[str] = []
    for _ in range(30):
        output = h.step()
        preempted += [p.seq_id for p in output.preemptions]
        if chat.is_finished:
            break
    assert chat.is_finished and chat.metrics.num_preemptions == 0
    assert bulk.seq_id in preempted


def test_fcfs_serves_in_arrival_order_whatever_the_class() -> None:
    config = EngineConfig(
        max_active_seqs=4,
        step_token_budget=32,
        bulk_prefill_chunk_tokens=4,
        block_size_tokens=4,
        scheduling_policy="fcfs",
    )
    h = Harness(config, num_blocks=100, seed=2)
    bulk = h.add(BULK, 40, 2)
    chat = h.add(INTERACTIVE, 8, 2)
    output = h.step()
    # No classes and no bulk cap: the older bulk prompt takes the whole budget first.
    assert [c.seq.seq_id for c in output.chunks] == [bulk.seq_id]
    assert output.tokens_for(BULK) == 32
    assert chat.metrics.first_scheduled_s is None


def test_mixgate_caps_bulk_prefill_beside_a_chat_where_priority_does_not() -> None:
    def bulk_prefill_tokens(policy: str, *, with_chat: bool, linger_s: float | None = 0.0) -> int:
        config = EngineConfig(
            max_active_seqs=4,
            step_token_budget=32,
            bulk_prefill_chunk_tokens=4,
            block_size_tokens=4,
            scheduling_policy=policy,
            interactive_linger_s=linger_s,
        )
        h = Harness(config, num_blocks=100, seed=2)
        if with_chat:
            h.add(INTERACTIVE, 4, 50)
            h.step()  # its prefill step; from now on the chat decodes
        h.add(BULK, 40, 2)
        return h.step().tokens_by_kind.get((BULK, "prefill"), 0)

    assert bulk_prefill_tokens("mixgate", with_chat=True) == 4
    assert bulk_prefill_tokens("priority", with_chat=True) == 31  # all the decode leaves
    # With no interactive sequence in the engine there is nobody to protect: with no linger
    # (the default lingers 2 s: test_a_busy_stretch_on_an_idle_engine_starts_capped), no cap.
    assert bulk_prefill_tokens("mixgate", with_chat=False) == 32
    assert bulk_prefill_tokens("priority", with_chat=False) == 32
    # Unless it is told never to lift: the next chat to arrive then waits for a capped step.
    assert bulk_prefill_tokens("mixgate", with_chat=False, linger_s=None) == 4


def test_priority_never_ages_bulk_under_a_flood() -> None:
    config = EngineConfig(
        max_active_seqs=8,
        step_token_budget=64,
        bulk_prefill_chunk_tokens=16,
        bulk_min_share=0.25,
        bulk_aging_s=1.0,
        block_size_tokens=8,
        scheduling_policy="priority",
    )
    h = Harness(config, num_blocks=400, seed=3)
    bulk = [h.add(BULK, 120, 1) for _ in range(4)]
    for _ in range(300):
        for _ in range(2):
            h.add(INTERACTIVE, 96, 2)
        assert h.step().bulk_guaranteed_tokens == 0
    assert not any(s.is_finished for s in bulk)


def test_priority_does_not_preempt_to_admit_but_mixgate_does() -> None:
    def preemptions(policy: str) -> int:
        config = EngineConfig(
            max_active_seqs=2,
            step_token_budget=16,
            block_size_tokens=4,
            scheduling_policy=policy,
        )
        h = Harness(config, num_blocks=100, seed=4)
        h.add(BULK, 4, 50)
        h.add(BULK, 4, 50)
        h.step()  # both bulk sequences running: every slot taken
        h.add(INTERACTIVE, 4, 2)
        return len(h.step().preemptions)

    assert preemptions("mixgate") == 1
    assert preemptions("priority") == 0


def test_chats_overcommit_above_bulk_slots_and_bulk_keeps_all_of_its_own() -> None:
    config = EngineConfig(
        max_active_seqs=4,
        interactive_overcommit_seqs=2,
        step_token_budget=64,
        bulk_prefill_chunk_tokens=8,
        block_size_tokens=4,
    )
    h = Harness(config, num_blocks=400, seed=6)
    bulk = [h.add(BULK, 4, 10 if i == 0 else 100) for i in range(6)]

    def running(request_class: RequestClass) -> int:
        return sum(1 for s in h.scheduler.running if s.request_class is request_class)

    for _ in range(3):  # 8 bulk prefill tokens a step: two 4-token prompts each
        h.step()
    assert running(BULK) == 4  # bulk fills its slots; two more bulk wait
    chats = [h.add(INTERACTIVE, 8, 50) for _ in range(3)]
    output = h.step()
    # Two chats ride on top of the full bulk batch; the third is the one that preempts.
    assert running(INTERACTIVE) == 3
    assert len(output.preemptions) == 1 and output.preemptions[0].victim_class is BULK
    assert running(BULK) == 3
    while bulk[0].status is not SequenceStatus.FINISHED:
        h.step()
    for _ in range(2):
        h.step()
    # The finished bulk sequence's slot went back to bulk (a waiting one took it), not to the
    # chats that still run: 3 bulk + 3 chats, every slot of the overcommit in use.
    assert all(c.status is SequenceStatus.RUNNING for c in chats)
    assert bulk[0].status is SequenceStatus.FINISHED
    assert running(BULK) == 3 and len(h.scheduler.running) == 6


def test_interactive_preempts_aged_bulk_down_to_its_floor() -> None:
    config = EngineConfig(
        max_active_seqs=4,
        step_token_budget=64,
        bulk_prefill_chunk_tokens=4,
        bulk_min_share=0.25,
        bulk_aging_s=0.0,
        block_size_tokens=4,
    )
    h = Harness(config, num_blocks=400, seed=5)
    bulk = [h.add(BULK, 4, 100) for _ in range(5)]
    for _ in range(4):  # one 4-token chunk a step (no chat prompt competes), 4 slots; 1 waits
        h.step()
    assert sum(1 for s in bulk if s.status is SequenceStatus.RUNNING) == 4
    chats = [h.add(INTERACTIVE, 8, 20) for _ in range(4)]
    output = h.step()
    # A floor of ceil(0.25 * 4) = 1 bulk sequence keeps running for its share.
    assert len(output.preemptions) == 3
    assert {p.victim_class for p in output.preemptions} == {BULK}
    assert sum(1 for s in h.scheduler.running if s.request_class is BULK) == 1
    assert sum(1 for c in chats if c.status is SequenceStatus.RUNNING) == 3


LULL_CONFIG = EngineConfig(
    max_active_seqs=8,
    step_token_budget=64,
    bulk_prefill_chunk_tokens=16,
    block_size_tokens=4,
    bulk_aging_s=100.0,
    interactive_linger_s=1.0,
)


def test_the_bulk_cap_lingers_after_the_last_chat_then_lifts() -> None:
    """A chat arriving between chats should wait for a capped step, not a full-budget one; bulk
    alone gets its full steps back once no chat has been seen for interactive_linger_s."""
    h = Harness(LULL_CONFIG, num_blocks=400, seed=4)
    h.add(BULK, 400, 4)
    h.add(INTERACTIVE, 8, 2)
    while h.scheduler.num_running(INTERACTIVE) or h.scheduler.num_waiting(INTERACTIVE):
        h.step()  # the chat runs to its end
    last_chat_step_s = h.now_s - h.step_s
    # No chat now, but one just left: capped until bulk has had the engine to itself as long.
    while h.now_s < last_chat_step_s + LULL_CONFIG.interactive_linger_s:
        assert h.step().tokens_by_kind[(BULK, "prefill")] == 16
    assert h.step().tokens_by_kind[(BULK, "prefill")] == 64  # the linger is over


def test_a_busy_stretch_on_an_idle_engine_starts_capped() -> None:
    """Work landing on an idle engine says nothing yet of chats: bulk gets full-budget steps once
    it has had the engine to itself for interactive_linger_s, again after an idle spell."""
    h = Harness(LULL_CONFIG, num_blocks=400, seed=6, now_s=50.0, step_s=0.25)

    def bulk_prefill_by_step(steps: int) -> list[int]:
        return [h.step().tokens_by_kind.get((BULK, "prefill"), 0) for _ in range(steps)]

    h.add(BULK, 400, 1)
    assert bulk_prefill_by_step(6) == [16, 16, 16, 16, 64, 64]
    while h.scheduler.has_unfinished():
        h.step()
    h.now_s += LULL_CONFIG.interactive_linger_s  # idle that long
    h.add(BULK, 400, 1)
    assert bulk_prefill_by_step(6) == [16, 16, 16, 16, 64, 64]
