"""`mixgate bench engine`: the engine's decode step against the seed's estimate, and the
engine's throughput against naive static batching, on one model, in one run.

1. C and BW of this machine (`bench.engine.hardware_rates`).
2. For each batch size B: B sequences with `--context`-token prompts are prefilled (untimed),
   then `--steps` pure-decode `engine.step()` calls are timed whole (scheduling, the forward,
   sampling: what serving pays) and their median is set beside
   `max(2·P·B / C, (W + B·K) / BW)` from `planning.costmodel`. For an MoE model (Mixtral
   layout) `bench.engine.moe` adds the dense-active and expert-union estimates and the
   experts each layer actually computed.
3. For each throughput batch size B: 4·B seeded requests of mixed lengths, served by the engine
   (at most B active) and by `bench.engine.naive_baseline` (static batches of B) on the same
   weights; generated tokens per second of each, counting only the tokens each request asked for
   (`bench.engine.throughput`).

NOTE: on a shared machine, load comes in bursts of seconds that slow everything 2-8x. Steps 1
and 2 therefore run in `--rounds` rounds (rates, then every batch size), and each number is the
median over all rounds: a burst spoils part of one round, not every sample of one B.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from bench.engine.config import (
    STEP_TOKEN_BUDGET,
    WARMUP_STEPS,
    BenchConfig,
    blocks,
    greedy,
    make_engine,
    random_prompt,
)
from bench.engine.hardware_rates import (
    MeasuredRates,
    RatesProbe,
    measure_hardware_rates,
    median_rates,
)
from bench.engine.moe import ExpertUnionLog, moe_model_info, moe_rows, render_moe_table
from bench.engine.report import model_info, render_table, run_config
from bench.engine.throughput import (
    add_throughput,
    compare_throughput,
    mixed_workload,
    run_engine_requests,
)
from engine.core.llm_engine import LLMEngine
from engine.core.request import GenerationRequest
from planning.costmodel import ModelShape, decode_step_estimate_s
from planning.model_shape_from_config import shape_from_hf_config

__all__ = [
    "BenchConfig",
    "compare_throughput",
    "decode_max_tokens",
    "mixed_workload",
    "run_engine_bench",
    "run_engine_requests",
]


def model_shape(engine: LLMEngine, model_dir: str) -> ModelShape:
    """The cost model's view of the model, from its config.json in the engine's dtype: for an
    MoE model that includes the experts, so its estimate reads the experts' union."""
    raw = json.loads((Path(model_dir) / "config.json").read_text())
    element_bytes = torch.empty((), dtype=engine.dtype).element_size()
    return shape_from_hf_config(raw, element_bytes)


# ---- (a) decode step vs estimate -----------------------------------------------------------


