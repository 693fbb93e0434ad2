"""`python -m bench.engine.step_bound`: the floor under an fp32 CPU decode step on this machine,
from its two big parts measured alone, beside the seed's estimate.

Why: issue 14 asks for a decode step within 1.5x of `max(2·P·B/C, (W + B·K)/BW)`. The max()
assumes that the linears' arithmetic and the attention's K/V stream overlap completely. On a
machine whose threads are its cores (no SMT) they overlap only where a layer's work is split
across the cores, one streaming K/V while the other multiplies, and then a core streams K/V at
the rate one core reaches, not the machine's. This bench measures the two parts on the model's
shapes, through the engine's own kernels, with random weights and cache (every layer its own,
in huge pages, so both come from memory as in a step):

- the linears of every layer (qkv, o, gate/up, down: `engine.model.kernels.skinny`), on all
  threads and on one;
- the paged decode attention of every layer over `--context` keys
  (`engine.model.kernels.paged_decode`), on all threads and on one;
- both at once, one thread each (what two cores running the two side by side get).

Per batch size it prints:
- serial: linears + attention on all threads, what a step that runs them one after the other
  pays before its norms, rotary, K/V writes, logits, sampling and scheduling;
- overlap floor: (linears on one thread + attention on one thread) / threads, a perfect split of
  the two over the cores with no interference and nothing else in the step;
- each ÷ the estimate (C and BW measured here, as `mixgate bench engine` measures them: the
  median of `--rate-rounds` rounds).

Both parts run dense Llama-layout layers in fp32 on CPU, where the engine's C kernels run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from bench.engine.hardware_rates import (
    MeasuredRates,
    RatesProbe,
    measure_hardware_rates,
    median_rates,
    median_time_s,
)
from engine.model.config import ModelConfig
from engine.model.huge_pages import copy_into_huge_pages
from engine.model.kernels.paged_decode import PagedDecodeKernel, paged_decode_kernel
from engine.model.kernels.skinny import SkinnyLinear, skinny_linear_kernel
from planning.costmodel import decode_step_estimate_s
from planning.model_shape_from_config import shape_from_hf_config

__all__ = ["bound_row", "build_parser", "kv_bytes", "linear_shapes", "run_step_bound"]

_FP32_BYTES = 4


def linear_shapes(config: ModelConfig) -> list[tuple[int, int]]:
    """(out, in) of one layer's linears as the engine runs them: qkv and gate/up fused."""
    q_out = config.num_attention_heads * config.head_dim
    kv_out = config.num_key_value_heads * config.head_dim
    hidden, intermediate = config.hidden_size, config.intermediate_size
    return [
        (q_out + 2 * kv_out, hidden),
        (hidden, q_out),
        (2 * intermediate, hidden),
        (hidden, intermediate),
    ]


def kv_bytes(config: ModelConfig, batch: int, context: int) -> int:
    """K and V bytes every layer's attention reads for `batch` rows of `context` keys (fp32)."""
    per_token = 2 * config.num_key_value_heads * config.head_dim * _FP32_BYTES
    return config.num_hidden_layers * batch * context * per_token


