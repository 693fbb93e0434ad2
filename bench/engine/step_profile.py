"""`mixgate bench step-profile`: where one pure-decode engine step's time goes.

For each batch size B it prefills B sequences (untimed), then runs `--steps` decode steps under
torch's profiler and reports, per step: the wall time, the time the device spent in kernels
(CUDA) or the forward's operators (CPU), and the top operators by host time and by device
time. On a GPU the gap between the wall time and the kernel time is host overhead (Python,
launches, synchronisation) that the device waits through; it is what CUDA graphs remove.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from torch.profiler import DeviceType, ProfilerActivity, profile

from bench.engine.bench import decode_max_tokens
from bench.engine.config import BenchConfig, blocks, greedy, make_engine, random_prompt
from bench.engine.report import decode_graph_info
from engine.core.llm_engine import LLMEngine
from engine.core.request import GenerationRequest

__all__ = ["profile_decode_steps", "run_step_profile"]

TOP_OPERATORS = 12


def _max_tokens(batch: int, config: BenchConfig) -> int:
    # Prefill, 3 warm steps, then the plain and the profiled steps, with none finishing.
    return decode_max_tokens(batch, config.context_tokens, 2 * config.steps) + 3


def _start_decoding(engine: LLMEngine, batch: int, config: BenchConfig) -> list[str]:
    rng = random.Random(f"profile-{config.seed}-{batch}")
    vocab = engine.model_config.vocab_size
    max_tokens = _max_tokens(batch, config)
    ids = [f"profile-b{batch}-{i}" for i in range(batch)]
    for request_id in ids:
        prompt = random_prompt(rng, config.context_tokens, vocab)
        engine.add_request(GenerationRequest(request_id, prompt, greedy(max_tokens)))
    started: set[str] = set()
    while len(started) < batch:
        started.update(out.request_id for out in engine.step())
    for _ in range(3):  # warm: first decode steps touch fresh memory and lazy init
        engine.step()
    return ids


def _operator_rows(events: list[Any], key: str, steps: int) -> list[dict[str, Any]]:
    rows = sorted(events, key=lambda e: float(getattr(e, key)), reverse=True)[:TOP_OPERATORS]
    return [
        {
            "name": e.key,
            "calls_per_step": e.count / steps,
            "self_host_us_per_step": e.self_cpu_time_total / steps,
            "self_device_us_per_step": e.self_device_time_total / steps,
        }
        for e in rows
    ]


def profile_decode_steps(engine: LLMEngine, batch: int, config: BenchConfig) -> dict[str, Any]:
    """Wall and kernel time of `config.steps` pure-decode steps of `batch` sequences."""
    ids = _start_decoding(engine, batch, config)
    on_cuda = engine.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    # Unprofiled steps first: the profiler's own per-op cost inflates the wall time.
    plain_s = []
    for _ in range(config.steps):
        began_s = time.perf_counter()
        engine.step()
        plain_s.append(time.perf_counter() - began_s)
    with profile(activities=activities) as prof:
        for _ in range(config.steps):
            engine.step()
    for request_id in ids:
        engine.abort_request(request_id)
    events = prof.key_averages()
    # Kernels are events of their own (device_type CUDA); the operators that launched them
    # carry the same time again, so only the kernels are summed.
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    device_us = sum(e.self_device_time_total for e in kernels)
    launches = sum(e.count for e in events if "LaunchKernel" in e.key or "GraphLaunch" in e.key)
    step_ms = statistics.median(plain_s) * 1e3
    kernel_ms = device_us / config.steps / 1e3
    return {
        "batch": batch,
        "step_ms": step_ms,
        "kernel_ms_per_step": kernel_ms if on_cuda else None,
        "device_busy_fraction": kernel_ms / step_ms if on_cuda else None,
        "kernel_launches_per_step": launches / config.steps if on_cuda else None,
        "top_by_host": _operator_rows(events, "self_cpu_time_total", config.steps),
        "top_by_device": _operator_rows(kernels, "self_device_time_total", config.steps),
    }


def _render(result: dict[str, Any]) -> list[Table]:
    tables = []
    summary = Table(title=f"decode step profile ({result['device']}, {result['dtype']})")
    for column in ("B", "step ms", "kernel ms", "device busy", "launches/step"):
        summary.add_column(column, justify="right")
    for row in result["rows"]:
        busy = row["device_busy_fraction"]
        summary.add_row(
            str(row["batch"]),
            f"{row['step_ms']:.2f}",
            "-" if row["kernel_ms_per_step"] is None else f"{row['kernel_ms_per_step']:.2f}",
            "-" if busy is None else f"{busy:.0%}",
            "-"
            if row["kernel_launches_per_step"] is None
            else f"{row['kernel_launches_per_step']:.0f}",
        )
    tables.append(summary)
    for row in result["rows"]:
        for key, label in (("top_by_host", "host"), ("top_by_device", "device")):
            if not row[key]:
                continue
            table = Table(title=f"B={row['batch']}: top operators by self {label} time")
            for column in ("operator", "calls/step", "host us/step", "device us/step"):
                table.add_column(column, justify="left" if column == "operator" else "right")
            for op in row[key]:
                table.add_row(
                    op["name"][:60],
                    f"{op['calls_per_step']:.0f}",
                    f"{op['self_host_us_per_step']:.0f}",
                    f"{op['self_device_us_per_step']:.0f}",
                )
            tables.append(table)
    return tables


def run_step_profile(args: argparse.Namespace) -> int:
    config = BenchConfig.from_args(args)
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    sizes = config.all_batch_sizes()
    widest = max(sizes)
    # Each batch size's sequences are aborted before the next starts: room for the widest.
    per_seq = blocks(config.context_tokens + _max_tokens(widest, config))
    engine = make_engine(config, widest, widest * per_seq + 1)
    rows = [profile_decode_steps(engine, size, config) for size in sizes]
    result = {
        "device": str(engine.device),
        "device_name": torch.cuda.get_device_name(engine.device)
        if engine.device.type == "cuda"
        else "cpu",
        "dtype": str(engine.dtype).removeprefix("torch."),
        "model_dir": config.model_dir,
        "context_tokens": config.context_tokens,
        "steps": config.steps,
        "torch": torch.__version__,
        "decode_graphs": decode_graph_info(engine),
        "rows": rows,
    }
    console = Console()
    for table in _render(result):
        console.print(table)
    if config.json_path:
        Path(config.json_path).write_text(json.dumps(result, indent=2) + "\n")
    return 0
