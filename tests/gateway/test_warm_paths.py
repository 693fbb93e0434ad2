"""The chat path's one-off costs are paid at start-up (gateway/runtime/warm_paths.py): checked in
a fresh interpreter, where nothing has loaded anyio's asyncio backend or compiled a template."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.text.tokenizer import Tokenizer
from gateway.runtime.warm_paths import warm_chat_path

PROBE = """
import asyncio, sys
from engine.text.tokenizer import Tokenizer
from gateway.runtime.warm_paths import warm_chat_path
tokenizer = Tokenizer.from_pretrained(sys.argv[1])
before = ("anyio._backends._asyncio" in sys.modules, tokenizer._compiled is not None)
asyncio.run(warm_chat_path(tokenizer))
after = ("anyio._backends._asyncio" in sys.modules, tokenizer._compiled is not None)
print(before, after)
"""


def test_warming_loads_the_async_backend_and_compiles_the_template(tiny_model_dir: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(tiny_model_dir)],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=120,
    )
    assert result.stdout.strip() == "(False, False) (True, True)"


@pytest.mark.anyio
async def test_a_tokenizer_without_a_template_or_none_at_all_is_fine(tiny_model_dir: Path) -> None:
    tokenizer = Tokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = None
    await warm_chat_path(tokenizer)
    await warm_chat_path(None)
    assert tokenizer._compiled is None
