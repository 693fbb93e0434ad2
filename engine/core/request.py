"""What goes into the engine (a request) and what comes out (deltas, with exact timings)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.sampling_params import SamplingParams
from policies.request_class import RequestClass


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    request_class: RequestClass = RequestClass.INTERACTIVE
    # Engine-clock arrival; None means "when the engine accepts it". The gateway passes the
    # time the request entered the service so queue delay counts in TTFT.
    arrival_s: float | None = None
    # Engine-clock time the gateway handed it to the engine (None: not recorded); with the
    # engine's own acceptance time it splits queue delay into dispatch, hand-off and queue.
    handed_s: float | None = None

    def __post_init__(self) -> None:
        if not self.request_id:
            raise ValueError("request_id must be non-empty")
        if not self.prompt_token_ids:
            raise ValueError("the prompt is empty: at least one token is needed")


@dataclass(slots=True)
class RequestMetrics:
    """Engine-clock timestamps of one request, so TTFT, ITL and end-to-end times are exact."""

    arrival_s: float
    # When the gateway handed the request to the engine, and when the engine core took it in
    # (after the step in flight, across the process boundary); None where not recorded.
    handed_s: float | None = None
    accepted_s: float | None = None
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    # The first token whose text is not empty: what a streaming client sees as its first
    # token (a multi-byte character's first bytes or a held-back stop string show nothing).
    first_text_s: float | None = None
    # The time each output token was produced (the end of the step that sampled it).
    token_times_s: list[float] = field(default_factory=list)
    finished_s: float | None = None
    num_preemptions: int = 0
    # Prompt tokens served from the prefix cache at the first scheduling.
    num_cached_prompt_tokens: int = 0

    @property
    def queue_delay_s(self) -> float | None:
        return None if self.first_scheduled_s is None else self.first_scheduled_s - self.arrival_s

    @property
    def dispatch_s(self) -> float | None:
        """Admission -> handed to the engine (Redis queue, claim, the gateway's loop)."""
        return None if self.handed_s is None else self.handed_s - self.arrival_s

    @property
    def accept_s(self) -> float | None:
        """Handed -> taken in by the engine core (transport, the step in flight)."""
        if self.handed_s is None or self.accepted_s is None:
            return None
        return self.accepted_s - self.handed_s

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def text_ttft_s(self) -> float | None:
        return None if self.first_text_s is None else self.first_text_s - self.arrival_s

    @property
    def itls_s(self) -> list[float]:
        times = self.token_times_s
        return [b - a for a, b in zip(times, times[1:], strict=False)]

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished_s is None else self.finished_s - self.arrival_s


@dataclass(slots=True)
class RequestOutput:
    """One delta of a request: the tokens and text produced since the previous delta."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    # "stop" (EOS, stop token or stop string), "length" (max_tokens or context), "abort".
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    # Present on the final delta.
    metrics: RequestMetrics | None = None
