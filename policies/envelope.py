"""The operating envelope: the limits the service enforces, and where they came from.

Load sweeps (or the planner, or an operator) produce an envelope; the engine takes its step
limits, the dispatcher its reserved slots, admission its length and queue limits and TTFT
target, the claim script its class offset. It travels as TOML with its provenance, so a number
in production can be traced to the sweep that justified it.

TOML layout (``dump_envelope(Envelope.default())`` shows every key)::

    max_active_seqs = 32            # ... the other scalar fields
    [interactive]                   # and [bulk]: queue_limit + the LengthLimits fields
    queue_limit = 64
    [provenance]                    # source required; created_at, notes, workload optional
    [provenance.slo]                # optional; any keys, numeric values

Every other key is required, and an unknown key is a ValueError naming it: a typo in a limit
must fail loudly, not leave the default silently in force.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from policies.admission import LengthLimits
from policies.request_class import RequestClass
from policies.toml_writer import dump_toml

__all__ = ["Envelope", "LengthLimits", "Provenance", "dump_envelope", "load_envelope"]


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where an envelope came from: enough to reproduce or distrust it."""

    source: str = "default"  # "default" | "planner" | "sweep" | the file it was read from
    # ISO 8601. NOTE: "" (unknown) is allowed because policies/ may not read a clock; whoever
    # creates an envelope from a measurement passes the time.
    created_at: str = ""
    notes: str = ""
    workload: str = ""  # the workload (mix) name the envelope was derived for
    # The targets it was derived against, e.g. {"ttft_p99_s": 2.0, "itl_p99_s": 0.1}.
    # NOTE: frozen does not freeze a dict; __post_init__ copies it so the caller's dict
    # cannot change the envelope later, and nobody in policies/ mutates it. Left out of the
    # hash (still compared) so an Envelope can key a cache.
    slo: dict[str, float] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not self.source:
            raise ValueError("provenance.source must be non-empty")
        if self.created_at:
            try:
                datetime.fromisoformat(self.created_at)
            except ValueError:
                raise ValueError(
                    f"provenance.created_at must be ISO 8601, got {self.created_at!r}"
                ) from None
        copied: dict[str, float] = {}
        for key, value in self.slo.items():
            if not key:
                raise ValueError("provenance.slo keys must be non-empty")
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"provenance.slo.{key} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"provenance.slo.{key} must be finite")
            copied[key] = float(value)
        object.__setattr__(self, "slo", copied)


# TOML/dict key sets. Top-level scalars, then each class's table, then provenance.
_INT_KEYS: Final = (
    "max_active_seqs",
    "step_token_budget",
    "bulk_prefill_chunk_tokens",
    "bulk_class_offset_ms",
    "interactive_reserved_seqs",
)
_FLOAT_KEYS: Final = ("bulk_min_share", "bulk_aging_s", "interactive_ttft_target_s")
_CLASS_KEYS: Final = ("queue_limit", "max_prompt_tokens", "max_output_tokens", "max_context_tokens")
_PROVENANCE_STR_KEYS: Final = ("source", "created_at", "notes", "workload")


def _dotted(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _check_keys(
    table: Mapping[str, object], required: tuple[str, ...], optional: tuple[str, ...], where: str
) -> None:
    for key in table:
        if key not in required and key not in optional:
            raise ValueError(f"unknown envelope key {_dotted(where, key)!r}")
    for key in required:
        if key not in table:
            raise ValueError(f"missing envelope key {_dotted(where, key)!r}")


def _get_int(table: Mapping[str, object], key: str, where: str) -> int:
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"envelope key {_dotted(where, key)!r} must be an integer, got {value!r}")
    return value


def _get_float(table: Mapping[str, object], key: str, where: str) -> float:
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"envelope key {_dotted(where, key)!r} must be a number, got {value!r}")
    return float(value)


def _get_str(table: Mapping[str, object], key: str, where: str) -> str:
    value = table.get(key, "")
    if not isinstance(value, str):
        raise ValueError(f"envelope key {_dotted(where, key)!r} must be a string, got {value!r}")
    return value


def _get_table(table: Mapping[str, object], key: str, where: str) -> Mapping[str, object]:
    value = table.get(key, {})
    if not isinstance(value, Mapping):
        raise ValueError(f"envelope key {_dotted(where, key)!r} must be a table, got {value!r}")
    return value


def _provenance_from_dict(table: Mapping[str, object]) -> Provenance:
    _check_keys(table, ("source",), (*_PROVENANCE_STR_KEYS[1:], "slo"), "provenance")
    slo = _get_table(table, "slo", "provenance")
    return Provenance(
        **{key: _get_str(table, key, "provenance") for key in _PROVENANCE_STR_KEYS},
        slo={key: _get_float(slo, key, "provenance.slo") for key in slo},
    )


