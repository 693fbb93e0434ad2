"""Fit the cost model's rates to timed steps: least squares over the rows, in relative error.

Isolated microbenchmarks do not predict an engine's steps: a CPU GEMM with a few rows streams
weights at half the matrix-vector rate, a paged cache is gathered before attention reads it,
and every step pays scheduling and sampling. So the rates are fitted to the engine's own steps
(``mixgate plan calibrate``): for each row, the model is::

    t = o + combine(a · flops, weights_s + c · kv_bytes, overlap)

with ``o`` the per-step overhead, ``a = 1/C``, ``c = 1/BW_kv`` (the KV cache's rate) and
``combine`` the cost model's overlap rule (``planning.costmodel``). ``weights_s`` uses a fixed
weight-streaming rate ``BW`` (the matrix-vector microbenchmark). NOTE: with one model, every
row reads the same weights, so ``W / BW`` and ``o`` are indistinguishable in the data: the fit
keeps ``BW`` as measured and lets ``o`` take the rest of the fixed per-step time.

For each overlap on a grid, rows are split by which term is larger, ``(o, a, c)`` solved by
weighted linear least squares (weights ``1/t``: relative error), the split redone until it
settles; the overlap with the smallest error wins. Negative solutions are refitted with that
parameter pinned (``o = 0``, or a rate so fast it costs nothing).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from planning.costmodel import HardwareRates, ModelShape, StepEstimate, mixed_step_estimate_s

__all__ = ["FitResult", "FitRow", "fit_rates", "row_estimate"]

OVERLAP_GRID = tuple(i / 10 for i in range(11))
_MAX_SPLIT_ROUNDS = 20
# Seconds per flop (or per byte) standing in for "costs nothing" when a term is pinned.
_FREE_S = 1e-18
# Starting points of the fit, as multiples of the microbenchmark's seconds per flop and byte.
_START_SCALES = (0.25, 1.0, 4.0, 16.0)


@dataclass(frozen=True, slots=True)
class FitRow:
    prefill_tokens: int
    decode_seqs: int
    context_tokens: int  # the decodes' mean cached length
    measured_s: float  # median step time

    def __post_init__(self) -> None:
        if self.prefill_tokens + self.decode_seqs < 1 or not self.measured_s > 0:
            raise ValueError("a row needs tokens and a positive measured time")


@dataclass(frozen=True, slots=True)
class FitResult:
    rates: HardwareRates
    relative_rms: float  # root mean square of (estimate - measured) / measured
    estimates_s: tuple[float, ...]  # per row, in the rows' order


def row_estimate(shape: ModelShape, rates: HardwareRates, row: FitRow) -> StepEstimate:
    return mixed_step_estimate_s(
        shape, rates, row.prefill_tokens, row.decode_seqs, row.context_tokens
    )


def _solve(matrix: list[list[float]], vector: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    n = len(vector)
    a = [row[:] + [vector[i]] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-300:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, n):
            factor = a[r][col] / a[col][col]
            for k in range(col, n + 1):
                a[r][k] -= factor * a[col][k]
    x = [0.0] * n
    for r in reversed(range(n)):
        x[r] = (a[r][n] - sum(a[r][k] * x[k] for k in range(r + 1, n))) / a[r][r]
    return x


def _weighted_lstsq(
    features: list[list[float]], targets: list[float], weights: list[float], free: tuple[int, ...]
) -> list[float] | None:
    """Minimise Σ w²(y − f·x)² over the ``free`` columns (the others are 0)."""
    if not free:
        return [0.0] * len(features[0])
    normal = [[0.0] * len(free) for _ in free]
    rhs = [0.0] * len(free)
    for f, y, w in zip(features, targets, weights, strict=True):
        for i, fi in enumerate(free):
            rhs[i] += w * w * f[fi] * y
            for j, fj in enumerate(free):
                normal[i][j] += w * w * f[fi] * f[fj]
    solved = _solve(normal, rhs)
    if solved is None:
        return None
    x = [0.0] * len(features[0])
    for i, fi in enumerate(free):
        x[fi] = solved[i]
    return x


@dataclass(frozen=True, slots=True)
class _Terms:
    flops: float
    weights_s: float
    kv_bytes: float
    measured_s: float


def _rates(base: HardwareRates, o: float, a: float, c: float, overlap: float) -> HardwareRates:
    return HardwareRates(
        flops_per_s=1.0 / max(a, _FREE_S),
        bytes_per_s=base.bytes_per_s,
        source=base.source,
        step_overhead_s=max(0.0, o),
        compute_memory_overlap=overlap,
        kv_bytes_per_s=1.0 / max(c, _FREE_S),
    )


def _relative_rms(terms: Sequence[_Terms], predict: Sequence[float]) -> float:
    errors = [(p - t.measured_s) / t.measured_s for p, t in zip(predict, terms, strict=True)]
    return math.sqrt(sum(e * e for e in errors) / len(errors))


def _predict(terms: Sequence[_Terms], x: Sequence[float], overlap: float) -> list[float]:
    o, a, c = x
    out = []
    for t in terms:
        compute, memory = a * t.flops, t.weights_s + c * t.kv_bytes
        out.append(o + max(compute, memory) + (1 - overlap) * min(compute, memory))
    return out


def _fit_overlap(terms: Sequence[_Terms], overlap: float, start: list[float]) -> list[float]:
    x = start
    split: list[bool] | None = None
    for _ in range(_MAX_SPLIT_ROUNDS):
        compute_max = [x[1] * t.flops > t.weights_s + x[2] * t.kv_bytes for t in terms]
        if compute_max == split:
            break
        split = compute_max
        features, targets = [], []
        for t, is_compute in zip(terms, compute_max, strict=True):
            wc, wm = (1.0, 1 - overlap) if is_compute else (1 - overlap, 1.0)
            features.append([1.0, wc * t.flops, wm * t.kv_bytes])
            targets.append(t.measured_s - wm * t.weights_s)
        weights = [1.0 / t.measured_s for t in terms]
        best: tuple[float, list[float]] | None = None
        for size in (3, 2, 1):
            for free in itertools.combinations(range(3), size):
                cand = _weighted_lstsq(features, targets, weights, free)
                if cand is None or min(cand) < 0:
                    continue
                error = _relative_rms(terms, _predict(terms, cand, overlap))
                if best is None or error < best[0]:
                    best = (error, cand)
        if best is None:
            break
        x = best[1]
    return x


def fit_rates(shape: ModelShape, rows: Sequence[FitRow], base: HardwareRates) -> FitResult:
    """Rates fitted to ``rows``; ``base`` supplies the weight-streaming rate ``bytes_per_s``,
    the starting point (its C and KV rate) and the ``source`` text."""
    if len(rows) < 3:
        raise ValueError("fitting three parameters needs at least three rows")
    unit = HardwareRates(1.0, base.bytes_per_s, "unit", kv_bytes_per_s=1.0)
    terms = []
    for row in rows:
        est = row_estimate(shape, unit, row)
        terms.append(_Terms(est.compute_s, est.weights_s, est.kv_s, row.measured_s))
    # Several starting splits: the alternating fit finds the nearest consistent split, and a
    # start far from the truth (microbenchmark rates are optimistic) can settle elsewhere.
    starts = [
        [0.0, scale_c / base.flops_per_s, scale_kv / base.effective_kv_bytes_per_s]
        for scale_c in _START_SCALES
        for scale_kv in _START_SCALES
    ]
    best: tuple[float, float, list[float]] | None = None
    for overlap in OVERLAP_GRID:
        for start in starts:
            x = _fit_overlap(terms, overlap, start)
            error = _relative_rms(terms, _predict(terms, x, overlap))
            # NOTE: near-ties go to the larger overlap (the grid ascends): the seed's roofline.
            if best is None or error <= best[0] * (1 + 1e-9):
                best = (error, overlap, x)
    assert best is not None
    error, overlap, (o, a, c) = best
    rates = _rates(base, o, a, c, overlap)
    estimates = tuple(row_estimate(shape, rates, row).step_s for row in rows)
    return FitResult(rates=rates, relative_rms=error, estimates_s=estimates)
