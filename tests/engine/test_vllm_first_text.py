"""The vLLM scheduler's view of a chat's first text (pure: runs without vLLM)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.backends.vllm.first_text import FirstTextWatch, load_watch
from engine.backends.vllm.step_plan import (
    FIRST_TEXT_DEFERRALS_IN_A_ROW,
    StepComposition,
    StepKnobs,
    WorkItem,
    compose_step,
)
from engine.text.tokenizer import Tokenizer
from engine.text.tokenizer_builder import write_tokenizer
from policies.request_class import RequestClass

PROMPT = [ord(c) for c in "prompt: "]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path: Path = tmp_path_factory.mktemp("tok")
    write_tokenizer(path, model_max_length=1024)
    return path


def test_a_chat_awaits_its_first_text_until_its_tokens_make_a_character(folder: Path) -> None:
    watch = load_watch(folder)
    assert watch is not None
    euro = Tokenizer.from_pretrained(folder).encode("€!")
    assert len(euro) == 4  # three bytes of one character, then "!"
    # No token sampled yet: the prefill is the scheduler's to count, not the watch's.
    assert not watch.awaits_first_text("chat", PROMPT, [])
    assert watch.awaits_first_text("chat", PROMPT, euro[:1])
    assert watch.awaits_first_text("chat", PROMPT, euro[:2])
    assert not watch.awaits_first_text("chat", PROMPT, euro[:3])
    # Once it showed text it never waits again, whatever comes next.
    assert not watch.awaits_first_text("chat", PROMPT, [*euro[:3], euro[0]])
    # A chat whose first token is a whole character never waited.
    assert not watch.awaits_first_text("other", PROMPT, euro[3:])


def test_the_watch_forgets_chats_that_left_the_engine(folder: Path) -> None:
    watch = load_watch(folder)
    assert isinstance(watch, FirstTextWatch)
    euro = Tokenizer.from_pretrained(folder).encode("€")
    assert watch.awaits_first_text("a", PROMPT, euro[:1])
    assert not watch.awaits_first_text("b", PROMPT, euro)
    watch.keep_only(set())
    # Seen afresh (a request id vLLM reused, or a chat back from preemption): decoded from its
    # tokens again, not from what the watch kept.
    assert watch.awaits_first_text("b", PROMPT, euro[:1])
    assert not watch.awaits_first_text("a", PROMPT, euro)


def test_a_folder_without_a_tokenizer_has_no_watch(tmp_path: Path) -> None:
    assert load_watch(tmp_path) is None


def _chat_over_bulk(bulk_age_s: float) -> tuple[list[WorkItem], list[WorkItem]]:
    """16 bulk decodes and a decoding chat (99) running, 8 bulk prompts waiting."""
    inter, bulk = RequestClass.INTERACTIVE, RequestClass.BULK
    running = [WorkItem(k, bulk, 1, bulk_age_s) for k in range(16)] + [WorkItem(99, inter, 1, 0.0)]
    waiting = [WorkItem(100 + k, bulk, 900, bulk_age_s) for k in range(8)]
    return running, waiting


def _awaiting_first_text(
    knobs: StepKnobs, bulk_age_s: float, in_a_row: int, owed_tokens: int = 0
) -> StepComposition:
    """The next step while the chat's tokens have made no text yet."""
    running, waiting = _chat_over_bulk(bulk_age_s)
    return compose_step(
        running,
        waiting,
        knobs,
        interactive_present=True,
        interactive_awaits_first_text=True,
        deferred_steps_in_a_row=in_a_row,
        bulk_owed_tokens=owed_tokens,
    )


def test_bulk_prefill_waits_up_to_four_steps_in_a_row_while_a_chat_awaits_its_first_text() -> None:
    knobs = StepKnobs(512, 512, 128, 0.2, 5.0)
    running, waiting = _chat_over_bulk(0.0)
    shown = compose_step(running, waiting, knobs, interactive_present=True)
    assert shown.bulk_prefill_tokens == 128 and not shown.deferred_bulk
    assert shown.deferred_steps_in_a_row == 0
    # The chat's prefill step deferred (1); each step after it while no text came defers too,
    # up to four in a row.
    in_a_row = 1
    for expected in (2, 3, 4):
        awaiting = _awaiting_first_text(knobs, 0.0, in_a_row)
        assert awaiting.deferred_bulk and awaiting.bulk_prefill_tokens == 0
        # The chat's decode alone: the bulk decodes sit the step out (they keep their slots).
        assert awaiting.token_budget == 1
        assert awaiting.running_order == (99,)
        assert awaiting.held_back == frozenset(range(16))
        assert not awaiting.admits_waiting_bulk
        assert awaiting.deferred_steps_in_a_row == expected
        in_a_row = awaiting.deferred_steps_in_a_row
    # The fifth lets bulk prefill in, whatever the chat still awaits.
    fifth = _awaiting_first_text(knobs, 0.0, in_a_row)
    assert in_a_row == FIRST_TEXT_DEFERRALS_IN_A_ROW
    assert not fifth.deferred_bulk and fifth.bulk_prefill_tokens == 128
    assert fifth.deferred_steps_in_a_row == 0
    assert fifth.held_back == frozenset() and fifth.running_order[:17] == (99, *range(16))
    # A chat's own prefill step defers bulk prefill but keeps the bulk decodes.
    chat = WorkItem(98, RequestClass.INTERACTIVE, 150, 0.0)
    prefill = compose_step(running[:16], [*waiting, chat], knobs, interactive_present=True)
    assert prefill.deferred_bulk and prefill.running_order == tuple(range(16))
    assert prefill.held_back == frozenset() and prefill.token_budget == 16 + 150


def test_deferred_steps_in_a_row_run_up_aged_bulk_debt_and_later_steps_pay_it() -> None:
    knobs = StepKnobs(512, 512, 128, 0.25, 5.0)  # aged bulk's share: 128 tokens a step
    owed, in_a_row = 128, 1  # what the chat's prefill step left
    for _ in range(3):
        step = _awaiting_first_text(knobs, 9.0, in_a_row, owed)
        assert step.deferred_bulk and step.bulk_prefill_tokens == 0
        assert step.owed_bulk_tokens == owed + 128
        owed, in_a_row = step.owed_bulk_tokens, step.deferred_steps_in_a_row
    assert owed == 512
    # A chat prompt waiting to compete: its step pays what is past the slack (two shares),
    # its own share included: 512 + 128 - 256, the 16 bulk decodes first.
    running, waiting = _chat_over_bulk(9.0)
    waiting.insert(0, WorkItem(200, RequestClass.INTERACTIVE, 40, 0.0))
    paying = compose_step(
        running,
        waiting,
        knobs,
        interactive_present=True,
        deferred_steps_in_a_row=in_a_row,
        bulk_owed_tokens=owed,
    )
    assert not paying.deferred_bulk
    assert paying.bulk_prefill_tokens == 384 - 16 and paying.interactive_prefill_tokens == 40
    assert paying.owed_bulk_tokens == 256
    # With none, bulk keeps its chunk cap (lifting it would only lengthen the chat's decode
    # step), and what that step runs for bulk pays the debt down: 16 decodes and 128.
    unpaid = _awaiting_first_text(knobs, 9.0, 4, owed)
    assert not unpaid.deferred_bulk and unpaid.bulk_prefill_tokens == 128
    assert unpaid.owed_bulk_tokens == 512 - 16 - 128