# The built-in envelope's bulk prefill chunk per engine. Measured on a 2-vCPU AMD EPYC (AVX2),
# `small`, 2 threads, `bench compare --workload chat-over-backlog --repeats 3`: on the native
# engine (0.6 ms of fixed cost per step) 64 tokens served chats better than 128 in two sessions
# (chat TTFT p99 under the backlog 105 vs 133 ms, then 97 vs 119; ITL p99 37 vs 52, 40 vs 48)
# at the same bulk rate within noise (490 vs 489, 477 vs 509 tokens per busy second); on the vLLM
# backend, whose steps carry more fixed host cost, 64 cost an eighth of its bulk rate (378 vs
# 431 tokens per busy second, vllm-priority 455). A sweep per engine picks its own.
# NOTE: the vLLM backend's chunk is a trade, measured paired (`--policies
# vllm-priority,mixgate-vllm --repeats 2`, --envelope this default at 128 or 256, so vLLM's
# long_prefill_token_threshold moved with it; a faster 2-vCPU AMD EPYC, chats alone at a TTFT
# p99 of 22-79 ms). On `mixed` (4 chats a second: the cap is on the whole phase) 256 bought
# mixgate-vllm bulk: 1,444-1,572 tokens per busy s against 1,023-1,232 (÷ vllm-priority's
# 1.07-1.13 against 0.76-0.92; vllm-priority's own 1,293-1,385 either way); on
# chat-over-backlog its rate did not separate from noise (1,077-1,407 against 1,162-1,251).
# It cost the chat's tail on both: TTFT p99 under the backlog ÷ alone 1.9-3.1× against
# 1.4-1.9×, and ITL p99 23-30 ms against 15 on chat-over-backlog. 128 stays: this envelope
# serves chat first; a deployment that wants the bulk sweeps for its own (`envelope derive`).
DEFAULT_BULK_CHUNK_TOKENS: Final = {"native": 64, "vllm": 128}


# Fields that must be integers >= 1, checked in one loop to keep __post_init__ readable.
_POSITIVE_INT_FIELDS: Final = (
    "max_active_seqs",
    "step_token_budget",
    "bulk_prefill_chunk_tokens",
    "interactive_queue_limit",
    "bulk_queue_limit",
)


