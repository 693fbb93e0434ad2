"""`mixgate plan --model MODEL --device DEVICE [--dtype bf16] [--context 4096] [--itl-slo-ms 50]`.

Per batch size: the cost model's decode step time, aggregate and per-sequence tokens/s, memory
in use, the limiting resource; then the largest batch that meets the ITL target and fits in
memory, and (``--out``) a starting envelope for the sweeps to refine. MoE configs (Mixtral,
Qwen-MoE) are costed with the experts' union, and the table shows beside it what a dense model
of the active parameters would predict.

MODEL: a model folder, a ``config.json``, a mixgate preset (tiny, small, 100m, ...), or a
shipped architecture config (``bench/configs/NAME.json``: llama-3-8b, llama-3-70b,
mixtral-8x7b). DEVICE: h100, h200, a100-80gb, l4, or measured[:FILE] (``mixgate plan
calibrate``). Exit status: 0, or 1 when nothing meets the target (``--out`` is then not written).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from planning.calibration_file import resolve_device
from planning.costmodel import ModelShape
from planning.model_shape_from_config import shape_from_hf_config
from planning.planner import Plan, make_plan, starting_envelope
from policies.envelope import dump_envelope

__all__ = ["DTYPE_BYTES", "add_plan_arguments", "load_model_config", "run_plan"]

DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2,
               "fp8": 1, "int8": 1}  # fmt: skip
CONFIGS_DIR = Path(__file__).resolve().parents[1] / "bench" / "configs"
_GIB = 1 << 30


# The engine's named presets (`small`, `100m`, ...) as config.json dicts: handed in by the
# caller that may import the engine (the CLI, bench), since planning sits below it.
PresetConfigs = Mapping[str, Callable[[], dict[str, Any]]]


def load_model_config(spec: str, presets: PresetConfigs | None = None) -> dict[str, Any]:
    """The ``config.json`` content a model spec names (folder, file, preset, shipped config)."""
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        loaded: dict[str, Any] = json.loads(path.read_text())
        return loaded
    shipped = CONFIGS_DIR / f"{spec}.json"
    if shipped.is_file():
        shipped_config: dict[str, Any] = json.loads(shipped.read_text())
        return shipped_config
    presets = presets or {}
    if spec in presets:
        return presets[spec]()
    shipped_names = sorted(p.stem for p in CONFIGS_DIR.glob("*.json"))
    raise ValueError(
        f"--model {spec!r} is not a folder, a config.json, a preset ({', '.join(presets)}) "
        f"or a shipped config ({', '.join(shipped_names)})"
    )


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="folder, config.json, preset or config")
    parser.add_argument("--device", default="h100", help="h100|h200|a100-80gb|l4|measured[:F]")
    parser.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="bf16")
    parser.add_argument("--kv-dtype", choices=sorted(DTYPE_BYTES), default=None)
    parser.add_argument("--context", type=int, default=4096, help="tokens each sequence holds")
    parser.add_argument("--itl-slo-ms", type=float, default=50.0, help="inter-token target")
    parser.add_argument("--batch-sizes", default=None, help="comma list (default: powers of 2)")
    parser.add_argument(
        "--effective-fraction", type=float, default=None, help="share of datasheet peaks"
    )
    parser.add_argument("--headroom-fraction", type=float, default=0.1)
    parser.add_argument(
        "--routing-skew", type=float, default=0.0, help="MoE: 0 uniform, s > 0 Zipf-like"
    )
    parser.add_argument("--out", default=None, help="write a starting envelope (TOML) here")
    parser.add_argument("--json", default=None, help="write the plan as JSON here")


def _shape(args: argparse.Namespace, presets: PresetConfigs | None) -> ModelShape:
    raw = load_model_config(args.model, presets)
    kv_bytes = DTYPE_BYTES[args.kv_dtype] if args.kv_dtype else None
    shape = shape_from_hf_config(raw, DTYPE_BYTES[args.dtype], kv_bytes)
    if args.routing_skew and shape.is_moe:
        shape = replace(shape, routing_skew=args.routing_skew)
    return shape


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def render_plan(shape: ModelShape, plan: Plan, title: str) -> Table:
    rates, budget = plan.device.rates, plan.budget
    moe = shape.is_moe
    table = Table(
        title=title,
        caption=f"C {rates.flops_per_s / 1e12:.4g} TFLOP/s, BW {rates.bytes_per_s / 1e9:.4g} "
        f"GB/s, overhead {rates.step_overhead_s * 1e3:.3g} ms/step ({rates.source}); memory "
        f"{plan.device.memory_bytes / _GIB:.1f} GiB, weights {budget.weight_bytes / _GIB:.1f}, "
        f"activations {budget.activation_bytes / _GIB:.1f}, headroom "
        f"{budget.headroom_bytes / _GIB:.1f} GiB",
    )
    # Short headers: rich wraps to 80 columns when piped, and MoE adds two columns.
    headers = ["B", "step\nms", "all\ntok/s", "per seq\ntok/s", "memory\nGiB", "bound\nby"]
    if moe:
        headers += ["experts\nread", "as dense\nms"]
    headers += ["ITL\nok", "fits"]
    for name in headers:
        table.add_column(name, justify="right")
    for row in plan.rows:
        cells = [
            str(row.batch_size),
            _ms(row.step_s),
            f"{row.aggregate_tokens_per_s:,.0f}",
            f"{row.per_sequence_tokens_per_s:.1f}",
            f"{row.memory_used_bytes / _GIB:.1f}",
            row.limited_by,
        ]
        if moe:
            cells += [
                f"{row.experts_touched:.2f}/{shape.num_experts}",
                _ms(row.active_dense_step_s),
            ]
        cells += ["yes" if row.meets_itl else "no", "yes" if row.fits_memory else "no"]
        table.add_row(*cells)
    return table


def _summary_lines(shape: ModelShape, plan: Plan) -> list[str]:
    lines = [
        f"parameters {shape.num_parameters / 1e9:.3g} B"
        + (f" ({shape.active_parameters / 1e9:.3g} B active per token)" if shape.is_moe else "")
        + f", weights {shape.weight_bytes / _GIB:.2f} GiB, KV {shape.kv_bytes_per_token / 1024:.0f}"
        f" KiB/token; KV room {plan.budget.kv_token_capacity():,} tokens = "
        f"{plan.max_sequences_in_memory} sequences of {plan.context_tokens}",
        f"decode turns compute-bound at B ~ {plan.crossover_batch_size:.0f}"
        if plan.crossover_batch_size != float("inf")
        else "decode never turns compute-bound at this context (KV reads outgrow compute)",
        f"largest B within ITL {plan.itl_slo_s * 1e3:g} ms: {plan.max_batch_for_itl}; "
        f"in memory: {plan.max_sequences_in_memory}; best: {plan.best_batch_size or 'none'}",
        "memory: weights + KV + activations + headroom; not a complete admission policy "
        "(fragmentation, prefix sharing, sequences' growth).",
    ]
    if shape.is_moe:
        lines.append(
            "MoE: a batch reads the union of the experts its tokens pick (uniform routing"
            + (f", skew {shape.routing_skew:g}" if shape.routing_skew else "")
            + "); 'as dense' is what the active-parameter count alone would predict."
        )
    return lines


def _plan_json(shape: ModelShape, plan: Plan) -> dict[str, Any]:
    return {
        "device": plan.device.name,
        "rates_source": plan.device.rates.source,
        "context_tokens": plan.context_tokens,
        "itl_slo_s": plan.itl_slo_s,
        "num_parameters": shape.num_parameters,
        "active_parameters": shape.active_parameters,
        "best_batch_size": plan.best_batch_size,
        "max_sequences_in_memory": plan.max_sequences_in_memory,
        "max_batch_for_itl": plan.max_batch_for_itl,
        "rows": [asdict(row) for row in plan.rows],
    }


def run_plan(args: argparse.Namespace, presets: PresetConfigs | None = None) -> int:
    # NOTE: at least 100 columns even when piped (rich's default is 80): the table is wide.
    console = Console(width=max(Console().width, 100))
    if not args.model:
        raise SystemExit("mixgate plan: --model is required (or use `mixgate plan calibrate`)")
    shape = _shape(args, presets)
    device = resolve_device(args.device, args.effective_fraction)
    sizes = None
    if args.batch_sizes:
        sizes = tuple(int(part) for part in args.batch_sizes.split(",") if part.strip())
    plan = make_plan(
        shape,
        device,
        args.context,
        args.itl_slo_ms / 1e3,
        sizes,
        headroom_fraction=args.headroom_fraction,
    )
    title = f"{args.model} ({args.dtype}) on {device.name}, context {args.context}, " + (
        f"ITL target {args.itl_slo_ms:g} ms"
    )
    console.print(render_plan(shape, plan, title))
    for line in _summary_lines(shape, plan):
        console.print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(_plan_json(shape, plan), indent=2) + "\n")
    if plan.best_batch_size is None:
        console.print("no batch size meets the ITL target and fits in memory")
        return 1
    if args.out:
        envelope = starting_envelope(
            shape, plan, created_at=datetime.now(UTC).isoformat(timespec="seconds")
        )
        Path(args.out).write_text(dump_envelope(envelope))
        console.print(
            f"wrote {args.out}: max_active_seqs {envelope.max_active_seqs}, "
            f"step_token_budget {envelope.step_token_budget} (a start: sweeps refine it)"
        )
    return 0
