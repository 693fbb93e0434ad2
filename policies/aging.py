"""Class pick with linear aging: the reference for the Redis claim script.

Each class queue is a ZSET scored by enqueue time (ms). A claim looks at the head of each class
and compares *effective* scores, ``enqueue_ms + class offset``; the lowest wins and ties go to
interactive. With the default offsets (interactive 0, bulk 30 000 ms) a bulk job that has waited
more than 30 s beats an interactive request enqueued just now, so waiting is what lifts bulk:
linear aging, one subtraction in Lua, no background re-scoring.

The Lua script mirrors ``pick_class`` and tests compare the two, so this module must stay
exactly that rule (integer milliseconds, the same tie-break), nothing cleverer.

Starvation bound (``max_wait_bound_ms``). Write ``delta_ms = bulk_ms - interactive_ms``. A bulk
job ``b`` enqueued at ``e_b`` loses to an interactive job ``i`` only if ``e_i <= e_b + delta_ms``.
So from the moment ``b`` is at the head of the bulk queue (time ``h >= e_b``), the claims that
can go before it are at most the interactive jobs pending at ``h`` (``backlog``) plus those
enqueued in ``(h, e_b + delta_ms]``, a window no longer than ``delta_ms``. If interactive
enqueues arrive at a peak rate ``lam`` (at least ``1/lam`` s apart), that window holds at most
``ceil(lam * delta_s)`` of them. If a claim open to both classes happens at least every
``1/mu`` s, ``b`` is claimed by claim number ``backlog + ceil(lam * delta_s) + 1``, so::

    wait_at_head_s <= (backlog + ceil(lam * delta_s) + 1) / mu

This holds for any ``lam``, including ``lam >= mu``: interactive overload delays bulk by at most
``delta`` worth of interactive arrivals, never forever. It assumes every claim may take bulk;
claims restricted to interactive (the dispatcher's reserved interactive slots) do not count
toward ``mu``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from policies.request_class import RequestClass

__all__ = ["ClassOffsets", "effective_score_ms", "max_wait_bound_ms", "pick_class"]


@dataclass(frozen=True, slots=True)
class ClassOffsets:
    """Milliseconds added to each class's enqueue time before heads are compared."""

    interactive_ms: int = 0
    bulk_ms: int = 30_000

    def __post_init__(self) -> None:
        for name in ("interactive_ms", "bulk_ms"):
            value = getattr(self, name)
            # bool is an int subclass; a True offset is a bug, not 1 ms.
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")

    def offset_ms(self, request_class: RequestClass) -> int:
        if request_class is RequestClass.INTERACTIVE:
            return self.interactive_ms
        return self.bulk_ms

    def by_class_ms(self) -> dict[RequestClass, int]:
        """The offsets as the queue store's claim takes them (``class_offsets_ms``)."""
        return {c: self.offset_ms(c) for c in RequestClass}

    @property
    def bulk_delta_ms(self) -> int:
        """How much later than an interactive job a bulk job may be enqueued and still tie."""
        return self.bulk_ms - self.interactive_ms


def effective_score_ms(enqueue_ms: int, request_class: RequestClass, offsets: ClassOffsets) -> int:
    """The score the claim compares: enqueue time plus the class offset (lower goes first)."""
    return enqueue_ms + offsets.offset_ms(request_class)


# Interactive first, so that with a strict "<" below a tie keeps interactive.
_PICK_ORDER = (RequestClass.INTERACTIVE, RequestClass.BULK)


def pick_class(
    heads: Mapping[RequestClass, int | None], offsets: ClassOffsets
) -> RequestClass | None:
    """The class whose head (enqueue ms, None or absent: empty queue) should be claimed next.

    The lowest effective score wins; ties go to interactive. None when every queue is empty.
    """
    best_class: RequestClass | None = None
    best_score_ms = 0
    for request_class in _PICK_ORDER:
        head_ms = heads.get(request_class)
        if head_ms is None:
            continue
        score_ms = effective_score_ms(head_ms, request_class, offsets)
        if best_class is None or score_ms < best_score_ms:
            best_class, best_score_ms = request_class, score_ms
    return best_class


def max_wait_bound_ms(
    offsets: ClassOffsets,
    interactive_backlog: int,
    interactive_arrivals_per_s: float,
    claims_per_s: float,
) -> int:
    """Upper bound on how long the bulk head waits to be claimed (ms, rounded up).

    ``interactive_backlog``: interactive jobs pending when the bulk job reached the head.
    ``interactive_arrivals_per_s``: peak interactive enqueue rate (0 for none).
    ``claims_per_s``: the minimum rate of claims open to bulk (service rate). See the module
    docstring for the proof. If ``bulk_ms <= interactive_ms`` no later interactive job can
    pass the bulk head, and only the backlog counts.
    """
    if interactive_backlog < 0:
        raise ValueError("interactive_backlog must be non-negative")
    if not (math.isfinite(interactive_arrivals_per_s) and interactive_arrivals_per_s >= 0):
        raise ValueError("interactive_arrivals_per_s must be finite and non-negative")
    if not (math.isfinite(claims_per_s) and claims_per_s > 0):
        raise ValueError("claims_per_s must be positive and finite")
    window_s = max(0, offsets.bulk_delta_ms) / 1000
    # NOTE: ceil of a float product can round up one arrival too many when lam * delta is an
    # exact integer in theory; that only loosens the bound, it never breaks it.
    overtaking_arrivals = math.ceil(interactive_arrivals_per_s * window_s)
    claims_needed = interactive_backlog + overtaking_arrivals + 1
    return math.ceil(claims_needed / claims_per_s * 1000)
