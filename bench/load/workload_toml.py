"""Workloads as TOML: read (strict: unknown keys and bad values name their key path), write,
and the builtin scenarios shipped as package data in bench/workloads/*.toml."""

from __future__ import annotations

import importlib.resources
import json
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.load.workload_spec import Arrival, Cancellation, ClassLoad, LengthDist, Workload
from policies.request_class import RequestClass

__all__ = ["BUILTIN_WORKLOADS", "dump_workload", "load_workload", "parse_workload"]

BUILTIN_WORKLOADS = (
    "chat-only",
    "bulk-only",
    "mixed",
    "burst",
    "long-context",
    "chat-over-backlog",
)

# Keys each kind accepts: a key another kind uses is refused rather than silently ignored,
# so what a user wrote is what runs (and dump/parse round-trips exactly).
_LENGTH_KEYS = {
    "fixed": {"value"},
    "uniform": {"min", "max"},
    "lognormal": {"median", "sigma", "min", "max"},
    "choice": {"choices", "weights"},
}
_ARRIVAL_KEYS = {
    "poisson": {"rate_per_s"},
    "burst": {"rate_per_s", "burst_rate_per_s", "burst_start_s", "burst_duration_s"},
    "closed": {"concurrency"},
    "backlog": {"count"},
}
_INT_KEYS = {"value", "min", "max", "concurrency", "count", "after_tokens", "seed"}
_TOP_KEYS = {"name", "description", "duration_s", "seed", *(c.value for c in RequestClass)}
_CLASS_KEYS = {"arrival", "prompt_tokens", "output_tokens", "long_context", "cancel", "deadline_s"}


