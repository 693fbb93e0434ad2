"""What a workload is: per-class arrival processes and length distributions, as frozen data.

Validation errors name the offending field ("rate_per_s: must be >= 0"); the TOML reader
prefixes the table path, so a user sees "interactive.arrival.rate_per_s: must be >= 0".
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from policies.request_class import RequestClass

__all__ = [
    "ARRIVAL_KINDS",
    "CANCEL_WHEN",
    "LENGTH_KINDS",
    "Arrival",
    "Cancellation",
    "ClassLoad",
    "LengthDist",
    "Workload",
]

LENGTH_KINDS = ("fixed", "uniform", "lognormal", "choice")
ARRIVAL_KINDS = ("poisson", "burst", "closed", "backlog")
OPEN_LOOP_KINDS = ("poisson", "burst", "backlog")
CANCEL_WHEN = ("before_first_token", "mid_stream")
# NOTE: the small preset's context; a default upper clamp so a lognormal tail stays servable.
DEFAULT_MAX_TOKENS = 8192


def _kind(kind: str, allowed: tuple[str, ...]) -> None:
    if kind not in allowed:
        raise ValueError(f"kind: unknown kind {kind!r}; expected one of {', '.join(allowed)}")


def _at_least(name: str, value: float, low: float) -> None:
    # `not >=` also rejects NaN, which would otherwise slip through every comparison.
    if not value >= low:
        raise ValueError(f"{name}: must be >= {low:g}, got {value!r}")


def _probability(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name}: must be a probability in [0, 1], got {value!r}")


@dataclass(frozen=True, slots=True)
class LengthDist:
    """A token count distribution; every sample lies in [min, max]."""

    kind: str
    value: int = 0
    min: int = 1
    max: int = DEFAULT_MAX_TOKENS
    median: float = 0.0
    sigma: float = 0.0
    choices: tuple[int, ...] = ()
    weights: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        _kind(self.kind, LENGTH_KINDS)
        _at_least("min", self.min, 1)
        if self.max < self.min:
            raise ValueError(f"max: must be >= min ({self.min}), got {self.max}")
        if self.kind == "fixed":
            _at_least("value", self.value, 1)
        if self.kind == "lognormal":
            if not self.median > 0:
                raise ValueError(f"median: must be > 0, got {self.median!r}")
            _at_least("sigma", self.sigma, 0.0)
        if self.kind == "choice":
            if not self.choices:
                raise ValueError("choices: must not be empty")
            for choice in self.choices:
                _at_least("choices", choice, 1)
            if self.weights and len(self.weights) != len(self.choices):
                raise ValueError("weights: must be as many as choices (or none)")
            for weight in self.weights:
                _at_least("weights", weight, 0.0)
            if self.weights and not sum(self.weights) > 0:
                raise ValueError("weights: must not all be zero")

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return self.value
        if self.kind == "uniform":
            return rng.randint(self.min, self.max)
        if self.kind == "lognormal":
            drawn = round(rng.lognormvariate(math.log(self.median), self.sigma))
            return min(self.max, max(self.min, drawn))
        weights = self.weights or None
        return rng.choices(self.choices, weights=weights)[0]

    def to_dict(self) -> dict[str, Any]:
        if self.kind == "fixed":
            return {"kind": "fixed", "value": self.value}
        if self.kind == "uniform":
            return {"kind": "uniform", "min": self.min, "max": self.max}
        if self.kind == "lognormal":
            return {"kind": "lognormal", "median": self.median, "sigma": self.sigma,
                    "min": self.min, "max": self.max}  # fmt: skip
        out: dict[str, Any] = {"kind": "choice", "choices": list(self.choices)}
        if self.weights:
            out["weights"] = list(self.weights)
        return out


@dataclass(frozen=True, slots=True)
class Arrival:
    """When requests arrive. Open loop (poisson, burst, backlog) ignores how fast the server
    answers; closed loop (`concurrency` clients, each waiting for its answer) adapts to it."""

    kind: str
    rate_per_s: float = 0.0
    burst_rate_per_s: float = 0.0
    burst_start_s: float = 0.0
    burst_duration_s: float = 0.0
    concurrency: int = 0
    count: int = 0

    def __post_init__(self) -> None:
        _kind(self.kind, ARRIVAL_KINDS)
        for name in ("rate_per_s", "burst_rate_per_s", "burst_start_s", "burst_duration_s",
                     "concurrency", "count"):  # fmt: skip
            _at_least(name, getattr(self, name), 0)
        if self.kind == "poisson" and not self.rate_per_s > 0:
            raise ValueError(f"rate_per_s: must be > 0 for {self.kind}, got {self.rate_per_s!r}")
        if self.kind == "burst":
            if not self.burst_rate_per_s > 0:
                raise ValueError("burst_rate_per_s: must be > 0 for a burst")
            if not self.burst_duration_s > 0:
                raise ValueError("burst_duration_s: must be > 0 for a burst")
        if self.kind == "closed":
            _at_least("concurrency", self.concurrency, 1)
        if self.kind == "backlog":
            _at_least("count", self.count, 1)

    @property
    def open_loop(self) -> bool:
        return self.kind in OPEN_LOOP_KINDS

    def scaled(self, load_factor: float) -> Arrival:
        return replace(
            self,
            rate_per_s=self.rate_per_s * load_factor,
            burst_rate_per_s=self.burst_rate_per_s * load_factor,
            concurrency=max(1, math.ceil(self.concurrency * load_factor))
            if self.concurrency
            else 0,
            count=max(1, round(self.count * load_factor)) if self.count else 0,
        )

    def to_dict(self) -> dict[str, Any]:
        keys = {
            "poisson": ("rate_per_s",),
            "burst": ("rate_per_s", "burst_rate_per_s", "burst_start_s", "burst_duration_s"),
            "closed": ("concurrency",),
            "backlog": ("count",),
        }[self.kind]
        return {"kind": self.kind, **{key: getattr(self, key) for key in keys}}


@dataclass(frozen=True, slots=True)
class Cancellation:
    """A client that gives up: with `probability`, before any token or after `after_tokens`."""

    probability: float
    when: str
    after_tokens: int = 8

    def __post_init__(self) -> None:
        _probability("probability", self.probability)
        if self.when not in CANCEL_WHEN:
            raise ValueError(
                f"when: unknown {self.when!r}; expected one of {', '.join(CANCEL_WHEN)}"
            )
        _at_least("after_tokens", self.after_tokens, 1)

    def to_dict(self) -> dict[str, Any]:
        return {"probability": self.probability, "when": self.when,
                "after_tokens": self.after_tokens}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ClassLoad:
    """The load of one class. `deadline_s` travels as X-Mixgate-Deadline-Ms (interactive) or
    as the job's deadline_s (bulk)."""

    request_class: RequestClass
    arrival: Arrival
    prompt_tokens: LengthDist
    output_tokens: LengthDist
    long_context_probability: float = 0.0
    long_context_prompt_tokens: LengthDist | None = None
    cancel: Cancellation | None = None
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        _probability("long_context.probability", self.long_context_probability)
        if self.long_context_probability > 0 and self.long_context_prompt_tokens is None:
            raise ValueError("long_context.prompt_tokens: required when probability > 0")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise ValueError(f"deadline_s: must be > 0, got {self.deadline_s!r}")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "arrival": self.arrival.to_dict(),
            "prompt_tokens": self.prompt_tokens.to_dict(),
            "output_tokens": self.output_tokens.to_dict(),
        }
        if self.long_context_prompt_tokens is not None:
            out["long_context"] = {
                "probability": self.long_context_probability,
                "prompt_tokens": self.long_context_prompt_tokens.to_dict(),
            }
        if self.cancel is not None:
            out["cancel"] = self.cancel.to_dict()
        if self.deadline_s is not None:
            out["deadline_s"] = self.deadline_s
        return out


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    description: str
    duration_s: float
    seed: int
    classes: Mapping[RequestClass, ClassLoad] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name: must not be empty")
        if not self.duration_s > 0:
            raise ValueError(f"duration_s: must be > 0, got {self.duration_s!r}")
        if not self.classes:
            raise ValueError("classes: a workload needs [interactive] or [bulk] (or both)")
        for cls, load in self.classes.items():
            if load.request_class is not cls:
                raise ValueError(f"{cls.value}: holds the load of {load.request_class.value}")

    def only(self, request_class: RequestClass) -> Workload:
        """The same workload with the other class removed (same seed: the same requests)."""
        if request_class not in self.classes:
            raise ValueError(f"{request_class.value}: not in workload {self.name!r}")
        return replace(
            self,
            name=f"{self.name}:{request_class.value}-only",
            classes={request_class: self.classes[request_class]},
        )

    def scaled(self, load_factor: float) -> Workload:
        """Rates and backlog counts times `load_factor` (closed-loop concurrency rounded up)."""
        if not load_factor > 0:
            raise ValueError(f"load_factor: must be > 0, got {load_factor!r}")
        classes = {
            cls: replace(load, arrival=load.arrival.scaled(load_factor))
            for cls, load in self.classes.items()
        }
        return replace(self, name=f"{self.name}@x{load_factor:g}", classes=classes)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "duration_s": self.duration_s,
            "seed": self.seed,
        }
        for cls in RequestClass:
            if cls in self.classes:
                out[cls.value] = self.classes[cls].to_dict()
        return out
