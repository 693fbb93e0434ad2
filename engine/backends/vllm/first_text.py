"""Which chats in vLLM's engine core have sampled tokens but shown their client no text yet.

The gateway detokenizes vLLM's tokens itself (`skip_tokenizer_init`), so vLLM's scheduler sees a
chat's first token, not its first text, and the client's first token is its first text (as
vLLM's own benchmark counts it). On the random-weight presets a chat's first tokens are often a
multi-byte character's first bytes: the chat that set the TTFT p99 under the backlog on the vLLM
backend (`small`, chat-over-backlog, a step trace) showed its first text two steps after its
prefill, both full bulk-chunk steps (40-50 ms against ~20 without the chunk). This mirrors the
native engine's `Sequence.awaits_first_text`, with the same incremental detokenizer the gateway
uses (stop strings aside: the gateway holds those, and a scheduling hint can do without them).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from engine.text.detokenizer import IncrementalDetokenizer, SupportsDecode

__all__ = ["FirstTextWatch", "load_watch"]


class FirstTextWatch:
    """One detokenizer per chat until it shows text; forgets chats that left the engine."""

    def __init__(self, tokenizer: SupportsDecode) -> None:
        self._tokenizer = tokenizer
        # request id -> (its detokenizer, output tokens fed to it so far)
        self._pending: dict[str, tuple[IncrementalDetokenizer, int]] = {}
        self._shown: set[str] = set()

    def awaits_first_text(
        self, request_id: str, prompt_token_ids: Sequence[int], output_token_ids: Sequence[int]
    ) -> bool:
        """Whether the request has sampled tokens and none of them made text yet."""
        if request_id in self._shown or not output_token_ids:
            return False
        detokenizer, fed = self._pending.get(request_id) or (
            IncrementalDetokenizer(self._tokenizer, prompt_token_ids),
            0,
        )
        if detokenizer.add_tokens(list(output_token_ids[fed:])).text:
            self._pending.pop(request_id, None)
            self._shown.add(request_id)
            return False
        self._pending[request_id] = (detokenizer, len(output_token_ids))
        return True

    def keep_only(self, request_ids: set[str]) -> None:
        """Forget every request not in `request_ids` (those still in the engine)."""
        for request_id in [r for r in self._pending if r not in request_ids]:
            del self._pending[request_id]
        self._shown &= request_ids


def load_watch(model_dir: str | Path) -> FirstTextWatch | None:
    """A watch over the folder's tokenizer; None where the folder has none (the scheduler then
    counts only prefills as a chat's first-token work, as before)."""
    from engine.text.tokenizer import Tokenizer

    try:
        return FirstTextWatch(Tokenizer.from_pretrained(model_dir))
    except (OSError, ValueError):
        return None
