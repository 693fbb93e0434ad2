"""The planner: per batch size, what the cost model predicts, and the largest batch that works.

For a model shape on a device at a given context, each row is one decode step of ``B``
sequences: step time, aggregate and per-sequence tokens/s, memory in use, the limiting resource
(compute, weights, KV), and whether it meets the inter-token-latency target and fits. The best
batch size is the largest ``B`` that does both. A starting envelope follows from it
(``starting_envelope``): sweeps then refine it against the real service.

Every number inherits the cost model's optimism (``planning.costmodel``) and the memory
budget's simplifications (``planning.memory_budget``): a plan is where to start measuring.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from planning.costmodel import (
    LimitedBy,
    ModelShape,
    crossover_batch_size,
    decode_step_estimate_s,
    mixed_step_estimate_s,
)
from planning.device_presets import Device
from planning.memory_budget import DEFAULT_HEADROOM_FRACTION, MemoryBudget
from policies.envelope import Envelope, LengthLimits, Provenance

__all__ = ["Plan", "PlanRow", "default_batch_sizes", "make_plan", "starting_envelope"]

# The largest step token budget the envelope proposes: beyond it a step's activations and
# one prompt chunk's delay to every decode grow without much more prefill throughput.
MAX_STEP_TOKEN_BUDGET = 16_384
# Activations are sized for a step of this many tokens (the envelope's budget is not known
# before the plan; 2048 is vLLM's long-standing default max_num_batched_tokens).
DEFAULT_ACTIVATION_TOKENS = 2048
# The default table stops here however much fits (a small model on a large GPU).
_MAX_DEFAULT_ROWS_BATCH = 4096


@dataclass(frozen=True, slots=True)
class PlanRow:
    batch_size: int
    step_s: float  # predicted decode step time = inter-token latency of every sequence
    aggregate_tokens_per_s: float
    per_sequence_tokens_per_s: float
    memory_used_bytes: int  # weights + activations + KV of B sequences at the context
    limited_by: LimitedBy
    experts_touched: float  # per MoE layer (0 for a dense model)
    # MoE: the step as if the model were dense with its active parameters (the naive view the
    # seed warns against); None for a dense model.
    active_dense_step_s: float | None
    meets_itl: bool
    fits_memory: bool


@dataclass(frozen=True, slots=True)
class Plan:
    device: Device
    context_tokens: int
    itl_slo_s: float
    budget: MemoryBudget
    rows: tuple[PlanRow, ...]
    # Largest B meeting the ITL target and fitting in memory (None: not even B = 1 does).
    best_batch_size: int | None
    max_sequences_in_memory: int
    max_batch_for_itl: int  # ignoring memory (0: not even B = 1 meets the target)
    crossover_batch_size: float  # where decode turns compute-bound (inf: never)


def default_batch_sizes(limit: int = 1024) -> tuple[int, ...]:
    """Powers of two from 1 to ``limit``."""
    return tuple(2**i for i in range(int(math.log2(max(1, limit))) + 1))


def _largest_batch(meets: Callable[[int], bool], upper: int) -> int:
    """Largest ``B`` in [1, upper] for which ``meets(B)`` holds, given that it holds for every
    smaller B once it holds for a larger one (step time grows with B); 0 when B = 1 fails."""
    if upper < 1 or not meets(1):
        return 0
    low, high = 1, upper
    while low < high:
        mid = (low + high + 1) // 2
        if meets(mid):
            low = mid
        else:
            high = mid - 1
    return low


def make_plan(
    shape: ModelShape,
    device: Device,
    context_tokens: int,
    itl_slo_s: float,
    batch_sizes: tuple[int, ...] | None = None,
    *,
    headroom_fraction: float = DEFAULT_HEADROOM_FRACTION,
    activation_tokens: int = DEFAULT_ACTIVATION_TOKENS,
) -> Plan:
    """Rows for ``batch_sizes`` (default: powers of two up to twice what fits) and the best B."""
    if context_tokens < 1:
        raise ValueError("context_tokens must be at least 1")
    if not (math.isfinite(itl_slo_s) and itl_slo_s > 0):
        raise ValueError("itl_slo_s must be positive and finite")
    budget = MemoryBudget.with_headroom_fraction(
        device_memory_bytes=device.memory_bytes,
        weight_bytes=shape.weight_bytes,
        kv_bytes_per_token=max(1, shape.kv_bytes_per_token),
        activation_bytes=shape.activation_bytes_per_token * activation_tokens,
        headroom_fraction=headroom_fraction,
    )
    max_in_memory = budget.max_sequences(context_tokens)

    def meets_itl(batch: int) -> bool:
        return decode_step_estimate_s(shape, device.rates, batch, context_tokens).step_s <= (
            itl_slo_s
        )

    # Search as far as memory allows (and a little beyond, to report the ITL limit alone).
    max_for_itl = _largest_batch(meets_itl, max(2 * max_in_memory, 1024))
    best = min(max_for_itl, max_in_memory)
    # Default rows: up to twice what fits or meets the target, so the table shows both limits.
    row_limit = min(_MAX_DEFAULT_ROWS_BATCH, max(2 * max_in_memory, 2 * max_for_itl, 8))
    sizes = batch_sizes or default_batch_sizes(row_limit)
    naive = shape.as_active_dense() if shape.is_moe else None
    rows = []
    for batch in sizes:
        est = decode_step_estimate_s(shape, device.rates, batch, context_tokens)
        naive_est = naive and decode_step_estimate_s(naive, device.rates, batch, context_tokens)
        rows.append(
            PlanRow(
                batch_size=batch,
                step_s=est.step_s,
                aggregate_tokens_per_s=est.aggregate_tokens_per_s,
                per_sequence_tokens_per_s=est.per_sequence_tokens_per_s,
                memory_used_bytes=budget.used_bytes(batch, context_tokens),
                limited_by=est.limited_by,
                experts_touched=shape.experts_touched(batch),
                active_dense_step_s=naive_est.step_s if naive_est else None,
                meets_itl=est.step_s <= itl_slo_s,
                fits_memory=budget.fits(batch, context_tokens),
            )
        )
    return Plan(
        device=device,
        context_tokens=context_tokens,
        itl_slo_s=itl_slo_s,
        budget=budget,
        rows=tuple(rows),
        best_batch_size=best or None,
        max_sequences_in_memory=max_in_memory,
        max_batch_for_itl=max_for_itl,
        crossover_batch_size=crossover_batch_size(shape, device.rates, context_tokens),
    )


def step_token_budget_for_itl(
    shape: ModelShape, plan: Plan, decode_seqs: int, limit: int = MAX_STEP_TOKEN_BUDGET
) -> int:
    """Largest step token budget (decodes + one prefill chunk) whose step meets the ITL
    target while ``decode_seqs`` sequences decode: a longer chunk would stall them."""
    rates, context = plan.device.rates, plan.context_tokens

    def meets(tokens: int) -> bool:
        prefill = max(0, tokens - decode_seqs)
        step = mixed_step_estimate_s(shape, rates, prefill, decode_seqs, context)
        return step.step_s <= plan.itl_slo_s

    return max(decode_seqs, _largest_batch(meets, limit))


def starting_envelope(
    shape: ModelShape, plan: Plan, *, created_at: str = "", notes: str = ""
) -> Envelope:
    """An envelope to start the sweeps from: the plan's best B running at most (bulk's
    ``max_active_seqs`` and the interactive slots on top of it), the largest step budget that
    keeps ITL with B decoding, lengths up to the planned context."""
    if plan.best_batch_size is None:
        raise ValueError("no batch size meets the ITL target and fits: nothing to start from")
    batch = plan.best_batch_size
    budget_tokens = step_token_budget_for_itl(shape, plan, batch)
    context = plan.context_tokens
    default = Envelope.default()

    def limits(base: LengthLimits) -> LengthLimits:
        return LengthLimits(
            max_prompt_tokens=min(base.max_prompt_tokens, max(1, context - 1)),
            max_output_tokens=min(base.max_output_tokens, context),
            max_context_tokens=context,
        )

    reserved = min(default.interactive_reserved_seqs, batch // 8)
    return replace(
        default,
        max_active_seqs=batch - reserved,
        step_token_budget=budget_tokens,
        bulk_prefill_chunk_tokens=max(1, budget_tokens // 4),
        interactive_reserved_seqs=reserved,
        interactive_limits=limits(default.interactive_limits),
        bulk_limits=limits(default.bulk_limits),
        provenance=Provenance(
            source="planner",
            created_at=created_at,
            notes=notes or f"cost model on {plan.device.name}, context {context}: a start only",
            slo={"itl_s": plan.itl_slo_s},
        ),
    )
