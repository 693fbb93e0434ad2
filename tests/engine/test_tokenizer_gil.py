"""Tokenizing lets other threads run: the gateway tokenizes job prompts on worker threads so
that a burst of submissions leaves its event loop (and the chat lane) free, which only holds
if the Rust tokenizer releases the GIL while it works.

Deterministic, not a timing: with a 30 s switch interval no thread ever takes the GIL from a
thread that holds it, so the main thread can run while a worker is inside `encode` only if
`encode` released the GIL.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from engine.text.tokenizer import GIL_RELEASE_MIN_CHARS, Tokenizer


def test_encode_releases_the_gil_while_it_works(tiny_model_dir: Path) -> None:
    tokenizer = Tokenizer.from_pretrained(tiny_model_dir)
    # Long enough that the encode is under way for far longer than a thread takes to wake.
    text = "queue token batch model cache block prefill decode stream " * 20_000
    expected = tokenizer.encode("queue token")
    entered = threading.Event()
    finished = threading.Event()
    ids: list[int] = []

    def work() -> None:
        entered.set()
        ids.extend(tokenizer.encode(text))
        finished.set()

    interval_s = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    try:
        worker = threading.Thread(target=work)
        worker.start()
        entered.wait()
        # Gives the GIL up; getting it back while the worker is in `encode` needs the worker
        # to have released it (with the GIL held through the call, this returns only after
        # `finished` is set).
        time.sleep(0)
        ran_during_encode = not finished.is_set()
        worker.join()
    finally:
        sys.setswitchinterval(interval_s)
    assert ran_during_encode
    # And the ids are the same as a plain encode's.
    assert len(ids) == len(tokenizer.encode(text)) > 0
    assert tokenizer.encode("queue token") == expected


def test_short_and_long_prompts_get_the_same_ids_either_way(tiny_model_dir: Path) -> None:
    # Below GIL_RELEASE_MIN_CHARS encode keeps the GIL (no re-acquire behind a busy loop),
    # from it on it releases it: the ids must not depend on which path a prompt took.
    tokenizer = Tokenizer.from_pretrained(tiny_model_dir)
    unit = "queue token batch model cache block prefill decode stream. "
    long_text = unit * (GIL_RELEASE_MIN_CHARS // len(unit) + 1)
    short_text = long_text[: GIL_RELEASE_MIN_CHARS - 1]
    assert len(short_text) < GIL_RELEASE_MIN_CHARS <= len(long_text)
    for text in (short_text, long_text):
        batch_ids = tokenizer._tokenizer.encode_batch([text], add_special_tokens=False)[0].ids
        assert tokenizer.encode(text) == batch_ids
    # A long prompt's ids are its halves' ids where the cut falls on a token boundary.
    assert tokenizer.encode(unit * 100) == tokenizer.encode(unit * 50) * 2
