"""Errors the engine raises for requests it will not run, with OpenAI-style codes."""

from __future__ import annotations


class RequestValidationError(ValueError):
    """A request rejected before it touches the engine; `code`/`param` follow OpenAI's errors."""

    def __init__(self, message: str, *, code: str = "invalid_request", param: str | None = None):
        super().__init__(message)
        self.code = code
        self.param = param


class EngineDeadError(RuntimeError):
    """The engine's step loop failed; requests in flight cannot finish on this replica."""
