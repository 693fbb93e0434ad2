"""What the jobs a replica holds still have to run, per class, as running sums.

Admission reads it at every bulk decision (`policies/in_flight_work.py` says why it matters),
which at 2,000 submissions a second rules out a walk over the held jobs per decision: the sums
move when a job is claimed, when its request is parsed (its prompt/output split is known only
then), when it makes tokens and when it ends.

The dispatcher keys its jobs by lease token; the simulator (bench/sim/gateway.py) by request id.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from policies.in_flight_work import InFlightWork
from policies.request_class import RequestClass

__all__ = ["WorkInFlight"]


@dataclass(slots=True)
class _Held:
    request_class: RequestClass
    prompt_tokens: int
    output_tokens: int


class WorkInFlight:
    def __init__(self) -> None:
        self._held: dict[Hashable, _Held] = {}
        self._jobs = dict.fromkeys(RequestClass, 0)
        self._prompt_tokens = dict.fromkeys(RequestClass, 0)
        self._output_tokens = dict.fromkeys(RequestClass, 0)

    def of(self, request_class: RequestClass) -> InFlightWork:
        return InFlightWork(
            self._jobs[request_class],
            self._prompt_tokens[request_class],
            self._output_tokens[request_class],
        )

    def start(
        self, key: Hashable, request_class: RequestClass, prompt_tokens: int, output_tokens: int
    ) -> None:
        """A job is held from now. Before its request is parsed the caller may know only its
        cost (prompt + max_tokens): counted as prompt, the part that delays the jobs behind it
        most, until `update` splits it."""
        if key in self._held:
            raise ValueError(f"{key!r} is already held")
        self._held[key] = _Held(request_class, 0, 0)
        self._jobs[request_class] += 1
        self.update(key, prompt_tokens, output_tokens)

    def update(self, key: Hashable, prompt_tokens: int, output_tokens: int) -> None:
        """The job's prompt tokens still to prefill and output tokens still to make."""
        held = self._held.get(key)
        if held is None:
            return  # ended already
        if prompt_tokens < 0 or output_tokens < 0:
            raise ValueError("token counts must be non-negative")
        cls = held.request_class
        self._prompt_tokens[cls] += prompt_tokens - held.prompt_tokens
        self._output_tokens[cls] += output_tokens - held.output_tokens
        held.prompt_tokens, held.output_tokens = prompt_tokens, output_tokens

    def made_tokens(self, key: Hashable, count: int) -> None:
        """The job made `count` tokens: its prompt is done, its outputs `count` fewer."""
        held = self._held.get(key)
        if held is not None:
            self.update(key, 0, max(0, held.output_tokens - count))

    def end(self, key: Hashable) -> None:
        """The job is no longer held (finished, failed, cancelled, handed back); idempotent."""
        if key not in self._held:
            return
        self.update(key, 0, 0)
        held = self._held.pop(key)
        self._jobs[held.request_class] -= 1
