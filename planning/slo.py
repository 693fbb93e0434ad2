"""SLO spec files: the service targets an envelope is derived against.

Format (TOML)::

    headroom = 0.2              # fraction of the sustained load kept in reserve, in [0, 1)
    max_rejection_rate = 0.01   # per class, in [0, 1]; both optional, these are the defaults

    [[target]]
    class = "interactive"
    metric = "ttft_s"           # ttft_s | itl_s | e2e_s | queue_delay_s: seconds, needs
    percentile = 99             #   percentile (50, 90, 99) and max
    max = 0.5
    workload = "mixed"          # the workload the target was stated for (optional)

    [[target]]
    class = "interactive"
    metric = "itl_s"
    percentile = 99
    max = 0.1

    [[target]]
    class = "bulk"
    metric = "completion_within_deadline"   # fraction of the class's jobs that finished OK
    min = 0.99                              #   (an expired job missed its deadline), with min

Every key is checked: an unknown key, a wrong type or an impossible value is a ValueError that
names the target and the key, because a typo in an SLO would otherwise derive a wrong envelope
without a word.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from planning.envelope_derive import Slo, SloTarget

__all__ = ["SloSpec", "goodput_bounds", "load_slo", "read_slo"]

_TOP_KEYS: Final = ("headroom", "max_rejection_rate", "target")
_TARGET_KEYS: Final = ("class", "metric", "percentile", "max", "min", "workload")
DEFAULT_HEADROOM: Final = 0.2
DEFAULT_MAX_REJECTION_RATE: Final = 0.01
# The per-request metrics goodput bounds (as vLLM's benchmark and AIPerf: TTFT and ITL).
GOODPUT_METRICS: Final = ("ttft_s", "itl_s")
DEFAULT_SLO_PATH: Final = (
    Path(__file__).resolve().parents[1] / "bench" / "slos" / "chat-over-backlog.toml"
)


@dataclass(frozen=True, slots=True)
class SloSpec:
    targets: tuple[SloTarget, ...]
    headroom: float
    max_rejection_rate: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.headroom) and 0 <= self.headroom < 1):
            raise ValueError(f"headroom must be in [0, 1), got {self.headroom!r}")
        # Slo validates max_rejection_rate and duplicate targets.
        self.slo()

    def goodput_bounds(self) -> dict[str, dict[str, float]]:
        """Per class, the TTFT and ITL bounds a single request must meet to count as goodput
        (``bench.report.summary.goodput``): the ``max`` of the class's ttft_s / itl_s targets, at
        whatever percentile the target states (the tightest where several do)."""
        bounds: dict[str, dict[str, float]] = {}
        for target in self.targets:
            if target.metric not in GOODPUT_METRICS or target.max_value is None:
                continue
            per_class = bounds.setdefault(target.request_class, {})
            old = per_class.get(target.metric)
            per_class[target.metric] = (
                target.max_value if old is None else min(old, target.max_value)
            )
        return bounds

    def slo(self) -> Slo:
        """The pure form ``planning.envelope_derive.derive_envelope`` takes."""
        return Slo(targets=self.targets, max_rejection_rate=self.max_rejection_rate)


def _number(table: Mapping[str, Any], key: str, where: str) -> float | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where}: {key!r} must be a number, got {value!r}")
    return float(value)


def _target(table: Any, index: int) -> SloTarget:
    where = f"target[{index}]"
    if not isinstance(table, Mapping):
        raise ValueError(f"{where} must be a table ([[target]])")
    unknown = sorted(set(table) - set(_TARGET_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; known: {list(_TARGET_KEYS)}")
    for key in ("class", "metric"):
        if not isinstance(table.get(key), str):
            raise ValueError(f"{where}: {key!r} is required and must be a string")
    workload = table.get("workload", "")
    if not isinstance(workload, str):
        raise ValueError(f"{where}: 'workload' must be a string")
    percentile = table.get("percentile")
    if percentile is not None and (isinstance(percentile, bool) or not isinstance(percentile, int)):
        raise ValueError(f"{where}: 'percentile' must be an integer, got {percentile!r}")
    try:
        return SloTarget(
            request_class=table["class"],
            metric=table["metric"],
            percentile=percentile,
            max_value=_number(table, "max", where),
            min_value=_number(table, "min", where),
            workload=workload,
        )
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def load_slo(text: str) -> SloSpec:
    """Parse and validate an SLO spec (format in the module docstring)."""
    data = tomllib.loads(text)
    unknown = sorted(set(data) - set(_TOP_KEYS))
    if unknown:
        raise ValueError(f"unknown SLO key(s) {unknown}; known: {list(_TOP_KEYS)}")
    raw_targets = data.get("target", [])
    if not isinstance(raw_targets, list) or not raw_targets:
        raise ValueError("an SLO needs at least one [[target]] table")
    headroom = _number(data, "headroom", "SLO")
    max_rejection_rate = _number(data, "max_rejection_rate", "SLO")
    return SloSpec(
        targets=tuple(_target(table, i) for i, table in enumerate(raw_targets)),
        headroom=DEFAULT_HEADROOM if headroom is None else headroom,
        max_rejection_rate=(
            DEFAULT_MAX_REJECTION_RATE if max_rejection_rate is None else max_rejection_rate
        ),
    )


def read_slo(path: str | Path) -> SloSpec:
    """An SLO spec file (``load_slo`` of its text)."""
    return load_slo(Path(path).read_text(encoding="utf-8"))


def goodput_bounds(path: str | Path) -> dict[str, dict[str, float]]:
    """The goodput bounds of an SLO file (``SloSpec.goodput_bounds``)."""
    return read_slo(path).goodput_bounds()
