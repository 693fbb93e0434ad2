"""`mixgate bench engine` on a Mixtral-layout MoE model: the measured decode step per batch
size beside the two estimates the seed contrasts.

- **dense-active**: the model as if it were dense with only its active parameters (each token's
  top-k experts): weights read per step stay at ``k / E`` of the experts whatever ``B`` is.
  This is the extrapolation the seed warns against.
- **expert-union**: compute follows the active parameters, but a step reads every expert that
  at least one of its ``B`` tokens picked: ``E·(1 − (1 − k/E)^B)`` per layer under uniform
  routing (`planning.costmodel_routing`), so weight traffic grows with the batch.

Both come from `planning.costmodel.moe_decode_comparison` with this machine's measured C and
BW. "Position" is where the measured step sits: 0 on the dense-active estimate, 1 on the union
one. A CPU step also pays Python and framework overhead that neither estimate has, so the
absolute position is pushed up; the curve position compares growth instead, each column
divided by its value at the smallest batch size. The experts each MoE layer actually computed
per timed step (counted from the router's choices) stand beside the expected union.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.table import Table

from bench.engine.report import fmt
from engine.core.llm_engine import LLMEngine
from planning.costmodel import HardwareRates, ModelShape, moe_decode_comparison

__all__ = [
    "ExpertUnionLog",
    "moe_model_info",
    "moe_rows",
    "position_between",
    "render_moe_table",
]

# Below this gap (relative to the dense-active estimate) the two estimates coincide (B = 1,
# or both compute-bound) and a position between them would only amplify noise.
MIN_RELATIVE_GAP = 0.05


class ExpertUnionLog:
    """Experts computed per MoE layer per timed step, per batch size (one int per layer-step)."""

    def __init__(self, engine: LLMEngine):
        self._blocks = engine.runner.model.moe_blocks()
        self.counts: dict[int, list[int]] = {}

    @contextmanager
    def recording(self, batch: int) -> Iterator[None]:
        log = self.counts.setdefault(batch, [])
        for block in self._blocks:
            block.touched_log = log
        try:
            yield
        finally:
            for block in self._blocks:
                block.touched_log = None

    def mean_touched(self, batch: int) -> float | None:
        counts = self.counts.get(batch)
        return statistics.fmean(counts) if counts else None


def position_between(measured: float, low: float, high: float) -> float | None:
    """0 at `low` (dense-active), 1 at `high` (expert union); None where the two coincide."""
    if high - low < MIN_RELATIVE_GAP * low:
        return None
    return (measured - low) / (high - low)


def moe_rows(
    shape: ModelShape,
    hw: HardwareRates,
    rows: list[dict[str, Any]],
    union_log: ExpertUnionLog,
    context_tokens: int,
) -> list[dict[str, Any]]:
    """Per batch size: measured step, both estimates, positions, touched experts."""
    out = []
    for row in sorted(rows, key=lambda r: r["batch"]):
        batch = row["batch"]
        comparison = moe_decode_comparison(shape, hw, batch, context_tokens)
        active_s, union_s = comparison.active_dense.step_s, comparison.expert_union.step_s
        out.append(
            {
                "batch": batch,
                "step_s": row["step_s"],
                "active_dense_s": active_s,
                "expert_union_s": union_s,
                "active_dense_limited_by": comparison.active_dense.limited_by,
                "expert_union_limited_by": comparison.expert_union.limited_by,
                "position": position_between(row["step_s"], active_s, union_s),
                "experts_touched_expected": comparison.experts_touched,
                "experts_touched_measured": union_log.mean_touched(batch),
            }
        )
    if out:
        first = out[0]
        for r in out:
            # Growth from the smallest batch: a constant overhead factor cancels out.
            r["curve_position"] = position_between(
                r["step_s"] / first["step_s"],
                r["active_dense_s"] / first["active_dense_s"],
                r["expert_union_s"] / first["expert_union_s"],
            )
    return out


def moe_model_info(shape: ModelShape) -> dict[str, Any]:
    return {
        "num_experts": shape.num_experts,
        "experts_per_token": shape.experts_per_token,
        "active_parameters": round(shape.active_parameters),
        "expert_weight_bytes": shape.expert_weight_bytes,
        "active_weight_bytes": round(shape.active_weight_bytes),
    }


def render_moe_table(result: dict[str, Any]) -> Table:
    model = result["model"]
    table = Table(
        title=f"MoE: {model['num_experts']} experts, top-{model['experts_per_token']}, "
        f"{model['num_parameters'] / 1e6:.1f}M params, "
        f"{model['active_parameters'] / 1e6:.1f}M active per token",
        caption="position: 0 = dense-active estimate, 1 = expert-union estimate; curve: the "
        "same on growth from the smallest B; experts: per layer per step",
    )
    for name in ("B", "step\nms", "active\nest ms", "union\nest ms", "position",
                 "curve\nposition", "experts\nmeasured", "experts\nexpected"):  # fmt: skip
        table.add_column(name, justify="right")
    for row in result["moe"]:
        table.add_row(
            str(row["batch"]),
            fmt(row["step_s"], 1e3),
            fmt(row["active_dense_s"], 1e3),
            fmt(row["expert_union_s"], 1e3),
            fmt(row["position"], digits=2),
            fmt(row["curve_position"], digits=2),
            fmt(row["experts_touched_measured"], digits=2),
            fmt(row["experts_touched_expected"], digits=2),
        )
    return table
