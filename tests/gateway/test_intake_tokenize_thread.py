"""Where a job's prompt is tokenized: a short one on the event loop, a long one on a worker.

A short prompt's encode keeps the GIL for its whole run (engine.text.tokenizer's
GIL_RELEASE_MIN_CHARS), so a worker thread would hold the loop just the same and add the hop;
a long one's encode releases the GIL, and on a worker it leaves the loop free meanwhile. The
real tokenizer and envelope run; the state holds only what intake reads of them.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from engine.text.tokenizer import GIL_RELEASE_MIN_CHARS, Tokenizer
from gateway.admission.intake import build_payload_off_loop
from gateway.http.schemas import parse_job_request
from gateway.http.state import GatewayState
from policies.envelope import Envelope
from policies.request_class import RequestClass

pytestmark = pytest.mark.anyio


class _ThreadRecordingTokenizer:
    """The real tokenizer; notes the thread each chat prompt is encoded on."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self.threads: list[threading.Thread] = []

    def encode_chat(self, messages: Any) -> list[int]:
        self.threads.append(threading.current_thread())
        return self._tokenizer.encode_chat(messages)


def _job(content: str) -> Any:
    return parse_job_request({"model": "m", "messages": [{"role": "user", "content": content}]})


async def test_a_short_prompt_on_the_loop_a_long_one_on_a_worker(tiny_model_dir: Path) -> None:
    real = Tokenizer.from_pretrained(tiny_model_dir)
    tokenizer = _ThreadRecordingTokenizer(real)
    state = cast(GatewayState, SimpleNamespace(tokenizer=tokenizer, envelope=Envelope.default()))
    short = "a lighthouse keeper's log " * 10
    long = "a lighthouse keeper's log " * (GIL_RELEASE_MIN_CHARS // 20)
    assert len(short) < GIL_RELEASE_MIN_CHARS <= len(long)

    for content in (short, long):
        payload = await build_payload_off_loop(state, _job(content), RequestClass.BULK)
        expected = real.encode_chat([{"role": "user", "content": content}])
        assert list(payload.prompt_token_ids) == expected

    loop_thread = threading.current_thread()
    assert tokenizer.threads[0] is loop_thread
    assert tokenizer.threads[1] is not loop_thread
    assert tokenizer.threads[1].name.startswith("tokenize")
