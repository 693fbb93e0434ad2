"""`mixgate plan calibrate`: fit the cost model to this device's engine steps, and say how well.

1. C and BW by microbenchmark (``bench.engine.hardware_rates``): a square matmul and a matrix-vector
   product. These alone predict the engine's steps poorly (see ``planning.costmodel_fit``).
2. The native engine's steps, timed (``bench.engine.calibrate_steps``): pure decode at each B of
   ``--batch-sizes``, and for each of ``--token-budgets`` a step of one fresh prompt chunk
   alone and one beside ``--mixed-decodes`` decodes. In ``--rounds`` rounds; each row's
   number is the median over all rounds' samples (load comes in bursts).
3. A least-squares fit of per-step overhead, compute rate, KV rate and overlap to those rows
   (``planning.costmodel_fit.fit_rates``); printed per row: measured, calibrated estimate,
   their ratio, and the uncalibrated microbenchmark estimate with its ratio.
4. ``--out`` (default ``data/calibration.toml``): the rates, the machine, the rows
   (``planning.calibration_file``), for `mixgate plan --device measured` and the simulator.

NOTE: the ratios printed are in-sample (the rows the fit saw); a second run shows how well the
calibration carries over to another moment on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from bench.engine.calibrate_steps import StepTimer, TimedSteps
from bench.engine.hardware_rates import MeasuredRates, measure_hardware_rates, median_rates
from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.model.presets import preset_configs
from planning.calibration_file import write_calibration
from planning.costmodel import HardwareRates, ModelShape
from planning.costmodel_fit import FitResult, FitRow, fit_rates, row_estimate
from planning.model_shape_from_config import shape_from_hf_config
from planning.plan_command import load_model_config

__all__ = ["run_calibrate"]


def _sizes(text: str) -> list[int]:
    sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"expected positive integers, got {text!r}")
    return sizes


def _model_dir(spec: str, dtype: str) -> Path:
    path = Path(spec)
    if path.is_dir():
        return path
    from engine.model.make_model import make_model

    # A preset is made once per machine under the temp folder (never in the repository).
    out = Path(tempfile.gettempdir()) / "mixgate-models" / f"{spec}-{dtype}"
    if (out / "config.json").is_file():
        return out
    return make_model(out, spec, seed=0, dtype=dtype)


def _engine(args: argparse.Namespace, model_dir: Path, sizes: list[int]) -> LLMEngine:
    budgets = _sizes(args.token_budgets)
    most_decoders = max(*sizes, args.mixed_decodes)
    return LLMEngine(
        model_dir,
        EngineConfig(
            max_active_seqs=most_decoders + 1,
            # One step must hold every decode plus the largest chunk unsplit.
            step_token_budget=most_decoders + max(budgets) + 1,
            bulk_prefill_chunk_tokens=max(budgets),
            dtype=args.dtype,
            device=args.device,
            num_threads=args.threads,
            seed=args.seed,
            enable_prefix_caching=False,
        ),
    )


def _one_round(
    timer: StepTimer, sizes: list[int], budgets: list[int], mixed: int
) -> list[TimedSteps]:
    rows = [timer.time_mixed(tokens) for tokens in budgets]  # a prompt chunk alone
    for size in sorted({*sizes, mixed}):
        timer.grow_decoders(size)
        if size in sizes:
            rows.append(timer.time_decode())
        if size == mixed:
            rows.extend(timer.time_mixed(max(1, tokens - mixed)) for tokens in budgets)
    timer.clear()
    return rows


def _pooled(rounds: list[list[TimedSteps]]) -> list[TimedSteps]:
    """Each row's samples from every round together; the mean of the rounds' contexts."""
    by_key: dict[tuple[int, int], list[TimedSteps]] = {}
    for one_round in rounds:
        for steps in one_round:
            by_key.setdefault(steps.key, []).append(steps)
    return [
        TimedSteps(
            prefill_tokens=key[0],
            decode_seqs=key[1],
            context_tokens=round(statistics.fmean(s.context_tokens for s in group)),
            samples_s=tuple(x for s in group for x in s.samples_s),
        )
        for key, group in by_key.items()
    ]


def _memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:  # platform.processor() is often empty on Linux; cpuinfo names the model
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _row_dicts(
    shape: ModelShape, rows: list[FitRow], fit: FitResult, micro: HardwareRates
) -> list[dict[str, Any]]:
    out = []
    for row, estimate_s in zip(rows, fit.estimates_s, strict=True):
        kind = "decode" if not row.prefill_tokens else "prefill" if not row.decode_seqs else "mixed"
        micro_s = row_estimate(shape, micro, row).step_s
        out.append(
            {
                "kind": kind,
                "decode_seqs": row.decode_seqs,
                "prefill_tokens": row.prefill_tokens,
                "context_tokens": row.context_tokens,
                "measured_s": row.measured_s,
                "estimate_s": estimate_s,
                "ratio": row.measured_s / estimate_s,
                "uncalibrated_s": micro_s,
                "uncalibrated_ratio": row.measured_s / micro_s,
            }
        )
    return out


def render_rows(rows: list[dict[str, Any]], title: str, caption: str) -> Table:
    table = Table(title=title, caption=caption)
    for name in ("kind", "B", "prompt\ntokens", "context", "measured\nms", "calibrated\nms",
                 "measured\n/calib.", "uncalib.\nms", "measured\n/uncalib."):  # fmt: skip
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(
            row["kind"],
            str(row["decode_seqs"]),
            str(row["prefill_tokens"]),
            str(row["context_tokens"]),
            f"{row['measured_s'] * 1e3:.1f}",
            f"{row['estimate_s'] * 1e3:.1f}",
            f"{row['ratio']:.2f}",
            f"{row['uncalibrated_s'] * 1e3:.1f}",
            f"{row['uncalibrated_ratio']:.2f}",
        )
    return table


def _measure(
    args: argparse.Namespace, engine: LLMEngine, progress: Console
) -> tuple[list[TimedSteps], MeasuredRates]:
    sizes, budgets = _sizes(args.batch_sizes), _sizes(args.token_budgets)
    timer = StepTimer(engine, args.seed, args.steps, args.context)
    rounds, rates = [], []
    matrix_bytes = None if args.bandwidth_matrix_mb is None else args.bandwidth_matrix_mb << 20
    for index in range(args.rounds):
        rates.append(
            measure_hardware_rates(
                engine.dtype,
                engine.device,
                matrix_bytes=matrix_bytes,
                matmul_size=args.matmul_size,
                repeats=5,
            )
        )
        rounds.append(_one_round(timer, sizes, budgets, args.mixed_decodes))
        summary = ", ".join(
            f"{'B' if not s.prefill_tokens else f'{s.prefill_tokens}+'}{s.decode_seqs} "
            f"{s.median_s * 1e3:.0f} ms"
            for s in rounds[-1]
        )
        progress.log(f"round {index + 1}/{args.rounds}: {summary}")
    return _pooled(rounds), median_rates(rates)


def run_calibrate(args: argparse.Namespace) -> int:
    # NOTE: at least 100 columns even when piped (rich's default is 80): the table is wide.
    console, progress = Console(width=max(Console().width, 100)), Console(stderr=True)
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    model_dir = _model_dir(args.model, args.dtype)
    engine = _engine(args, model_dir, _sizes(args.batch_sizes))
    element_bytes = torch.empty((), dtype=engine.dtype).element_size()
    shape = shape_from_hf_config(load_model_config(str(model_dir), preset_configs()), element_bytes)
    load_at_start = os.getloadavg()[0]
    timed, measured = _measure(args, engine, progress)
    micro = measured.hardware()
    rows = [FitRow(t.prefill_tokens, t.decode_seqs, t.context_tokens, t.median_s) for t in timed]
    fit = fit_rates(shape, rows, micro)
    created_at = datetime.now(UTC).isoformat(timespec="seconds")
    threads = torch.get_num_threads()
    rates = fit.rates
    source = (
        f"calibrated {created_at} on {_device_name(engine.device)} ({engine.device}, {threads} "
        f"threads, {args.dtype}) from {args.model} engine steps"
    )
    row_dicts = _row_dicts(shape, rows, fit, micro)
    content: dict[str, Any] = {
        "source": source,
        "flops_per_s": rates.flops_per_s,
        "bytes_per_s": rates.bytes_per_s,
        "kv_bytes_per_s": rates.effective_kv_bytes_per_s,
        "step_overhead_s": rates.step_overhead_s,
        "compute_memory_overlap": rates.compute_memory_overlap,
        "relative_rms": fit.relative_rms,
        "memory_bytes": _memory_bytes(engine.device),
        "device": str(engine.device),
        "device_name": _device_name(engine.device),
        "threads": threads,
        "dtype": args.dtype,
        "created_at": created_at,
        "model": args.model,
        "torch": torch.__version__,
        "rounds": args.rounds,
        "steps": args.steps,
        "load_average_1min_start": load_at_start,
        "load_average_1min_end": os.getloadavg()[0],
        "microbenchmark": {"flops_per_s": micro.flops_per_s, "bytes_per_s": micro.bytes_per_s},
        "rows": {f"{i:02d}": row for i, row in enumerate(row_dicts)},
    }
    caption = (
        f"fitted: C {rates.flops_per_s / 1e9:.1f} GFLOP/s, BW {rates.bytes_per_s / 1e9:.1f} GB/s "
        f"(matrix-vector), KV {rates.effective_kv_bytes_per_s / 1e9:.1f} GB/s, overhead "
        f"{rates.step_overhead_s * 1e3:.1f} ms/step, overlap {rates.compute_memory_overlap:g}; "
        f"rms error {fit.relative_rms:.1%}. Uncalibrated: microbenchmark C "
        f"{micro.flops_per_s / 1e9:.1f} GFLOP/s, BW {micro.bytes_per_s / 1e9:.1f} GB/s, no "
        f"overhead"
    )
    title = f"{args.model} {args.dtype} on {engine.device}, {threads} threads: steps vs estimate"
    console.print(render_rows(row_dicts, title, caption))
    path = write_calibration(args.out, content)
    console.print(f"wrote {path}")
    if args.json:
        Path(args.json).write_text(json.dumps(content, indent=2) + "\n")
    return 0