@dataclass(frozen=True, slots=True)
class Envelope:
    # At most this many bulk sequences hold KV blocks and take part in a step (and every
    # sequence, but for the interactive slots on top: interactive_reserved_seqs).
    max_active_seqs: int
    # Tokens one step may carry (decodes + prefill chunks); it is what bounds ITL.
    step_token_budget: int
    # Bulk prefill tokens per step at most, so a long bulk prompt cannot crowd out decodes.
    bulk_prefill_chunk_tokens: int
    # Share of the step budget bulk is guaranteed once it has waited bulk_aging_s (engine).
    bulk_min_share: float
    bulk_aging_s: float
    # Added to bulk enqueue times in the claim pick (policies/aging.py): queue-level aging.
    bulk_class_offset_ms: int
    interactive_queue_limit: int
    bulk_queue_limit: int
    interactive_limits: LengthLimits
    bulk_limits: LengthLimits
    interactive_ttft_target_s: float
    # Slots above max_active_seqs that only interactive work takes, so a bulk backlog that fills
    # the engine never makes the next chat user wait for a bulk job to finish, and never costs
    # bulk a slot either (the engine overcommits for chats, as vLLM's priority mode gives low
    # priority all of max_num_seqs).
    interactive_reserved_seqs: int
    provenance: Provenance = field(default_factory=Provenance)

    def __post_init__(self) -> None:
        for name in _POSITIVE_INT_FIELDS:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.step_token_budget < self.max_active_seqs:
            # Every running sequence's decode token must fit in one step, or a decode would be
            # skipped, which the scheduler's contract forbids.
            raise ValueError("step_token_budget must be >= max_active_seqs")
        if self.bulk_prefill_chunk_tokens > self.step_token_budget:
            raise ValueError("bulk_prefill_chunk_tokens must not exceed step_token_budget")
        if not 0.0 < self.bulk_min_share < 1.0:
            # 0 would let interactive starve bulk in the engine; 1 would starve interactive.
            raise ValueError("bulk_min_share must be strictly between 0 and 1")
        if not (math.isfinite(self.bulk_aging_s) and self.bulk_aging_s >= 0):
            raise ValueError("bulk_aging_s must be finite and non-negative")
        if self.bulk_class_offset_ms < 0:
            raise ValueError("bulk_class_offset_ms must be non-negative")
        ttft_target_s = self.interactive_ttft_target_s
        if not (math.isfinite(ttft_target_s) and ttft_target_s > 0):
            raise ValueError("interactive_ttft_target_s must be positive and finite")
        if not 0 <= self.interactive_reserved_seqs < self.max_active_seqs:
            raise ValueError("interactive_reserved_seqs must be in [0, max_active_seqs)")

    def slots_by_class(self) -> dict[RequestClass, int]:
        """Sequences of each class a replica runs at once: bulk fills max_active_seqs,
        interactive may take those and the reserved ones on top."""
        return {
            RequestClass.INTERACTIVE: self.max_active_seqs + self.interactive_reserved_seqs,
            RequestClass.BULK: self.max_active_seqs,
        }

    @classmethod
    def default(cls, engine: str = "native") -> Envelope:
        """Conservative CPU defaults: a starting point until a sweep produces a better one.

        `engine` ("native" or "vllm", `mixgate serve --engine`) picks the bulk chunk: the one
        knob measured to want a different value per engine (DEFAULT_BULK_CHUNK_TOKENS)."""
        if engine not in DEFAULT_BULK_CHUNK_TOKENS:
            raise ValueError(f"unknown engine {engine!r}: {', '.join(DEFAULT_BULK_CHUNK_TOKENS)}")
        return cls(
            max_active_seqs=32,
            step_token_budget=512,
            bulk_prefill_chunk_tokens=DEFAULT_BULK_CHUNK_TOKENS[engine],
            bulk_min_share=0.2,
            bulk_aging_s=5.0,
            bulk_class_offset_ms=30_000,
            interactive_queue_limit=64,
            bulk_queue_limit=10_000,
            interactive_limits=LengthLimits(
                max_prompt_tokens=4096, max_output_tokens=1024, max_context_tokens=8192
            ),
            bulk_limits=LengthLimits(
                max_prompt_tokens=8192, max_output_tokens=4096, max_context_tokens=8192
            ),
            interactive_ttft_target_s=2.0,
            interactive_reserved_seqs=4,
            provenance=Provenance(
                source="default", notes=f"built-in CPU defaults for the {engine} engine"
            ),
        )

    def queue_limit(self, request_class: RequestClass) -> int:
        if request_class is RequestClass.INTERACTIVE:
            return self.interactive_queue_limit
        return self.bulk_queue_limit

    def length_limits(self, request_class: RequestClass) -> LengthLimits:
        if request_class is RequestClass.INTERACTIVE:
            return self.interactive_limits
        return self.bulk_limits

    def length_limits_by_class(self) -> dict[RequestClass, LengthLimits]:
        """The mapping ``decide_admission`` takes."""
        return {c: self.length_limits(c) for c in RequestClass}

    def to_dict(self) -> dict[str, object]:
        """Plain nested dict (the TOML layout; also what ``/v1/envelope`` serves as JSON)."""
        data: dict[str, object] = {key: getattr(self, key) for key in (*_INT_KEYS, *_FLOAT_KEYS)}
        for request_class in RequestClass:
            limits = self.length_limits(request_class)
            data[request_class.value] = {
                "queue_limit": self.queue_limit(request_class),
                "max_prompt_tokens": limits.max_prompt_tokens,
                "max_output_tokens": limits.max_output_tokens,
                "max_context_tokens": limits.max_context_tokens,
            }
        provenance = self.provenance
        data["provenance"] = {
            **{key: getattr(provenance, key) for key in _PROVENANCE_STR_KEYS},
            "slo": dict(provenance.slo),
        }
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Envelope:
        """The inverse of ``to_dict``; unknown or missing keys raise ValueError naming them."""
        class_keys = tuple(c.value for c in RequestClass)
        _check_keys(data, (*_INT_KEYS, *_FLOAT_KEYS, *class_keys, "provenance"), (), "")
        ints = {key: _get_int(data, key, "") for key in _INT_KEYS}
        floats = {key: _get_float(data, key, "") for key in _FLOAT_KEYS}
        queue_limits: dict[RequestClass, int] = {}
        length_limits: dict[RequestClass, LengthLimits] = {}
        for request_class in RequestClass:
            where = request_class.value
            table = _get_table(data, where, "")
            _check_keys(table, _CLASS_KEYS, (), where)
            queue_limits[request_class] = _get_int(table, "queue_limit", where)
            length_limits[request_class] = LengthLimits(
                max_prompt_tokens=_get_int(table, "max_prompt_tokens", where),
                max_output_tokens=_get_int(table, "max_output_tokens", where),
                max_context_tokens=_get_int(table, "max_context_tokens", where),
            )
        return cls(
            max_active_seqs=ints["max_active_seqs"],
            step_token_budget=ints["step_token_budget"],
            bulk_prefill_chunk_tokens=ints["bulk_prefill_chunk_tokens"],
            bulk_min_share=floats["bulk_min_share"],
            bulk_aging_s=floats["bulk_aging_s"],
            bulk_class_offset_ms=ints["bulk_class_offset_ms"],
            interactive_queue_limit=queue_limits[RequestClass.INTERACTIVE],
            bulk_queue_limit=queue_limits[RequestClass.BULK],
            interactive_limits=length_limits[RequestClass.INTERACTIVE],
            bulk_limits=length_limits[RequestClass.BULK],
            interactive_ttft_target_s=floats["interactive_ttft_target_s"],
            interactive_reserved_seqs=ints["interactive_reserved_seqs"],
            provenance=_provenance_from_dict(_get_table(data, "provenance", "")),
        )


def load_envelope(text: str) -> Envelope:
    """Parse TOML text (``tomllib``); syntax errors surface as ``tomllib.TOMLDecodeError``,
    itself a ValueError, so callers catch one exception type for every bad file."""
    return Envelope.from_dict(tomllib.loads(text))


def dump_envelope(env: Envelope) -> str:
    """TOML text that ``load_envelope`` reads back equal to ``env``."""
    return dump_toml(env.to_dict())
