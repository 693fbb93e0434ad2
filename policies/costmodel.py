"""The seed's step-time estimate for a dense model: a roofline of compute against memory.

A decode step for ``B`` sequences does ``2·P`` flops per token (a multiply and an add per
parameter) and reads every weight once plus each sequence's KV cache::

    t ≈ max(2·P·B / C, (W + B·K) / BW)

``P`` parameters, ``C`` effective arithmetic throughput (flop/s), ``W`` weight bytes, ``K`` cache
bytes read per sequence (``kv_bytes_per_token × context_tokens``), ``BW`` effective bandwidth
(bytes/s). Weights are read once per step and shared by the batch, which is why batching
raises throughput until compute catches up with memory (``crossover_batch_size``).

This is an optimistic teaching estimate: it omits attention flops, kernel launch and framework
overhead, sampling, imperfect overlap of compute and memory traffic, and (for MoE) the union of
experts a batch touches. Real steps are slower; measure them, and let measured rates replace
these wherever they exist. Admission uses it before any measurement, the planner to size
envelopes, the simulated executor to run the real scheduler in virtual time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "HardwareRates",
    "LimitedBy",
    "ModelShape",
    "StepEstimate",
    "crossover_batch_size",
    "decode_step_estimate_s",
    "mixed_step_estimate_s",
]

LimitedBy = Literal["compute", "memory"]


def _require_positive_finite(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be positive and finite, got {value!r}")


@dataclass(frozen=True, slots=True)
class HardwareRates:
    flops_per_s: float  # C: effective arithmetic throughput (not the datasheet peak)
    bytes_per_s: float  # BW: effective memory bandwidth
    source: str  # where the numbers came from: "datasheet x0.7", "measured 2024-05-01", ...

    def __post_init__(self) -> None:
        _require_positive_finite("flops_per_s", self.flops_per_s)
        _require_positive_finite("bytes_per_s", self.bytes_per_s)
        if not self.source:
            raise ValueError("source must be non-empty: say where the rates came from")


@dataclass(frozen=True, slots=True)
class ModelShape:
    num_parameters: int  # P
    weight_bytes: int  # W: bytes read per step (num_parameters × bytes per parameter)
    kv_bytes_per_token: int  # K and V of one token over all layers

    def __post_init__(self) -> None:
        if self.num_parameters < 1 or self.weight_bytes < 1:
            raise ValueError("num_parameters and weight_bytes must be at least 1")
        if self.kv_bytes_per_token < 0:
            raise ValueError("kv_bytes_per_token must be non-negative")

    @classmethod
    def dense(
        cls,
        num_parameters: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        bytes_per_parameter: int = 2,
        kv_bytes_per_element: int = 2,
    ) -> ModelShape:
        """From architecture numbers: a K and a V vector per layer and KV head per token."""
        dims = (num_layers, num_kv_heads, head_dim, bytes_per_parameter, kv_bytes_per_element)
        if min(dims) < 1:
            raise ValueError("architecture numbers must be at least 1")
        return cls(
            num_parameters=num_parameters,
            weight_bytes=num_parameters * bytes_per_parameter,
            kv_bytes_per_token=2 * num_layers * num_kv_heads * head_dim * kv_bytes_per_element,
        )


@dataclass(frozen=True, slots=True)
class StepEstimate:
    compute_s: float  # arithmetic time of the step at C
    memory_s: float  # memory-traffic time of the step at BW
    step_s: float  # max of the two: compute and memory are assumed to overlap perfectly
    limited_by: LimitedBy  # the larger term; a tie reports "memory" (see _estimate)
    aggregate_tokens_per_s: float  # output tokens per second, all decoding sequences together
    per_sequence_tokens_per_s: float  # one decoding sequence's speed: 1 / step_s
    prefill_tokens_per_s: float  # prompt tokens per second (0 in a decode-only step)


def _estimate(
    compute_s: float, memory_s: float, decode_seqs: int, prefill_tokens: int
) -> StepEstimate:
    step_s = max(compute_s, memory_s)
    return StepEstimate(
        compute_s=compute_s,
        memory_s=memory_s,
        step_s=step_s,
        # NOTE: at an exact tie both resources are saturated; "memory" is reported because
        # below the crossover a step is memory-bound, so the crossover itself belongs there.
        limited_by="compute" if compute_s > memory_s else "memory",
        aggregate_tokens_per_s=decode_seqs / step_s,
        per_sequence_tokens_per_s=1.0 / step_s,
        prefill_tokens_per_s=prefill_tokens / step_s,
    )


def _check_context(context_tokens: int) -> None:
    if context_tokens < 0:
        raise ValueError("context_tokens must be non-negative")


def decode_step_estimate_s(
    shape: ModelShape, hw: HardwareRates, batch_size: int, context_tokens: int
) -> StepEstimate:
    """One decode step of ``batch_size`` sequences, each with ``context_tokens`` cached.

    ``max(2·P·B / C, (W + B·K) / BW)`` with ``K = kv_bytes_per_token × context_tokens``.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    _check_context(context_tokens)
    cache_bytes_per_seq = shape.kv_bytes_per_token * context_tokens
    compute_s = 2 * shape.num_parameters * batch_size / hw.flops_per_s
    memory_s = (shape.weight_bytes + batch_size * cache_bytes_per_seq) / hw.bytes_per_s
    return _estimate(compute_s, memory_s, batch_size, 0)


