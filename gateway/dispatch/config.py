"""`DispatcherConfig`: how one replica pulls work from the queues (slots, leases, cadences)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from policies.request_class import RequestClass

DEFAULT_LEASE_MS = 10_000
# See DispatcherConfig.max_unstarted_bulk_jobs.
DEFAULT_MAX_UNSTARTED_BULK_JOBS = 4


def _default_offsets_ms() -> Mapping[RequestClass, int]:
    # Linear aging: a bulk job that has waited 30 s beats a fresh interactive one.
    return MappingProxyType({RequestClass.INTERACTIVE: 0, RequestClass.BULK: 30_000})


def _frozen(mapping: Mapping[RequestClass, int]) -> Mapping[RequestClass, int]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True, slots=True)
class DispatcherConfig:
    # Written into each lease, so operators can see which replica holds a job.
    replica_id: str
    # Local in-flight jobs per class at most; a class at its limit is not claimed. Build it
    # from the envelope with `for_engine` (interactive gets every slot, bulk leaves a reserve).
    max_active_by_class: Mapping[RequestClass, int]
    # A lease not renewed for this long is reclaimed by any replica (and the job retried).
    lease_ms: int = DEFAULT_LEASE_MS
    # NOTE: a third of the lease, so two renewals in a row may fail (a Redis blip, a long GC
    # pause) before the lease lapses.
    renew_interval_ms: int = DEFAULT_LEASE_MS // 3
    # How often this replica sweeps lapsed leases (of any replica, itself included).
    reclaim_interval_ms: int = DEFAULT_LEASE_MS // 2
    # Leases one reclaim call handles; the sweep repeats while a call comes back full.
    reclaim_batch: int = 100
    # Aging offsets per class (effective score = enqueue_ms + offset; lowest is claimed).
    class_offsets_ms: Mapping[RequestClass, int] = field(default_factory=_default_offsets_ms)
    # An idle replica blocks this long on the wake-up key (BZPOPMIN) before it claims again;
    # it bounds how late a job is seen whose wake-up went to a replica without room for it.
    wait_timeout_s: float = 1.0
    # Backoff of retried Redis writes (publish, complete) and of loops after an error.
    retry_initial_backoff_ms: int = 50
    retry_max_backoff_ms: int = 2_000
    # At stop, after the drain timeout: how long aborted jobs get to let go and jobs that
    # were already writing their result get to finish that write.
    hand_back_grace_s: float = 2.0
    # Local bulk jobs that have made no token yet (in the engine's queue or mid-prefill), at
    # most: past it, bulk is claimed again only as one of them makes its first token. None:
    # bulk fills its slots at once. NOTE: a backlog claimed up to the slots waits in this
    # engine's queue, out of reach of a replica with room (`mixed`'s 400-job burst on vLLM: 32
    # claimed at once, ~18 of them waiting there), and every claim's engine hand-over lands on
    # the gateway's loop in one burst. The engine needs only enough unstarted work to fill its
    # bulk prefill until the next claim lands, one Redis round trip later: four prompts are
    # several steps of prefill (512-1,024-token prompts against 256-512 bulk tokens a step).
    max_unstarted_bulk_jobs: int | None = DEFAULT_MAX_UNSTARTED_BULK_JOBS

    def __post_init__(self) -> None:
        if not self.replica_id or any(ch.isspace() for ch in self.replica_id):
            raise ValueError(f"replica_id must be non-empty without spaces: {self.replica_id!r}")
        self._check_classes()
        self._check_timing()
        # Frozen all the way down: a caller's dict changed later must not change the config.
        object.__setattr__(self, "max_active_by_class", _frozen(self.max_active_by_class))
        object.__setattr__(self, "class_offsets_ms", _frozen(self.class_offsets_ms))

    def _check_classes(self) -> None:
        for name, mapping in (
            ("max_active_by_class", self.max_active_by_class),
            ("class_offsets_ms", self.class_offsets_ms),
        ):
            missing = [c.value for c in RequestClass if c not in mapping]
            if missing:
                raise ValueError(f"{name} has no entry for {missing}")
        if any(n < 0 for n in self.max_active_by_class.values()):
            raise ValueError("max_active_by_class values must be >= 0")
        if not any(self.max_active_by_class.values()):
            raise ValueError("max_active_by_class must allow at least one job")
        if any(ms < 0 for ms in self.class_offsets_ms.values()):
            raise ValueError("class_offsets_ms values must be >= 0")

    def _check_timing(self) -> None:
        if self.lease_ms < 2:
            raise ValueError(f"lease_ms must be >= 2, got {self.lease_ms}")
        if not 1 <= self.renew_interval_ms <= self.lease_ms // 2:
            raise ValueError(
                f"renew_interval_ms must be in [1, lease_ms / 2 = {self.lease_ms // 2}] so a "
                f"lease survives one failed renewal, got {self.renew_interval_ms}"
            )
        if self.reclaim_interval_ms < 1:
            raise ValueError(f"reclaim_interval_ms must be >= 1, got {self.reclaim_interval_ms}")
        if self.reclaim_batch < 1:
            raise ValueError(f"reclaim_batch must be >= 1, got {self.reclaim_batch}")
        if self.wait_timeout_s <= 0:
            raise ValueError(f"wait_timeout_s must be > 0, got {self.wait_timeout_s}")
        if not 1 <= self.retry_initial_backoff_ms <= self.retry_max_backoff_ms:
            raise ValueError("need 1 <= retry_initial_backoff_ms <= retry_max_backoff_ms")
        if self.hand_back_grace_s < 0:
            raise ValueError(f"hand_back_grace_s must be >= 0, got {self.hand_back_grace_s}")
        if self.max_unstarted_bulk_jobs is not None and self.max_unstarted_bulk_jobs < 1:
            raise ValueError(
                f"max_unstarted_bulk_jobs must be >= 1 or None, got {self.max_unstarted_bulk_jobs}"
            )

    @classmethod
    def for_engine(
        cls,
        replica_id: str,
        *,
        max_active_seqs: int,
        interactive_reserved_seqs: int,
        lease_ms: int = DEFAULT_LEASE_MS,
        **overrides: Any,
    ) -> DispatcherConfig:
        """Slots from the envelope: bulk fills `max_active_seqs`, chat takes those and
        `interactive_reserved_seqs` more on top (policies/envelope.py:Envelope.slots_by_class).

        Renew and reclaim cadences follow `lease_ms` (a third and a half of it) unless given.
        """
        if max_active_seqs < 1:
            raise ValueError(f"max_active_seqs must be >= 1, got {max_active_seqs}")
        if not 0 <= interactive_reserved_seqs < max_active_seqs:
            raise ValueError(
                "interactive_reserved_seqs must be in [0, max_active_seqs), got "
                f"{interactive_reserved_seqs} of {max_active_seqs}"
            )
        overrides.setdefault("renew_interval_ms", max(1, lease_ms // 3))
        overrides.setdefault("reclaim_interval_ms", max(1, lease_ms // 2))
        slots = {
            RequestClass.INTERACTIVE: max_active_seqs + interactive_reserved_seqs,
            RequestClass.BULK: max_active_seqs,
        }
        return cls(replica_id=replica_id, max_active_by_class=slots, lease_ms=lease_ms, **overrides)
