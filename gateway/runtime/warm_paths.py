"""First-request costs of the chat path, paid before the replica says it is ready.

Why: on a fresh `mixgate serve` the first streamed chat took 37-58 ms to its first token against
13-15 ms for the next ones (`small`, idle server). A profile of that first chat: most of its
gateway time was one-off work, anyio importing its asyncio backend the first time Starlette's
StreamingResponse opened a task group (~19 ms) and jinja compiling the chat template (~3 ms).
Under a bulk backlog that work also takes the CPU from the engine's step under way, so in
`mixgate bench compare --workload chat-over-backlog` the phase's first chat (a fresh server per
phase) was the slowest of every run (88-108 ms against 52-74 for the next slowest).
"""

from __future__ import annotations

import anyio
import structlog

from engine.text.tokenizer import Tokenizer

__all__ = ["warm_chat_path"]

log = structlog.get_logger("mixgate.gateway")

WARM_MESSAGES = [{"role": "user", "content": "warm-up"}]


async def warm_chat_path(tokenizer: Tokenizer | None) -> None:
    """Load and compile what a chat's first request would: anyio's asyncio backend (through a
    task group, as StreamingResponse opens one) and the tokenizer's chat template."""
    async with anyio.create_task_group():
        pass
    if tokenizer is None or tokenizer.chat_template is None:
        return
    try:
        tokenizer.encode_chat(WARM_MESSAGES)
    except ValueError as error:
        # A template that cannot render a plain user turn fails the same way for the first
        # real chat, with a 400 that names it; nothing to warm here.
        log.warning("chat_template_warmup_failed", error=str(error))
