"""A step that runs an interactive prefill leaves bulk decodes out (policies/step_budget.py,
`defers_bulk`): the chat's first token comes out of that step, so each bulk decode in it is
paid by the chat's TTFT. Aged bulk is owed its share meanwhile (policies/bulk_guarantee.py).
Real Scheduler and BlockManager, the invariants' fake executor."""

from __future__ import annotations

from engine.core.config import EngineConfig
from engine.core.scheduler_output import SchedulerOutput
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


def test_a_pair_of_chats_owes_aged_bulk_its_share_and_a_third_pays_what_passed_the_slack() -> None:
    # 0.25 x 64 = 16 tokens owed a step that holds aged bulk back; the slack is two of those.
    h = _aged_backlog_after_a_chat_prefill(seed=7)  # owes 16
    h.add(INTERACTIVE, 20, 4)  # another prompt competes for the next step's budget
    second = h.step()
    # Within the slack the second chat's step carries no bulk prefill: only the bulk decodes
    # that the first chat's step held back.
    assert second.bulk_guaranteed_tokens == 0
    assert _bulk_decodes(second) == 2 and (BULK, "prefill") not in second.tokens_by_kind
    assert second.tokens_by_kind[(INTERACTIVE, "prefill")] == 20
    h.add(INTERACTIVE, 20, 4)
    third = h.step()  # defers bulk again: owes 16 + 16 - 2 + 16 = 46
    assert third.tokens_for(BULK) == 0 and third.bulk_guaranteed_tokens == 0
    h.add(INTERACTIVE, 20, 4)
    fourth = h.step()  # due: 46 and its own 16, less the slack of 32
    assert fourth.bulk_guaranteed_tokens == 30
    assert _bulk_decodes(fourth) == 2 and fourth.tokens_by_kind[(BULK, "prefill")] == 28
    assert fourth.tokens_by_kind[(INTERACTIVE, "prefill")] == 20


def test_with_no_chat_prompt_to_compete_aged_bulk_keeps_its_chunk_cap_and_pays_its_debt() -> None:
    # The share keeps chat prompts from starving bulk; with none, bulk already has the budget
    # but the chat's decode, and lifting its cap would only lengthen the chat's step.
    h = _aged_backlog_after_a_chat_prefill(seed=7)  # owes 16
    after = h.step()
    assert after.bulk_guaranteed_tokens == 0
    assert _bulk_decodes(after) == 2 and after.tokens_by_kind[(BULK, "prefill")] == 16
    assert after.tokens_for(INTERACTIVE) == 1
    # Those 18 bulk tokens paid the 16 owed: a later pair of chats is within the slack again
    # (had the debt stayed, 16 + 16 + 16 would put 16 tokens past it into the second's step).
    h.add(INTERACTIVE, 20, 4)
    assert h.step().bulk_guaranteed_tokens == 0  # its prefill step defers bulk
    h.add(INTERACTIVE, 20, 4)
    assert h.step().bulk_guaranteed_tokens == 0


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


def test_a_chat_prefill_step_carries_no_bulk_prefill_even_when_bulk_is_aged() -> None:
    """The chat's first token waits on its prefill step: a bulk chunk beside it would add its
    whole cost to the chat's TTFT. Aged bulk is owed the share it skipped
    (policies/bulk_guarantee.py)."""
    h = Harness(_config(bulk_aging_s=1.0, interactive_linger_s=0.0), num_blocks=400, seed=3)
    h.add(BULK, 200, 4)
    assert h.step().tokens_for(BULK) == 64  # alone, bulk prefill takes the whole budget
    h.add(INTERACTIVE, 20, 4)
    step = h.step()
    assert step.tokens_for(INTERACTIVE) == 20 and step.tokens_for(BULK) == 0
    assert h.step().tokens_for(BULK) == 16  # the chat decodes: bulk prefill is back

    h.now_s += 2.0  # bulk has now waited past its aging threshold
    h.add(INTERACTIVE, 20, 4)
    step = h.step()
    assert step.tokens_by_kind[(INTERACTIVE, "prefill")] == 20 and step.tokens_for(BULK) == 0
    # With a prompt competing, the next step carries no bulk prefill either while the debt
    # (16 + 16) is within its slack (two shares)...
    h.add(INTERACTIVE, 20, 4)
    assert (BULK, "prefill") not in h.step().tokens_by_kind
    # ...a third chat's step defers again (owed: 48), and the fourth pays what is past the
    # slack, its own share included: 48 + 16 - 32.
    h.add(INTERACTIVE, 20, 4)
    assert h.step().tokens_for(BULK) == 0
    h.add(INTERACTIVE, 20, 4)
    assert h.step().tokens_by_kind[(BULK, "prefill")] == 32