def _table(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{path}: must be a table")
    return value


def _check_keys(table: dict[str, Any], allowed: set[str], path: str) -> None:
    for key in table:
        if key not in allowed:
            raise ValueError(
                f"{path}.{key}: unknown key; expected one of {', '.join(sorted(allowed))}"
            )


def _number(value: Any, key: str, path: str) -> int | float:
    # bool is an int subclass; `true` is never a count.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{path}.{key}: must be a number, got {value!r}")
    if key in _INT_KEYS:
        if not isinstance(value, int):
            raise ValueError(f"{path}.{key}: must be an integer, got {value!r}")
        return value
    return float(value)


def _build(cls: Callable[..., Any], path: str, **kwargs: Any) -> Any:
    """Construct a spec object; its ValueError ("field: why") gets the table path in front."""
    try:
        return cls(**kwargs)
    except ValueError as exc:
        raise ValueError(f"{path}.{exc}") from None


def _kinded(raw: Any, keys_by_kind: dict[str, set[str]], path: str) -> tuple[str, dict[str, Any]]:
    table = _table(raw, path)
    kind = table.get("kind")
    if kind not in keys_by_kind:
        raise ValueError(
            f"{path}.kind: unknown kind {kind!r}; expected one of {', '.join(keys_by_kind)}"
        )
    _check_keys(table, {"kind", *keys_by_kind[kind]}, path)
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key == "kind":
            continue
        if isinstance(value, list):
            values[key] = tuple(_number(item, key, path) for item in value)
        else:
            values[key] = _number(value, key, path)
    return kind, values


def _length(raw: Any, path: str) -> LengthDist:
    kind, values = _kinded(raw, _LENGTH_KEYS, path)
    if "choices" in values:
        values["choices"] = tuple(int(v) for v in values["choices"])
    return _build(LengthDist, path, kind=kind, **values)  # type: ignore[no-any-return]


def _arrival(raw: Any, path: str) -> Arrival:
    kind, values = _kinded(raw, _ARRIVAL_KEYS, path)
    return _build(Arrival, path, kind=kind, **values)  # type: ignore[no-any-return]


def _cancel(raw: Any, path: str) -> Cancellation:
    table = _table(raw, path)
    _check_keys(table, {"probability", "when", "after_tokens"}, path)
    if "probability" not in table or "when" not in table:
        raise ValueError(f"{path}: needs probability and when")
    values = {k: _number(v, k, path) for k, v in table.items() if k != "when"}
    return _build(Cancellation, path, when=table["when"], **values)  # type: ignore[no-any-return]


def _class_load(cls: RequestClass, raw: Any) -> ClassLoad:
    path = cls.value
    table = _table(raw, path)
    _check_keys(table, _CLASS_KEYS, path)
    for key in ("arrival", "prompt_tokens", "output_tokens"):
        if key not in table:
            raise ValueError(f"{path}.{key}: required")
    extra: dict[str, Any] = {}
    if "long_context" in table:
        lc_path = f"{path}.long_context"
        long_context = _table(table["long_context"], lc_path)
        _check_keys(long_context, {"probability", "prompt_tokens"}, lc_path)
        extra["long_context_probability"] = _number(
            long_context.get("probability", 0.0), "probability", lc_path
        )
        if "prompt_tokens" in long_context:
            extra["long_context_prompt_tokens"] = _length(
                long_context["prompt_tokens"], f"{lc_path}.prompt_tokens"
            )
    if "cancel" in table:
        extra["cancel"] = _cancel(table["cancel"], f"{path}.cancel")
    if "deadline_s" in table:
        extra["deadline_s"] = _number(table["deadline_s"], "deadline_s", path)
    return _build(  # type: ignore[no-any-return]
        ClassLoad,
        path,
        request_class=cls,
        arrival=_arrival(table["arrival"], f"{path}.arrival"),
        prompt_tokens=_length(table["prompt_tokens"], f"{path}.prompt_tokens"),
        output_tokens=_length(table["output_tokens"], f"{path}.output_tokens"),
        **extra,
    )


def workload_from_dict(data: dict[str, Any]) -> Workload:
    _check_keys(data, _TOP_KEYS, "workload")
    for key in ("name", "duration_s", "seed"):
        if key not in data:
            raise ValueError(f"workload.{key}: required")
    name, description = data["name"], data.get("description", "")
    if not isinstance(name, str) or not isinstance(description, str):
        raise ValueError("workload.name, workload.description: must be strings")
    classes = {cls: _class_load(cls, data[cls.value]) for cls in RequestClass if cls.value in data}
    return _build(  # type: ignore[no-any-return]
        Workload,
        "workload",
        name=name,
        description=description,
        duration_s=_number(data["duration_s"], "duration_s", "workload"),
        seed=_number(data["seed"], "seed", "workload"),
        classes=classes,
    )


def parse_workload(text: str) -> Workload:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"workload: not valid TOML: {exc}") from None
    return workload_from_dict(data)


def load_workload(name_or_path: str | Path) -> Workload:
    """A builtin scenario by name (see BUILTIN_WORKLOADS), or a TOML file by path."""
    if str(name_or_path) in BUILTIN_WORKLOADS:
        resource = importlib.resources.files("bench") / "workloads" / f"{name_or_path}.toml"
        return parse_workload(resource.read_text(encoding="utf-8"))
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(
            f"workload: {name_or_path!s} is neither a file nor one of "
            + ", ".join(BUILTIN_WORKLOADS)
        )
    return parse_workload(path.read_text(encoding="utf-8"))


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        # NOTE: JSON string escapes (\" \\ \n \uXXXX) are valid TOML basic-string escapes.
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_value(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"cannot write {type(value).__name__} as TOML")


def dump_workload(workload: Workload) -> str:
    """TOML in the layout the builtins use: one table per class, inline tables inside.

    NOTE: policies/toml_writer.dump_toml writes no lists (LengthDist choices need them) nor
    inline tables, so a dozen lines here keep the files readable."""
    lines: list[str] = []
    for key, value in workload.to_dict().items():
        if isinstance(value, dict) and key in {c.value for c in RequestClass}:
            lines += ["", f"[{key}]"]
            lines += [f"{k} = {_value(v)}" for k, v in value.items()]
        else:
            lines.append(f"{key} = {_value(value)}")
    return "\n".join(lines) + "\n"