def mixed_step_estimate_s(
    shape: ModelShape,
    hw: HardwareRates,
    prefill_tokens: int,
    decode_seqs: int,
    context_tokens: int,
) -> StepEstimate:
    """A step carrying ``prefill_tokens`` prompt-chunk tokens and ``decode_seqs`` decodes.

    Compute: ``2·P·(prefill_tokens + decode_seqs) / C``: every token, prompt or output, goes
    through every weight. Memory: ``W + decode_seqs·K + prefill_tokens·kv_bytes_per_token``:
    weights once, the decodes' caches read, the prompt chunk's KV written. ``context_tokens`` is
    the decodes' cached length. The chunk's reads of its own earlier KV are omitted, like
    attention flops; both grow with prompt length, so long prompts are underestimated most.
    """
    if prefill_tokens < 0 or decode_seqs < 0:
        raise ValueError("prefill_tokens and decode_seqs must be non-negative")
    if prefill_tokens + decode_seqs == 0:
        raise ValueError("a step needs at least one prefill token or one decode")
    _check_context(context_tokens)
    tokens = prefill_tokens + decode_seqs
    compute_s = 2 * shape.num_parameters * tokens / hw.flops_per_s
    cache_bytes = (
        decode_seqs * shape.kv_bytes_per_token * context_tokens
        + prefill_tokens * shape.kv_bytes_per_token
    )
    memory_s = (shape.weight_bytes + cache_bytes) / hw.bytes_per_s
    return _estimate(compute_s, memory_s, decode_seqs, prefill_tokens)


def crossover_batch_size(shape: ModelShape, hw: HardwareRates, context_tokens: int) -> float:
    """The decode batch size ``B`` at which compute time equals memory time.

    ``2·P·B / C = (W + B·K) / BW``  gives  ``B = (W / BW) / (2·P / C - K / BW)``.
    Below it a step is memory-bound (adding sequences is nearly free); above it, compute-bound
    (each sequence adds its full compute time). If one more sequence's cache read costs at
    least its compute (``K / BW >= 2·P / C``, long contexts) memory always dominates and the
    answer is ``math.inf``. Fractional: round as the caller needs.
    """
    _check_context(context_tokens)
    compute_s_per_seq = 2 * shape.num_parameters / hw.flops_per_s
    memory_s_per_seq = shape.kv_bytes_per_token * context_tokens / hw.bytes_per_s
    margin_s_per_seq = compute_s_per_seq - memory_s_per_seq
    if margin_s_per_seq <= 0:
        return math.inf
    return (shape.weight_bytes / hw.bytes_per_s) / margin_s_per_seq
