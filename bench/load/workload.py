"""Workloads: what load to offer a mixgate server, and the concrete requests it turns into.

The spec (frozen dataclasses) lives in workload_spec.py, its TOML form in workload_toml.py;
this module plans requests from it. Plans are deterministic for the workload's seed, with one
`random.Random` per class (and purpose) seeded from (seed, class), so removing or rescaling one
class never changes the other's requests: "chat alone" and "chat in the mix" are the same chat.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from bench.load.workload_spec import (
    ARRIVAL_KINDS,
    CANCEL_WHEN,
    LENGTH_KINDS,
    Arrival,
    Cancellation,
    ClassLoad,
    LengthDist,
    Workload,
)
from bench.load.workload_toml import (
    BUILTIN_WORKLOADS,
    dump_workload,
    load_workload,
    parse_workload,
    workload_from_dict,
)
from policies.request_class import RequestClass

__all__ = [
    "ARRIVAL_KINDS",
    "BUILTIN_WORKLOADS",
    "CANCEL_WHEN",
    "CHAT_TEMPLATE_OVERHEAD_TOKENS",
    "LENGTH_KINDS",
    "Arrival",
    "Cancellation",
    "ClassLoad",
    "ClosedLoopSource",
    "LengthDist",
    "PlannedRequest",
    "Workload",
    "arrival_times",
    "dump_workload",
    "load_workload",
    "parse_workload",
    "plan_open_loop",
    "prompt_messages",
    "request_rng",
    "workload_from_dict",
]

# What the ChatML template adds around one user message with the byte-level tokenizer:
# "<|im_start|>user\n" + "<|im_end|>\n" + "<|im_start|>assistant\n" (special tokens count 1).
CHAT_TEMPLATE_OVERHEAD_TOKENS = 19

# Lower-case ASCII words: one byte, one token; random picks keep prompts distinct, so the
# server's prefix cache cannot turn a load test into a cache test.
_WORD_TEXT = (
    "the of and to in is was for on that with as by at from it an be this are or which "
    "queue token batch model cache block prefill decode stream latency budget deadline job "
    "river stone cloud paper green seven window garden yellow silver market number signal "
    "engine request server client answer little before after under across simple random"
)
_WORDS = tuple(_WORD_TEXT.split())


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """One request to send: `at_s` seconds after the run starts."""

    index: int
    request_class: RequestClass
    at_s: float
    prompt_tokens: int
    max_tokens: int
    # Only when this request drew a cancellation (with the class's probability).
    cancel: Cancellation | None = None
    deadline_s: float | None = None


def _rng(seed: int, request_class: RequestClass, purpose: str) -> random.Random:
    # NOTE: str seeds hash with sha512 inside random.seed: stable across processes and
    # PYTHONHASHSEED, unlike hash(tuple).
    return random.Random(f"{seed}:{request_class.value}:{purpose}")


def request_rng(seed: int, request_class: RequestClass, index: int) -> random.Random:
    """A request's own generator (its prompt text, its cancel delay)."""
    return random.Random(f"{seed}:{request_class.value}:request:{index}")


def _poisson(rng: random.Random, rate_per_s: float, start_s: float, end_s: float) -> list[float]:
    times: list[float] = []
    if rate_per_s <= 0:
        return times
    t = start_s + rng.expovariate(rate_per_s)
    while t < end_s:
        times.append(t)
        t += rng.expovariate(rate_per_s)
    return times


def arrival_times(arrival: Arrival, duration_s: float, rng: random.Random) -> list[float]:
    """Sorted send times in [0, duration_s) of an open-loop arrival process."""
    if arrival.kind == "backlog":
        return [0.0] * arrival.count
    if arrival.kind == "poisson":
        return _poisson(rng, arrival.rate_per_s, 0.0, duration_s)
    if arrival.kind == "burst":
        base = _poisson(rng, arrival.rate_per_s, 0.0, duration_s)
        end_s = min(duration_s, arrival.burst_start_s + arrival.burst_duration_s)
        extra = _poisson(rng, arrival.burst_rate_per_s, arrival.burst_start_s, end_s)
        return sorted(base + extra)
    raise ValueError(f"arrival.kind: {arrival.kind!r} is not an open-loop arrival")


def _draw(load: ClassLoad, rng: random.Random, index: int, at_s: float) -> PlannedRequest:
    long = load.long_context_prompt_tokens
    # Always draw the long-context coin so adding a tail does not reshuffle the other draws.
    use_long = rng.random() < load.long_context_probability
    prompt = (long if use_long and long is not None else load.prompt_tokens).sample(rng)
    max_tokens = load.output_tokens.sample(rng)
    cancel_coin = rng.random()
    cancel = (
        load.cancel if load.cancel is not None and cancel_coin < load.cancel.probability else None
    )
    return PlannedRequest(
        index=index,
        request_class=load.request_class,
        at_s=at_s,
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        cancel=cancel,
        deadline_s=load.deadline_s,
    )


def plan_open_loop(workload: Workload) -> list[PlannedRequest]:
    """Every request of the open-loop classes, sorted by send time (all before duration_s).

    Indexes count per class, so a request keeps its index (and prompt) in `only()`."""
    planned: list[PlannedRequest] = []
    for cls in RequestClass:
        load = workload.classes.get(cls)
        if load is None or not load.arrival.open_loop:
            continue
        times = arrival_times(
            load.arrival, workload.duration_s, _rng(workload.seed, cls, "arrival")
        )
        sizes = _rng(workload.seed, cls, "sizes")
        planned += [_draw(load, sizes, i, t) for i, t in enumerate(times)]
    # Stable sort: equal times (a backlog) keep class order, then index order.
    planned.sort(key=lambda req: req.at_s)
    return planned


class ClosedLoopSource:
    """The request sequence of a closed-loop class: the same sizes whoever asks when."""

    def __init__(self, workload: Workload, request_class: RequestClass) -> None:
        load = workload.classes.get(request_class)
        if load is None or load.arrival.kind != "closed":
            raise ValueError(f"{request_class.value}.arrival.kind: not a closed-loop class")
        self._load = load
        self._rng = _rng(workload.seed, request_class, "closed")
        self._next_index = 0

    def next_request(self, now_s: float) -> PlannedRequest:
        request = _draw(self._load, self._rng, self._next_index, now_s)
        self._next_index += 1
        return request


def prompt_messages(rng: random.Random, num_tokens: int) -> list[dict[str, Any]]:
    """One user message that the byte-level tokenizer + ChatML make about `num_tokens` long."""
    content_len = max(1, num_tokens - CHAT_TEMPLATE_OVERHEAD_TOKENS)
    words: list[str] = []
    length = 0
    while length < content_len:
        word = rng.choice(_WORDS)
        words.append(word)
        length += len(word) + 1
    return [{"role": "user", "content": " ".join(words)[:content_len]}]