class _Parts:
    """One batch size's weights, cache and inputs, and the two parts as callables."""

    def __init__(
        self,
        config: ModelConfig,
        batch: int,
        context: int,
        block_size: int,
        skinny: SkinnyLinear,
        attention: PagedDecodeKernel,
        generator: torch.Generator,
    ) -> None:
        self.skinny, self.attention = skinny, attention
        self.linear_shapes = linear_shapes(config)
        packed = [
            skinny.pack(torch.randn(out, inp, generator=generator) * 0.02)
            for _ in range(config.num_hidden_layers)
            for out, inp in self.linear_shapes
        ]
        per_layer = len(self.linear_shapes)
        # One huge-page arena each for the weights and the cache, as the engine keeps them.
        arena = copy_into_huge_pages(packed)
        self.weights = [arena[i : i + per_layer] for i in range(0, len(arena), per_layer)]
        self.inputs = {
            inp: torch.randn(batch, inp, generator=generator) for _, inp in self.linear_shapes
        }
        blocks_per_row = -(-context // block_size)
        num_blocks = batch * blocks_per_row
        cache_shape = (num_blocks, block_size, config.num_key_value_heads, config.head_dim)
        cache = copy_into_huge_pages(
            [
                torch.randn(cache_shape, generator=generator)
                for _ in range(2 * config.num_hidden_layers)
            ]
        )
        self.caches = [(cache[2 * i], cache[2 * i + 1]) for i in range(config.num_hidden_layers)]
        # The rows' blocks lie anywhere in the cache, as a block manager hands them out.
        order = torch.randperm(num_blocks, generator=generator)
        self.block_tables = order.view(batch, blocks_per_row).long().contiguous()
        self.context_lens = torch.full((batch,), context, dtype=torch.long)
        self.query = torch.randn(
            batch, config.num_attention_heads, config.head_dim, generator=generator
        )

    def run_linears(self) -> None:
        for layer in self.weights:
            for (out, inp), panels in zip(self.linear_shapes, layer, strict=True):
                self.skinny.matmul(self.inputs[inp], panels, out, None)

    def run_attention(self) -> None:
        for k_cache, v_cache in self.caches:
            self.attention.attend(
                self.query, k_cache, v_cache, self.block_tables, self.context_lens
            )


def _median_cpu_s(fn: Callable[[], None], repeats: int) -> float:
    # One warm call: first touch, the kernels' libraries, the thread team.
    return median_time_s(fn, repeats, torch.device("cpu"), warmup=1)


def _on_threads(threads: int, fn: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        torch.set_num_threads(threads)
        fn()

    return run


def _side_by_side_s(parts: _Parts, repeats: int) -> dict[str, float]:
    """Linears and attention at once, one thread each (the kernels release the GIL): the median
    of each part's own time and of the pair's wall time."""
    torch.set_num_threads(1)  # the kernels read it per call; both run single-threaded
    runs: list[dict[str, float]] = []
    for attempt in range(repeats + 1):
        times: dict[str, float] = {}

        def timed(name: str, fn: Callable[[], None], into: dict[str, float] = times) -> None:
            start = time.perf_counter()
            fn()
            into[name] = time.perf_counter() - start

        start = time.perf_counter()
        pair = [
            threading.Thread(target=timed, args=("linears", parts.run_linears)),
            threading.Thread(target=timed, args=("attention", parts.run_attention)),
        ]
        for thread in pair:
            thread.start()
        for thread in pair:
            thread.join()
        times["wall"] = time.perf_counter() - start
        if attempt > 0:  # the first pair warms
            runs.append(times)
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def bound_row(
    batch: int,
    linears_s: dict[str, float],
    attention_s: dict[str, float],
    side_by_side_s: dict[str, float],
    estimate_s: float,
    threads: int,
    kv_bytes: int,
) -> dict[str, Any]:
    """One batch size's parts, the two floors built from them, and each ÷ the estimate."""
    serial_s = linears_s["all_threads"] + attention_s["all_threads"]
    overlap_floor_s = (linears_s["one_thread"] + attention_s["one_thread"]) / threads
    return {
        "batch": batch,
        "linears_ms": {k: v * 1e3 for k, v in linears_s.items()},
        "attention_ms": {k: v * 1e3 for k, v in attention_s.items()},
        "attention_gb_per_s": {k: kv_bytes / v / 1e9 for k, v in attention_s.items()},
        "side_by_side_ms": {k: v * 1e3 for k, v in side_by_side_s.items()},
        "serial_ms": serial_s * 1e3,
        "overlap_floor_ms": overlap_floor_s * 1e3,
        "estimate_ms": estimate_s * 1e3,
        "serial_ratio": serial_s / estimate_s,
        "overlap_floor_ratio": overlap_floor_s / estimate_s,
    }


def _rates_here(
    dtype: torch.dtype, device: torch.device, matrix_bytes: int | None
) -> MeasuredRates:
    return measure_hardware_rates(dtype, device, matrix_bytes=matrix_bytes, repeats=5)


def _table(rows: list[dict[str, Any]], threads: int) -> Table:
    table = Table(title=f"decode step floor from its parts ({threads} threads; ms)")
    for column in (
        "B", "linears all / 1", "attention all / 1 (GB/s)", "side by side (lin / attn / wall)",
        "serial", "overlap floor", "estimate", "serial ÷ est", "floor ÷ est",
    ):  # fmt: skip
        table.add_column(column, justify="right")
    for row in rows:
        lin, attn = row["linears_ms"], row["attention_ms"]
        gbs, side = row["attention_gb_per_s"], row["side_by_side_ms"]
        table.add_row(
            str(row["batch"]),
            f"{lin['all_threads']:.2f} / {lin['one_thread']:.2f}",
            f"{attn['all_threads']:.2f} ({gbs['all_threads']:.1f}) / "
            f"{attn['one_thread']:.2f} ({gbs['one_thread']:.1f})",
            f"{side['linears']:.2f} / {side['attention']:.2f} / {side['wall']:.2f}",
            f"{row['serial_ms']:.2f}",
            f"{row['overlap_floor_ms']:.2f}",
            f"{row['estimate_ms']:.2f}",
            f"{row['serial_ratio']:.2f}",
            f"{row['overlap_floor_ratio']:.2f}",
        )
    return table


def run_step_bound(args: argparse.Namespace, measure_rates: RatesProbe = _rates_here) -> int:
    skinny, attention = skinny_linear_kernel(), paged_decode_kernel()
    if skinny is None or attention is None:
        raise SystemExit("the engine's C kernels do not build here (a C compiler is needed)")
    raw = json.loads((Path(args.model) / "config.json").read_text())
    config = ModelConfig.from_dict(raw)
    if config.num_local_experts:
        # Its layers' MLPs are experts, not the one gate/up and down measured here.
        raise SystemExit("step_bound measures dense layers; this model's MLPs are experts")
    if not PagedDecodeKernel.supports(
        config.num_attention_heads, config.num_key_value_heads, config.head_dim
    ):
        raise SystemExit("the paged decode kernel does not take this model's attention shape")
    threads = args.threads or torch.get_num_threads()
    load_at_start = os.getloadavg()[0]
    torch.set_num_threads(threads)
    # The median of rounds, as `mixgate bench engine` takes it: one round's bandwidth on this
    # shared machine was 40 GB/s where three rounds minutes later gave 53.
    rates = median_rates(
        [measure_rates(torch.float32, torch.device("cpu"), None) for _ in range(args.rate_rounds)]
    )
    model_shape = shape_from_hf_config(raw, _FP32_BYTES)
    generator = torch.Generator().manual_seed(args.seed)
    rows = []
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        parts = _Parts(config, batch, args.context, args.block_size, skinny, attention, generator)
        linears_s = {
            "all_threads": _median_cpu_s(_on_threads(threads, parts.run_linears), args.repeats),
            "one_thread": _median_cpu_s(_on_threads(1, parts.run_linears), args.repeats),
        }
        attention_s = {
            "all_threads": _median_cpu_s(_on_threads(threads, parts.run_attention), args.repeats),
            "one_thread": _median_cpu_s(_on_threads(1, parts.run_attention), args.repeats),
        }
        side_by_side_s = _side_by_side_s(parts, args.repeats)
        torch.set_num_threads(threads)
        estimate = decode_step_estimate_s(model_shape, rates.hardware(), batch, args.context)
        read_bytes = kv_bytes(config, batch, args.context)
        rows.append(
            bound_row(
                batch, linears_s, attention_s, side_by_side_s, estimate.step_s, threads, read_bytes
            )
        )
    Console().print(_table(rows, threads))
    result = {
        "model": str(args.model),
        "shapes": {
            "layers": config.num_hidden_layers,
            "hidden": config.hidden_size,
            "intermediate": config.intermediate_size,
            "heads": config.num_attention_heads,
            "kv_heads": config.num_key_value_heads,
            "head_dim": config.head_dim,
        },
        "threads": threads,
        "context": args.context,
        "block_size": args.block_size,
        "repeats": args.repeats,
        "rate_rounds": args.rate_rounds,
        "rates": {"C_flops": rates.flops_per_s, "BW_bytes_s": rates.bytes_per_s},
        "rates_given": rates.given,
        "rows": rows,
        "load_average_1min": {"start": load_at_start, "end": os.getloadavg()[0]},
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="model folder (dense, Llama layout)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--batch-sizes", default="8,32,64")
    parser.add_argument("--context", type=int, default=128, help="keys each row attends over")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per median")
    parser.add_argument("--rate-rounds", type=int, default=3, help="rounds of C and BW")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write results here")
    return parser


def main() -> int:
    return run_step_bound(build_parser().parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
