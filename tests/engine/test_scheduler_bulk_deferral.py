"""A step that runs an interactive prefill leaves bulk decodes out (policies/step_budget.py,
`defers_bulk`): the chat's first token comes out of that step, so each bulk decode in it is
paid by the chat's TTFT. Real Scheduler and BlockManager, the invariants' fake executor."""

from __future__ import annotations

from engine.core.config import EngineConfig
from engine.core.scheduler_output import SchedulerOutput
from policies.step_budget import carried_bulk_tokens
from tests.engine.test_scheduler_invariants import BULK, INTERACTIVE, Harness


def _config(**overrides: object) -> EngineConfig:
    knobs: dict[str, object] = dict(
        max_active_seqs=8,
        step_token_budget=64,
        bulk_prefill_chunk_tokens=16,
        block_size_tokens=4,
        bulk_aging_s=100.0,
        bulk_min_share=0.25,
    )
    knobs.update(overrides)
    return EngineConfig(**knobs)  # type: ignore[arg-type]


def _decoding_bulk(h: Harness, count: int) -> None:
    for _ in range(count):
        h.add(BULK, 8, 1000)
    while h.scheduler.num_waiting(BULK) or any(not s.is_decoding for s in h.scheduler.running):
        h.step()


def _bulk_decodes(step: SchedulerOutput) -> int:
    return step.tokens_by_kind.get((BULK, "decode"), 0)


def test_a_chat_prefill_step_carries_no_bulk_decodes_and_the_next_step_does() -> None:
    h = Harness(_config(), num_blocks=400, seed=5)
    _decoding_bulk(h, 4)
    assert _bulk_decodes(h.step()) == 4
    h.add(INTERACTIVE, 20, 4)
    step = h.step()
    assert step.tokens_by_kind == {(INTERACTIVE, "prefill"): 20}
    after = h.step()
    assert _bulk_decodes(after) == 4 and after.tokens_for(INTERACTIVE) == 1


def test_a_flood_of_chats_defers_bulk_decodes_every_other_step_at_most() -> None:
    # Overcommit slots for the chats, so that none preempts a bulk sequence.
    h = Harness(_config(max_active_seqs=4, interactive_overcommit_seqs=4), num_blocks=2000, seed=6)
    _decoding_bulk(h, 4)
    steps = []
    for _ in range(40):
        h.add(INTERACTIVE, 12, 2)  # a new prompt waits before every step
        steps.append(h.step())
    with_decodes = [_bulk_decodes(s) == 4 for s in steps]
    deferred_twice = [
        i for i in range(1, len(steps)) if not with_decodes[i - 1] and not with_decodes[i]
    ]
    assert deferred_twice == []
    assert with_decodes.count(False) >= 15  # and the deferral does happen under the flood


def _aged_backlog_after_a_chat_prefill(seed: int) -> Harness:
    """Two bulk decodes and an aged 400-token bulk prompt; a chat's prefill step just ran."""
    h = Harness(_config(bulk_aging_s=1.0), num_blocks=400, seed=seed)
    _decoding_bulk(h, 2)
    h.add(BULK, 400, 4)  # a long prompt: bulk prefill work that ages
    h.step()
    h.now_s += 2.0
    h.add(INTERACTIVE, 20, 4)
    step = h.step()
    assert step.tokens_by_kind == {(INTERACTIVE, "prefill"): 20}
    assert step.bulk_guaranteed_tokens == 0
    return h


def test_aged_bulk_is_deferred_too_and_the_next_chat_step_pays_its_guarantee_twice() -> None:
    h = _aged_backlog_after_a_chat_prefill(seed=7)
    h.add(INTERACTIVE, 20, 4)  # another prompt competes for the next step's budget
    # 0.25 x 64 = 16 tokens a step: the skipped 16 on top of this step's own.
    after = h.step()
    assert after.bulk_guaranteed_tokens == 32
    assert _bulk_decodes(after) == 2 and after.tokens_by_kind[(BULK, "prefill")] == 30
    assert after.tokens_by_kind[(INTERACTIVE, "prefill")] == 20


def test_with_no_chat_prompt_to_compete_aged_bulk_keeps_its_chunk_cap() -> None:
    # The guarantee keeps chat prompts from starving bulk; with none, bulk already has the
    # budget but the chat's decode, and lifting its cap would only lengthen the chat's step.
    h = _aged_backlog_after_a_chat_prefill(seed=7)
    after = h.step()
    assert after.bulk_guaranteed_tokens == 0
    assert _bulk_decodes(after) == 2 and after.tokens_by_kind[(BULK, "prefill")] == 16
    assert after.tokens_for(INTERACTIVE) == 1
    # Nothing was owed: a later chat prompt finds one step's share again, not a carried one.
    h.add(INTERACTIVE, 20, 4)
    assert h.step().bulk_guaranteed_tokens == 0  # its prefill step defers bulk
    h.add(INTERACTIVE, 20, 4)
    assert h.step().bulk_guaranteed_tokens == 32  # the deferred 16 and its own


def test_strict_priority_keeps_bulk_decodes_beside_a_chat_prefill() -> None:
    # vLLM's priority scheduling has no such deferral: the baseline preset keeps its behaviour.
    h = Harness(_config(scheduling_policy="priority"), num_blocks=400, seed=8)
    _decoding_bulk(h, 3)
    h.add(INTERACTIVE, 20, 4)
    step = h.step()
    assert step.tokens_by_kind[(INTERACTIVE, "prefill")] == 20 and _bulk_decodes(step) == 3


def test_a_chat_whose_tokens_make_no_text_yet_defers_bulk_every_other_step() -> None:
    # Its client's first token is its first text: the steps until then are its TTFT too.
    h = Harness(_config(), num_blocks=400, seed=9)
    _decoding_bulk(h, 4)
    chat = h.add(INTERACTIVE, 20, 8)
    chat.awaits_first_text = True  # LLMEngine sets and clears it from the detokenizer
    decodes = [_bulk_decodes(h.step()) for _ in range(4)]
    assert decodes == [0, 4, 0, 4]  # prefill, then decodes with no text: still every other
    chat.awaits_first_text = False
    assert [_bulk_decodes(h.step()) for _ in range(2)] == [4, 4]


def test_a_deferring_step_carries_on_what_earlier_steps_carried_up_to_one_budget() -> None:
    def carried(deferred: bool, aged: bool, carried_in: int) -> int:
        return carried_bulk_tokens(
            step_token_budget=512,
            bulk_min_share=0.25,
            deferred=deferred,
            bulk_aged=aged,
            carried_in_tokens=carried_in,
        )

    assert carried(True, True, 0) == 128
    assert carried(True, True, 128) == 256
    assert carried(True, False, 128) == 128  # nothing aged this step: only what came in
    assert carried(True, True, 448) == 512  # one step's budget at most
    assert carried(False, True, 256) == 0  # a step that does not defer pays it all
