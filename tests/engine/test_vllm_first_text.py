"""The vLLM scheduler's view of a chat's first text (pure: runs without vLLM)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.backends.vllm.first_text import FirstTextWatch, load_watch
from engine.backends.vllm.step_plan import StepKnobs, WorkItem, compose_step
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


def test_every_other_step_takes_no_bulk_prefill_while_a_chat_awaits_its_first_text() -> None:
    knobs = StepKnobs(512, 512, 128, 0.2, 5.0)
    inter, bulk = RequestClass.INTERACTIVE, RequestClass.BULK
    running = [WorkItem(k, bulk, 1, 0.0) for k in range(16)] + [WorkItem(99, inter, 1, 0.0)]
    waiting = [WorkItem(100 + k, bulk, 900, 0.0) for k in range(8)]
    shown = compose_step(running, waiting, knobs, interactive_present=True)
    assert shown.bulk_prefill_tokens == 128 and not shown.deferred_bulk
    awaiting = compose_step(
        running, waiting, knobs, interactive_present=True, interactive_awaits_first_text=True
    )
    assert awaiting.deferred_bulk and awaiting.bulk_prefill_tokens == 0
    assert awaiting.token_budget == 17  # the decodes alone
    after = compose_step(
        running,
        waiting,
        knobs,
        interactive_present=True,
        interactive_awaits_first_text=True,
        deferred_last_step=True,
    )
    assert not after.deferred_bulk and after.bulk_prefill_tokens == 128
