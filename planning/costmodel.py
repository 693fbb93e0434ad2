"""The seed's step-time estimate: a roofline of compute against memory, extended.

A decode step for ``B`` sequences does ``2·P`` flops per token (a multiply and an add per
parameter) and reads every weight once plus each sequence's KV cache::

    t ≈ max(2·P·B / C, (W + B·K) / BW)

``P`` parameters, ``C`` effective arithmetic throughput (flop/s), ``W`` weight bytes, ``K`` cache
bytes read per sequence (``kv_bytes_per_token × context_tokens``), ``BW`` effective bandwidth
(bytes/s). Weights are read once per step and shared by the batch, which is why batching
raises throughput until compute catches up with memory (``crossover_batch_size``).
Aggregate tokens/s ≈ ``B / t``; one sequence's tokens/s = ``1 / t``.

Extensions, each off by default so that the seed's formula is what a bare shape gets:

- a fixed per-step cost ``HardwareRates.step_overhead_s`` (scheduling, sampling, launches),
  added to every step; calibration (``mixgate plan calibrate``) fits it;
- ``HardwareRates.compute_memory_overlap``: 1 (default) is the seed's perfect overlap,
  ``max(compute, memory)``; 0 is none, ``compute + memory``; in between,
  ``max + (1 − overlap) · min``. Calibration fits it, since a CPU overlaps poorly;
- ``HardwareRates.kv_bytes_per_s``: the KV cache's own effective rate (default ``BW``);
- attention arithmetic (``ModelShape.attention_flops_per_query_key``): per decode, one query
  against its cached keys; per prefill chunk, the chunk's tokens against the prefix already
  cached and against each other (the quadratic term: ``n·prefix + n(n+1)/2`` pairs);
- MoE: compute follows the active parameters, weight traffic the union of the experts the
  step's tokens picked (``planning.costmodel_routing``), so ``W`` grows with ``B``.

The limiting resource is ``"compute"`` when arithmetic takes longer than memory traffic, else
whichever part of the traffic is larger: ``"weights"`` or ``"kv"`` (the cache).

Still optimistic: it omits kernel-shape effects, imperfect overlap (unless fitted), sampling,
and everything outside one step. Measure, and let measured rates replace these where they exist.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from planning.costmodel_routing import expected_experts_touched
from planning.costmodel_shape import ModelShape
from policies.validation import require_positive_finite

__all__ = [
    "HardwareRates",
    "LimitedBy",
    "ModelShape",
    "MoeComparison",
    "StepEstimate",
    "crossover_batch_size",
    "decode_step_estimate_s",
    "expected_experts_touched",
    "mixed_step_estimate_s",
    "moe_decode_comparison",
]

LimitedBy = Literal["compute", "weights", "kv"]


@dataclass(frozen=True, slots=True)
class HardwareRates:
    flops_per_s: float  # C: effective arithmetic throughput (not the datasheet peak)
    bytes_per_s: float  # BW: effective memory bandwidth
    source: str  # where the numbers came from: "datasheet x0.7", "measured 2024-05-01", ...
    step_overhead_s: float = 0.0  # fixed cost of every step, whatever it carries
    # 1: compute and memory traffic overlap perfectly (the seed's max); 0: they add up.
    compute_memory_overlap: float = 1.0
    # Rate at which attention reads and writes the KV cache; None: bytes_per_s. NOTE: a paged
    # cache attended without a fused kernel moves each byte several times (gather into a
    # buffer, then the attention kernel reads it): calibration fits this rate separately.
    kv_bytes_per_s: float | None = None

    def __post_init__(self) -> None:
        require_positive_finite("flops_per_s", self.flops_per_s)
        require_positive_finite("bytes_per_s", self.bytes_per_s)
        if not self.source:
            raise ValueError("source must be non-empty: say where the rates came from")
        if not (math.isfinite(self.step_overhead_s) and self.step_overhead_s >= 0):
            raise ValueError("step_overhead_s must be finite and non-negative")
        if not 0.0 <= self.compute_memory_overlap <= 1.0:
            raise ValueError("compute_memory_overlap must be in [0, 1]")
        if self.kv_bytes_per_s is not None:
            require_positive_finite("kv_bytes_per_s", self.kv_bytes_per_s)

    @property
    def effective_kv_bytes_per_s(self) -> float:
        return self.bytes_per_s if self.kv_bytes_per_s is None else self.kv_bytes_per_s

    @classmethod
    def from_mapping(cls, data: Mapping[str, object]) -> HardwareRates:
        """From a plain mapping (a calibration file's table): the field names as keys;
        ``source`` defaults to "mapping"; unknown keys are ignored (files carry more)."""

        def number(key: str, default: float | None = None) -> float:
            value = data.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{key} must be a number, got {value!r}")
            return float(value)

        source = data.get("source", "mapping")
        bytes_per_s = number("bytes_per_s")
        return cls(
            flops_per_s=number("flops_per_s"),
            bytes_per_s=bytes_per_s,
            source=str(source),
            step_overhead_s=number("step_overhead_s", 0.0),
            compute_memory_overlap=number("compute_memory_overlap", 1.0),
            kv_bytes_per_s=number("kv_bytes_per_s", bytes_per_s),
        )


@dataclass(frozen=True, slots=True)
class StepEstimate:
    compute_s: float  # arithmetic time of the step at C
    memory_s: float  # memory-traffic time of the step at BW: weights_s + kv_s
    step_s: float  # overhead_s + the combination of the two (max, with perfect overlap)
    limited_by: LimitedBy  # the larger term; see _limited_by for ties
    aggregate_tokens_per_s: float  # output tokens per second, all decoding sequences together
    per_sequence_tokens_per_s: float  # one decoding sequence's speed: 1 / step_s
    prefill_tokens_per_s: float  # prompt tokens per second (0 in a decode-only step)
    weights_s: float = 0.0  # the weight-reading part of memory_s
    kv_s: float = 0.0  # the KV-cache part of memory_s (reads of cached K/V, writes of new)
    overhead_s: float = 0.0  # the fixed per-step part of step_s
    weight_bytes_read: float = 0.0  # W of this step (grows with tokens for MoE)


def _limited_by(compute_s: float, weights_s: float, kv_s: float) -> LimitedBy:
    # NOTE: at an exact compute/memory tie "memory" wins: below the crossover a step is
    # memory-bound, so the crossover itself belongs there. Weights win a weights/KV tie.
    if compute_s > weights_s + kv_s:
        return "compute"
    return "weights" if weights_s >= kv_s else "kv"


def _estimate(
    hw: HardwareRates,
    compute_s: float,
    weight_bytes: float,
    kv_bytes: float,
    decode_seqs: int,
    prefill_tokens: int,
) -> StepEstimate:
    weights_s = weight_bytes / hw.bytes_per_s
    kv_s = kv_bytes / hw.effective_kv_bytes_per_s
    memory_s = weights_s + kv_s
    overlapped_s = max(compute_s, memory_s)
    if hw.compute_memory_overlap < 1.0:
        overlapped_s += (1.0 - hw.compute_memory_overlap) * min(compute_s, memory_s)
    step_s = hw.step_overhead_s + overlapped_s
    return StepEstimate(
        compute_s=compute_s,
        memory_s=memory_s,
        step_s=step_s,
        limited_by=_limited_by(compute_s, weights_s, kv_s),
        aggregate_tokens_per_s=decode_seqs / step_s,
        per_sequence_tokens_per_s=1.0 / step_s,
        prefill_tokens_per_s=prefill_tokens / step_s,
        weights_s=weights_s,
        kv_s=kv_s,
        overhead_s=hw.step_overhead_s,
        weight_bytes_read=weight_bytes,
    )


def _check_context(context_tokens: int) -> None:
    if context_tokens < 0:
        raise ValueError("context_tokens must be non-negative")


def decode_step_estimate_s(
    shape: ModelShape, hw: HardwareRates, batch_size: int, context_tokens: int
) -> StepEstimate:
    """One decode step of ``batch_size`` sequences, each with ``context_tokens`` cached.

    ``max(2·P·B / C, (W + B·K) / BW)`` with ``K = kv_bytes_per_token × context_tokens``
    (``P`` active parameters and ``W`` the experts' union for MoE; plus the extensions above).
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    return mixed_step_estimate_s(shape, hw, 0, batch_size, context_tokens)


def _chunk_attention_pairs(chunks: Sequence[tuple[int, int]]) -> int:
    """(query, key) pairs of prefill chunks ``(tokens, prefix_tokens)``: each of a chunk's
    ``n`` tokens sees the cached prefix and the chunk's tokens up to itself."""
    return sum(n * prefix + n * (n + 1) // 2 for n, prefix in chunks)


def mixed_step_estimate_s(
    shape: ModelShape,
    hw: HardwareRates,
    prefill_tokens: int,
    decode_seqs: int,
    context_tokens: int,
    *,
    prefill_context_tokens: int = 0,
    prefill_chunks: Sequence[tuple[int, int]] | None = None,
) -> StepEstimate:
    """A step carrying ``prefill_tokens`` prompt-chunk tokens and ``decode_seqs`` decodes.

    Compute: ``2·P·(prefill_tokens + decode_seqs)``: every token goes through every (active)
    weight; plus attention pairs × ``attention_flops_per_query_key``. Memory: weights once
    (the experts' union for MoE), the decodes' caches read (``context_tokens`` each), the
    chunk's new KV written and its cached prefix read.

    The prefill is one chunk with ``prefill_context_tokens`` of its prompt already cached, or,
    with ``prefill_chunks``, several: ``(tokens, prefix_tokens)`` per sequence, tokens summing
    to ``prefill_tokens`` (the quadratic term is per chunk, so one long chunk costs more than
    the same tokens split over sequences).
    """
    if prefill_tokens < 0 or decode_seqs < 0 or prefill_context_tokens < 0:
        raise ValueError("token counts must be non-negative")
    if prefill_tokens + decode_seqs == 0:
        raise ValueError("a step needs at least one prefill token or one decode")
    _check_context(context_tokens)
    if prefill_chunks is None:
        chunks = [(prefill_tokens, prefill_context_tokens)] if prefill_tokens else []
    else:
        chunks = list(prefill_chunks)
        if any(n < 0 or prefix < 0 for n, prefix in chunks):
            raise ValueError("prefill_chunks must hold non-negative (tokens, prefix) pairs")
        if sum(n for n, _ in chunks) != prefill_tokens:
            raise ValueError("prefill_chunks' tokens must add up to prefill_tokens")
    tokens = prefill_tokens + decode_seqs
    attention_pairs = decode_seqs * context_tokens + _chunk_attention_pairs(chunks)
    compute_flops = (
        2 * shape.active_parameters * tokens + shape.attention_flops_per_query_key * attention_pairs
    )
    prefix_tokens_read = sum(prefix for n, prefix in chunks if n)
    kv_tokens = decode_seqs * context_tokens + prefill_tokens + prefix_tokens_read
    return _estimate(
        hw,
        compute_flops / hw.flops_per_s,
        shape.weight_bytes_read(tokens),
        shape.kv_bytes_per_token * kv_tokens,
        decode_seqs,
        prefill_tokens,
    )


def crossover_batch_size(shape: ModelShape, hw: HardwareRates, context_tokens: int) -> float:
    """The decode batch size ``B`` at which compute time equals memory time.

    ``2·P·B / C = (W + B·K) / BW``  gives  ``B = (W / BW) / (2·P / C - K / BW)``.
    Below it a step is memory-bound (adding sequences is nearly free); above it, compute-bound
    (each sequence adds its full compute time). If one more sequence's cache read costs at
    least its compute (``K / BW >= 2·P / C``, long contexts) memory always dominates and the
    answer is ``math.inf``. Fractional: round as the caller needs. For MoE, ``W`` is taken at
    all experts (the large-batch limit of the union), so the answer is a lower bound.
    """
    _check_context(context_tokens)
    attention_flops = shape.attention_flops_per_query_key * context_tokens
    compute_s_per_seq = (2 * shape.active_parameters + attention_flops) / hw.flops_per_s
    memory_s_per_seq = shape.kv_bytes_per_token * context_tokens / hw.effective_kv_bytes_per_s
    margin_s_per_seq = compute_s_per_seq - memory_s_per_seq
    if margin_s_per_seq <= 0:
        return math.inf
    return (shape.weight_bytes / hw.bytes_per_s) / margin_s_per_seq


@dataclass(frozen=True, slots=True)
class MoeComparison:
    """One MoE decode step two ways: why dense speed-ups do not carry over."""

    batch_size: int
    experts_touched: float  # expected distinct experts per MoE layer at this batch size
    active_dense: StepEstimate  # as a dense model of the active parameters (the naive view)
    expert_union: StepEstimate  # reading the union of the experts the batch picked


def moe_decode_comparison(
    shape: ModelShape, hw: HardwareRates, batch_size: int, context_tokens: int
) -> MoeComparison:
    """The decode step of ``shape`` at ``batch_size`` estimated from the active-parameter count
    (``shape.as_active_dense()``) and from the experts' union. They agree at ``B = 1`` (one
    token reads its ``k`` experts) and part as the batch grows: the union approaches all ``E``
    experts while the active-dense view keeps reading ``k / E`` of them."""
    if not shape.is_moe:
        raise ValueError("moe_decode_comparison needs an MoE shape (num_experts > 0)")
    return MoeComparison(
        batch_size=batch_size,
        experts_touched=shape.experts_touched(batch_size),
        active_dense=decode_step_estimate_s(
            shape.as_active_dense(), hw, batch_size, context_tokens
        ),
        expert_union=decode_step_estimate_s(shape, hw, batch_size, context_tokens),
    )
