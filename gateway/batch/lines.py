"""Reading a batch input file: one request per JSONL line, checked the way OpenAI checks them.

Semantics (where mixgate deliberately differs from OpenAI): OpenAI fails the whole batch when
any line is malformed. mixgate reports each malformed line on its own, in the batch's
``errors.data`` (``{code, message, param, line}``, ``line`` 1-based) and as a line of the error
file, and still runs every valid line. Only a batch with no valid line at all fails.

Checks here are structural (no tokenizer, no model): the line is a JSON object with exactly
``custom_id`` (a non-empty string, unique in the file: the first one wins, later repeats are
``duplicate_custom_id``), ``method`` ``"POST"``, ``url`` equal to the batch's endpoint, and a
``body`` object. The body itself is checked later as a chat request (`gateway.batch.prepare`).
Blank lines are skipped and not counted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = ["InputLine", "LineError", "ParsedInput", "count_lines", "parse_input_lines"]

MAX_CUSTOM_ID_CHARS: Final = 512
_LINE_KEYS: Final = frozenset({"custom_id", "method", "url", "body"})


@dataclass(frozen=True, slots=True)
class LineError:
    """One malformed line: OpenAI's ``BatchError`` plus the custom_id when it was readable."""

    line: int
    code: str
    message: str
    param: str | None = None
    custom_id: str | None = None

    def batch_error(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


@dataclass(frozen=True, slots=True)
class InputLine:
    line: int
    custom_id: str
    body: dict[str, Any]


@dataclass(slots=True)
class ParsedInput:
    lines: list[InputLine] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.lines) + len(self.errors)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _parse_line(number: int, text: bytes, endpoint: str) -> InputLine | LineError:
    try:
        data = json.loads(text.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        return LineError(number, "invalid_json_line", f"Line {number} is not valid JSON: {error}")
    if not isinstance(data, dict):
        return LineError(number, "invalid_json_line", f"Line {number} is not a JSON object.")
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not 0 < len(custom_id) <= MAX_CUSTOM_ID_CHARS:
        return LineError(
            number,
            "invalid_custom_id",
            f"custom_id must be a string of 1 to {MAX_CUSTOM_ID_CHARS} characters.",
            "custom_id",
        )
    unknown = sorted(set(data) - _LINE_KEYS)
    if unknown:
        message = f"Unrecognized field in a batch line: {unknown[0][:64]}"
        return LineError(number, "invalid_request", message, unknown[0][:64], custom_id)
    if data.get("method") != "POST":
        message = "method must be 'POST'."
        return LineError(number, "invalid_method", message, "method", custom_id)
    if data.get("url") != endpoint:
        message = f"url must be the batch's endpoint, '{endpoint}'."
        return LineError(number, "invalid_url", message, "url", custom_id)
    body = data.get("body")
    if not isinstance(body, dict):
        return LineError(number, "invalid_body", "body must be a JSON object.", "body", custom_id)
    return InputLine(number, custom_id, body)


def parse_input_lines(raw: bytes, endpoint: str) -> ParsedInput:
    """Every non-blank line, either as a request or as a per-line error (1-based numbers)."""
    parsed = ParsedInput()
    seen: set[str] = set()
    for number, text in enumerate(raw.split(b"\n"), start=1):
        if not text.strip():
            continue
        line = _parse_line(number, text, endpoint)
        if isinstance(line, InputLine):
            if line.custom_id in seen:
                line = LineError(
                    number,
                    "duplicate_custom_id",
                    f"custom_id {line.custom_id[:64]!r} appears on an earlier line; "
                    "each line needs its own.",
                    "custom_id",
                    line.custom_id,
                )
            else:
                seen.add(line.custom_id)
        if isinstance(line, InputLine):
            parsed.lines.append(line)
        else:
            parsed.errors.append(line)
    return parsed


def count_lines(raw: bytes) -> int:
    """Non-blank lines, as `parse_input_lines` counts them (upload checks the line limit)."""
    return sum(1 for text in raw.split(b"\n") if text.strip())