def decode_max_tokens(batch: int, context_tokens: int, steps: int) -> int:
    """Enough tokens that no sequence finishes before the timed steps end, even one whose
    prefill finished several steps before the others' (it decodes during their prefill)."""
    prefill_steps = -(-batch * context_tokens // max(1, STEP_TOKEN_BUDGET - batch))
    return 1 + prefill_steps + WARMUP_STEPS + steps


def time_decode_steps(
    engine: LLMEngine,
    batch: int,
    config: BenchConfig,
    round_index: int,
    union_log: ExpertUnionLog | None = None,
) -> list[float]:
    """Seconds of each of `config.steps` pure-decode steps of `batch` sequences (and, for an
    MoE model, the experts its timed steps computed, into `union_log`)."""
    vocab = engine.model_config.vocab_size
    max_tokens = decode_max_tokens(batch, config.context_tokens, config.steps)
    # NOTE: the same prompts every round: from the second round on the prefix cache holds
    # them, which makes the untimed prefill cheap; the timed decode steps are unchanged.
    rng = random.Random(f"steps-{config.seed}-{batch}")
    ids = [f"step-r{round_index}-b{batch}-{i}" for i in range(batch)]
    for request_id in ids:
        prompt = random_prompt(rng, config.context_tokens, vocab)
        engine.add_request(GenerationRequest(request_id, prompt, greedy(max_tokens)))
    started: set[str] = set()
    while len(started) < batch:  # untimed: prefill until every sequence has its first token
        started.update(out.request_id for out in engine.step())
    for _ in range(WARMUP_STEPS):
        engine.step()
    samples = []
    recording = union_log.recording(batch) if union_log else contextlib.nullcontext()
    with recording:
        for _ in range(config.steps):
            began_s = time.perf_counter()
            engine.step()
            samples.append(time.perf_counter() - began_s)
            record = engine.history.records[-1]
            if record.tokens_of("prefill") or record.tokens_of("decode") != batch:
                raise RuntimeError(f"a timed step at B={batch} was not a pure decode of B tokens")
    for request_id in ids:
        engine.abort_request(request_id)
    return samples


def _step_engine(config: BenchConfig) -> LLMEngine:
    sizes = config.all_batch_sizes()
    # Blocks for every batch size's sequences at once, so that a round's prompts are still
    # cached when the next round comes back to them.
    context = config.context_tokens
    num_blocks = sum(
        size * blocks(context + decode_max_tokens(size, context, config.steps)) for size in sizes
    )
    return make_engine(config, max(sizes), num_blocks + 1)


def measure_rates_here(
    dtype: torch.dtype, device: torch.device, matrix_bytes: int | None
) -> MeasuredRates:
    """The bench's default `RatesProbe`: C and BW measured on this machine, 5 repeats."""
    return measure_hardware_rates(dtype, device, matrix_bytes=matrix_bytes, repeats=5)


def measure_steps(
    config: BenchConfig,
    engine: LLMEngine,
    progress: Console,
    union_log: ExpertUnionLog | None = None,
    measure_rates: RatesProbe = measure_rates_here,
) -> tuple[dict[int, list[list[float]]], list[MeasuredRates]]:
    """Per batch size, each round's step samples; and each round's hardware rates."""
    sizes = config.all_batch_sizes()
    samples: dict[int, list[list[float]]] = {size: [] for size in sizes}
    rates = []
    for round_index in range(config.rounds):
        rates.append(measure_rates(engine.dtype, engine.device, config.matrix_bytes))
        # Alternate the order so that a slow drift does not always favour the same end.
        for size in sizes if round_index % 2 == 0 else reversed(sizes):
            samples[size].append(time_decode_steps(engine, size, config, round_index, union_log))
        progress.log(f"round {round_index + 1}/{config.rounds}: " + _round_summary(samples))
    return samples, rates


def _round_summary(samples: dict[int, list[list[float]]]) -> str:
    return ", ".join(f"B={b} {statistics.median(s[-1]) * 1e3:.0f} ms" for b, s in samples.items())


def step_rows(
    config: BenchConfig,
    shape: ModelShape,
    rates: MeasuredRates,
    samples: dict[int, list[list[float]]],
) -> list[dict[str, Any]]:
    rows = []
    for batch, rounds in samples.items():
        flat = [s for one_round in rounds for s in one_round]
        estimate = decode_step_estimate_s(shape, rates.hardware(), batch, config.context_tokens)
        step_s = statistics.median(flat)
        rows.append(
            {
                "batch": batch,
                "step_s": step_s,
                "step_s_rounds": [statistics.median(r) for r in rounds],
                "step_s_min": min(flat),
                "estimate_s": estimate.step_s,
                "compute_s": estimate.compute_s,
                "memory_s": estimate.memory_s,
                "ratio": step_s / estimate.step_s,
                "limiting": estimate.limited_by,
                "tokens_s": None,
                "baseline_tokens_s": None,
            }
        )
    return rows


def run_engine_bench(
    args: argparse.Namespace, *, measure_rates: RatesProbe = measure_rates_here
) -> int:
    """`measure_rates`: where C and BW come from each round (tests pass fixed ones)."""
    config = BenchConfig.from_args(args)
    console, progress = Console(), Console(stderr=True)
    # Other processes' load is the main source of noise on a shared machine: record it.
    load_at_start = os.getloadavg()[0]
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    engine = _step_engine(config)
    union_log = ExpertUnionLog(engine) if engine.model_config.is_moe else None
    samples, round_rates = measure_steps(config, engine, progress, union_log, measure_rates)
    rates = median_rates(round_rates)
    shape = model_shape(engine, config.model_dir)
    rows = step_rows(config, shape, rates, samples)
    model = model_info(config, engine, shape)
    moe = None
    if union_log is not None:
        model.update(moe_model_info(shape))
        moe = moe_rows(shape, rates.hardware(), rows, union_log, config.context_tokens)
    del engine  # its KV cache is the largest allocation; the next engines need the room
    throughput = add_throughput(config, rows, progress)
    result = {
        "C_flops": rates.flops_per_s,
        "BW_bytes_s": rates.bytes_per_s,
        "C_flops_rounds": [r.flops_per_s for r in round_rates],
        "BW_bytes_s_rounds": [r.bytes_per_s for r in round_rates],
        "rates_source": rates.hardware().source,
        "model": model,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "load_average_1min": {"start": load_at_start, "end": os.getloadavg()[0]},
        "config": run_config(config),
        "rows": rows,
        "throughput": throughput,
    }
    console.print(render_table(result))
    if moe is not None:
        result["moe"] = moe
        console.print(render_moe_table(result))
    if config.json_path:
        Path(config.json_path).write_text(json.dumps(result, indent=2) + "\n")
    return 0
