"""A tiny TOML writer: nested tables of strings, ints, floats and bools, nothing else.

The stdlib reads TOML (``tomllib``) but does not write it, and the envelope is small and
regular, so a few dozen lines beat a dependency. Anything outside that subset (lists, dates,
None) raises ValueError rather than being written in a form ``tomllib`` would read back
differently; tests round-trip every value kind through ``tomllib``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

__all__ = ["dump_toml"]

_BARE_KEY: Final = re.compile(r"[A-Za-z0-9_-]+")

# Escapes TOML basic strings define by name; other control characters use \uXXXX.
_NAMED_ESCAPES: Final = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


def _string(value: str) -> str:
    out = []
    for char in value:
        if char in _NAMED_ESCAPES:
            out.append(_NAMED_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            # TOML forbids raw control characters (and DEL) inside basic strings.
            out.append(f"\\u{ord(char):04X}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def _value(value: object, where: str) -> str:
    # bool before int: bool is an int subclass and would print as 1/0.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        # repr is the shortest round-tripping form, and its spellings ("1e-05", "inf",
        # "nan", "-0.0") are all valid TOML floats.
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    raise ValueError(f"{where}: cannot write {type(value).__name__} values as TOML")


def _write_table(table: Mapping[str, object], path: tuple[str, ...], lines: list[str]) -> None:
    subtables: list[tuple[str, Mapping[str, object]]] = []
    for key, value in table.items():
        if not isinstance(key, str):
            raise ValueError(f"{'.'.join(path) or '<root>'}: keys must be strings")
        if isinstance(value, Mapping):
            subtables.append((key, value))
        else:
            lines.append(f"{_key(key)} = {_value(value, '.'.join((*path, key)))}")
    # Scalars first: after a [header], every key belongs to that header's table.
    for key, subtable in subtables:
        sub_path = (*path, key)
        if lines:
            lines.append("")
        lines.append("[" + ".".join(_key(part) for part in sub_path) + "]")
        _write_table(subtable, sub_path, lines)


def dump_toml(data: Mapping[str, object]) -> str:
    """``data`` as TOML text that ``tomllib.loads`` reads back equal (for the subset above)."""
    lines: list[str] = []
    _write_table(data, (), lines)
    return "\n".join(lines) + "\n"
