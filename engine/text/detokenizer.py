"""Token ids -> streamed text deltas, never half a character and never part of a stop string.

Decoding one id at a time is wrong twice over: a byte-level token can be half of a UTF-8
character, and SentencePiece-style decoders drop a token's leading space when it is decoded
alone. So each step decodes a short window twice, with and without the new ids (the prefix /
read offsets of vLLM and TGI), and emits the difference once it no longer ends in U+FFFD.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["DetokenizerDelta", "IncrementalDetokenizer", "SupportsDecode"]

_REPLACEMENT_CHAR = "\ufffd"
# NOTE: a UTF-8 character is at most 4 bytes; a U+FFFD still there after 4 pending tokens is
# an invalid byte, not an unfinished character, and holding it back would stall the stream
# until the end (a random-weight model emits such bytes all the time).
_MAX_CHAR_TOKENS = 4
# Prompt ids decoded as left context of the first output token (vLLM uses the same 5), so the
# first token's leading space survives decoders that strip it at the start of a text.
_PROMPT_CONTEXT_TOKENS = 5


class SupportsDecode(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


@dataclass(frozen=True, slots=True)
class DetokenizerDelta:
    # Text that became final with this call ("" while a character or a stop prefix is pending).
    text: str
    # The stop string that ended the output, once one matched; the text stops just before it.
    stop_matched: str | None = None


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: SupportsDecode,
        prompt_token_ids: Sequence[int],
        stop: tuple[str, ...] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        if any(not s for s in stop):
            raise ValueError("stop strings must be non-empty")
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._stop = tuple(stop)
        # A match can reach at most this far back from the newest character.
        self._max_stop_chars = max((len(s) for s in stop), default=0)
        # Only the prompt's last tokens are ever decoded again (the context of the first output
        # token's text): keep those, not a copy of the whole prompt per request.
        self._ids: list[int] = list(prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:])
        self._read_offset = len(self._ids)
        self._prefix_offset = max(self._read_offset - _PROMPT_CONTEXT_TOKENS, 0)
        # Generated text decoded so far; [:_emitted_chars] went out, the rest is held back.
        self._text = ""
        self._emitted_chars = 0
        self._stop_matched: str | None = None
        self._flushed = False

    @property
    def output_text(self) -> str:
        """Everything emitted so far (deltas and flush), stop string excluded."""
        return self._text[: self._emitted_chars]

    @property
    def stop_matched(self) -> str | None:
        return self._stop_matched

    @property
    def finished(self) -> bool:
        return self._stop_matched is not None or self._flushed

    def add_tokens(self, new_ids: list[int]) -> DetokenizerDelta:
        """Take the newly generated ids; return the text that is now final."""
        if self._flushed:
            raise RuntimeError("add_tokens after flush: the output already ended")
        start = self._emitted_chars
        for token_id in new_ids:
            # NOTE: once a stop string matched, later ids (same step) are dropped: the text
            # ends at the match, as the caller ends the sequence.
            if self._stop_matched is not None:
                break
            self._ids.append(token_id)
            self._append_text(self._decode_pending(final=False))
        return DetokenizerDelta(self._text[start : self._emitted_chars], self._stop_matched)

    def flush(self) -> str:
        """End of output for another reason: release held-back text and pending bytes."""
        if self._stop_matched is not None or self._flushed:
            return ""
        start = self._emitted_chars
        # An unfinished character at the very end is shown as U+FFFD, as decode(all) would.
        self._append_text(self._decode_pending(final=True))
        self._flushed = True
        if self._stop_matched is None:
            self._emitted_chars = len(self._text)
        return self._text[start : self._emitted_chars]

    def _decode_pending(self, final: bool) -> str:
        """New text of ids[read_offset:], or "" while it ends in an unfinished character."""
        decode = self._tokenizer.decode
        skip = self._skip_special_tokens
        prefix_text = decode(self._ids[self._prefix_offset : self._read_offset], skip)
        full_text = decode(self._ids[self._prefix_offset :], skip)
        if len(full_text) <= len(prefix_text):
            return ""  # e.g. a skipped special token: nothing visible yet
        pending_ids = len(self._ids) - self._read_offset
        if full_text.endswith(_REPLACEMENT_CHAR) and not final and pending_ids < _MAX_CHAR_TOKENS:
            return ""  # keep the window open until the character completes
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return full_text[len(prefix_text) :]

    def _append_text(self, piece: str) -> None:
        if not piece:
            return
        searched_from = max(len(self._text) - self._max_stop_chars + 1, 0)
        self._text += piece
        if self._stop:
            self._find_stop(searched_from)
        if self._stop_matched is None:
            self._emitted_chars = len(self._text) - self._held_back_chars()

    def _find_stop(self, searched_from: int) -> None:
        # Only a match that ends in the new piece is new: older text was searched before.
        best: tuple[int, str] | None = None
        for stop in self._stop:
            at = self._text.find(stop, searched_from)
            if at != -1 and (best is None or at < best[0]):
                best = (at, stop)
        if best is None:
            return
        at, stop = best
        if at < self._emitted_chars:
            raise AssertionError("a stop string matched inside text that was already emitted")
        self._text = self._text[:at]
        self._emitted_chars = at
        self._stop_matched = stop

    def _held_back_chars(self) -> int:
        """Length of the longest tail of the text that could still grow into a stop string."""
        text = self._text
        if not self._stop or not text:
            return 0
        last = text[-1]
        longest = 0
        for stop in self._stop:
            # A tail of k characters can be stop[:k] only if stop[k - 1] is the last character.
            for k in range(min(len(stop) - 1, len(text)), longest, -1):
                if stop[k - 1] == last and text.endswith(stop[:k]):
                    longest = k
                    break
        # Never hold back text that was already emitted.
        return min(longest, len(text) - self._emitted_chars)
