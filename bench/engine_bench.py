"""`mixgate bench engine`: the engine's decode step against the seed's estimate, and the
engine's throughput against naive static batching, on one model, in one run.

1. C and BW of this machine (`bench.hardware_rates`).
2. For each batch size B: B sequences with `--context`-token prompts are prefilled (untimed),
   then `--steps` pure-decode `engine.step()` calls are timed whole (scheduling, the forward,
   sampling: what serving pays) and their median is set beside
   `max(2·P·B / C, (W + B·K) / BW)` from `policies.costmodel`.
3. For each throughput batch size B: 4·B seeded requests of mixed lengths, served by the engine
   (at most B active) and by `bench.naive_baseline` (static batches of B) on the same weights;
   generated tokens per second of each, counting only the tokens each request asked for.

NOTE: on a shared machine, load comes in bursts of seconds that slow everything 2-8x. Steps 1
and 2 therefore run in `--rounds` rounds (rates, then every batch size), and each number is the
median over all rounds: a burst spoils part of one round, not every sample of one B.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from bench.hardware_rates import MeasuredRates, measure_hardware_rates, median_rates
from bench.naive_baseline import BenchRequest, run_naive
from bench.run_folder import runtime_facts
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.request import GenerationRequest
from engine.sampling_params import SamplingParams
from policies.costmodel import ModelShape, decode_step_estimate_s

__all__ = [
    "BenchConfig",
    "compare_throughput",
    "mixed_workload",
    "run_engine_bench",
    "run_engine_requests",
]

# Mixed workload of the throughput comparison (uniform, inclusive), from the issue.
PROMPT_TOKENS_RANGE = (16, 256)
OUTPUT_TOKENS_RANGE = (8, 128)
REQUESTS_PER_BATCH_SLOT = 4
# Generous, so that prefill chunking is not what limits the engine.
STEP_TOKEN_BUDGET = 2048
BLOCK_SIZE_TOKENS = 16
# Decode steps run before timing: the first steps after a prefill touch fresh memory.
WARMUP_STEPS = 2


@dataclass(frozen=True, slots=True)
class BenchConfig:
    model_dir: str
    batch_sizes: tuple[int, ...]
    throughput_batches: tuple[int, ...]
    context_tokens: int
    steps: int  # timed decode steps per batch size and round
    rounds: int
    dtype: str
    device: str
    threads: int | None
    seed: int
    json_path: str | None
    matrix_bytes: int | None  # None: sized from the last-level cache

    def __post_init__(self) -> None:
        if min(self.context_tokens, self.steps, self.rounds) < 1:
            raise ValueError("--context, --steps and --rounds must be at least 1")
        if not self.batch_sizes:
            raise ValueError("--batch-sizes must name at least one batch size")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> BenchConfig:
        matrix_mb = getattr(args, "bandwidth_matrix_mb", None)
        return cls(
            model_dir=str(args.model),
            batch_sizes=_parse_sizes(args.batch_sizes),
            throughput_batches=_parse_sizes(args.throughput_batches),
            context_tokens=args.context,
            steps=args.steps,
            rounds=getattr(args, "rounds", 1),
            dtype=args.dtype,
            device=args.device,
            threads=args.threads,
            seed=args.seed,
            json_path=args.json,
            matrix_bytes=None if matrix_mb is None else matrix_mb << 20,
        )

    def all_batch_sizes(self) -> list[int]:
        """Every throughput batch also gets a step timing, so each row has both numbers."""
        return sorted(set(self.batch_sizes) | set(self.throughput_batches))


def _parse_sizes(text: str) -> tuple[int, ...]:
    sizes = tuple(int(part) for part in text.split(",") if part.strip())
    if any(size < 1 for size in sizes):
        raise ValueError(f"batch sizes must be positive integers, got {text!r}")
    return sizes


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)


def _blocks(tokens: int) -> int:
    return -(-tokens // BLOCK_SIZE_TOKENS)


def _make_engine(config: BenchConfig, max_active_seqs: int, num_kv_blocks: int) -> LLMEngine:
    return LLMEngine(
        config.model_dir,
        EngineConfig(
            max_active_seqs=max_active_seqs,
            step_token_budget=max(STEP_TOKEN_BUDGET, max_active_seqs),
            block_size_tokens=BLOCK_SIZE_TOKENS,
            num_kv_blocks=num_kv_blocks,
            dtype=config.dtype,
            device=config.device,
            num_threads=config.threads,
            seed=config.seed,
        ),
    )


def model_shape(engine: LLMEngine) -> ModelShape:
    mc = engine.model_config
    element_bytes = torch.empty((), dtype=engine.dtype).element_size()
    return ModelShape.dense(
        num_parameters=mc.num_parameters(),
        num_layers=mc.num_hidden_layers,
        num_kv_heads=mc.num_key_value_heads,
        head_dim=mc.head_dim,
        bytes_per_parameter=element_bytes,
        kv_bytes_per_element=element_bytes,
    )


def _random_prompt(rng: random.Random, length: int, vocab: int) -> tuple[int, ...]:
    return tuple(rng.randrange(vocab) for _ in range(length))


# ---- (a) decode step vs estimate -----------------------------------------------------------


def _decode_max_tokens(batch: int, context_tokens: int, steps: int) -> int:
    """Enough tokens that no sequence finishes before the timed steps end, even one whose
    prefill finished several steps before the others' (it decodes during their prefill)."""
    prefill_steps = -(-batch * context_tokens // max(1, STEP_TOKEN_BUDGET - batch))
    return 1 + prefill_steps + WARMUP_STEPS + steps


def time_decode_steps(
    engine: LLMEngine, batch: int, config: BenchConfig, round_index: int
) -> list[float]:
    """Seconds of each of `config.steps` pure-decode steps of `batch` sequences."""
    vocab = engine.model_config.vocab_size
    max_tokens = _decode_max_tokens(batch, config.context_tokens, config.steps)
    # NOTE: the same prompts every round: from the second round on the prefix cache holds
    # them, which makes the untimed prefill cheap; the timed decode steps are unchanged.
    rng = random.Random(f"steps-{config.seed}-{batch}")
    ids = [f"step-r{round_index}-b{batch}-{i}" for i in range(batch)]
    for request_id in ids:
        prompt = _random_prompt(rng, config.context_tokens, vocab)
        engine.add_request(GenerationRequest(request_id, prompt, _greedy(max_tokens)))
    started: set[str] = set()
    while len(started) < batch:  # untimed: prefill until every sequence has its first token
        started.update(out.request_id for out in engine.step())
    for _ in range(WARMUP_STEPS):
        engine.step()
    samples = []
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
        size * _blocks(context + _decode_max_tokens(size, context, config.steps)) for size in sizes
    )
    return _make_engine(config, max(sizes), num_blocks + 1)


def measure_steps(
    config: BenchConfig, engine: LLMEngine, progress: Console
) -> tuple[dict[int, list[list[float]]], list[MeasuredRates]]:
    """Per batch size, each round's step samples; and each round's hardware rates."""
    sizes = config.all_batch_sizes()
    samples: dict[int, list[list[float]]] = {size: [] for size in sizes}
    rates = []
    for round_index in range(config.rounds):
        rates.append(
            measure_hardware_rates(
                engine.dtype, engine.device, matrix_bytes=config.matrix_bytes, repeats=5
            )
        )
        # Alternate the order so that a slow drift does not always favour the same end.
        for size in sizes if round_index % 2 == 0 else reversed(sizes):
            samples[size].append(time_decode_steps(engine, size, config, round_index))
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


# ---- (b) throughput on mixed lengths -------------------------------------------------------


def mixed_workload(num_requests: int, vocab: int, rng: random.Random) -> list[BenchRequest]:
    return [
        BenchRequest(
            request_id=f"mixed-{i}",
            prompt_token_ids=_random_prompt(rng, rng.randint(*PROMPT_TOKENS_RANGE), vocab),
            max_tokens=rng.randint(*OUTPUT_TOKENS_RANGE),
        )
        for i in range(num_requests)
    ]


def run_engine_requests(
    engine: LLMEngine, requests: list[BenchRequest]
) -> tuple[dict[str, list[int]], float]:
    """Serve all requests at once (they arrive together); their tokens and the wall time."""
    tokens: dict[str, list[int]] = {r.request_id: [] for r in requests}
    started_s = time.perf_counter()
    for r in requests:
        engine.add_request(
            GenerationRequest(r.request_id, r.prompt_token_ids, _greedy(r.max_tokens))
        )
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
    return tokens, time.perf_counter() - started_s


def _check_lengths(name: str, tokens: dict[str, list[int]], requests: list[BenchRequest]) -> None:
    wrong = [r.request_id for r in requests if len(tokens[r.request_id]) != r.max_tokens]
    if wrong:
        raise RuntimeError(f"{name} did not produce max_tokens for {len(wrong)} requests")


def compare_throughput(config: BenchConfig, batch: int) -> dict[str, Any]:
    """Engine vs naive static batching on the same 4·B requests and the same weights."""
    # Room for every active sequence at its longest: this measures batching, not preemption.
    blocks_per_seq = _blocks(PROMPT_TOKENS_RANGE[1] + OUTPUT_TOKENS_RANGE[1])
    engine = _make_engine(config, batch, batch * blocks_per_seq + 1)
    rng = random.Random(f"mixed-{config.seed}-{batch}")
    requests = mixed_workload(REQUESTS_PER_BATCH_SLOT * batch, engine.model_config.vocab_size, rng)
    engine_tokens, engine_s = run_engine_requests(engine, requests)
    naive = run_naive(engine.runner.model, requests, batch)
    _check_lengths("the engine", engine_tokens, requests)
    _check_lengths("the baseline", naive.tokens, requests)
    output_tokens = sum(r.max_tokens for r in requests)
    same = sum(engine_tokens[r.request_id] == naive.tokens[r.request_id] for r in requests)
    return {
        "batch": batch,
        "requests": len(requests),
        "prompt_tokens": sum(len(r.prompt_token_ids) for r in requests),
        "output_tokens": output_tokens,
        "engine_s": engine_s,
        "engine_steps": engine.history.total_steps,
        "baseline_s": naive.elapsed_s,
        "baseline_padded_prompt_tokens": naive.padded_prompt_tokens,
        "baseline_decode_steps": naive.decode_steps,
        "tokens_s": output_tokens / engine_s,
        "baseline_tokens_s": output_tokens / naive.elapsed_s,
        "speedup": naive.elapsed_s / engine_s,
        # Greedy on identical weights: equal tokens show both served the same computation.
        "same_tokens_fraction": same / len(requests),
    }


# ---- report --------------------------------------------------------------------------------


def _model_info(config: BenchConfig, engine: LLMEngine) -> dict[str, Any]:
    mc, shape = engine.model_config, model_shape(engine)
    return {
        "dir": config.model_dir,
        "architecture": mc.architecture,
        "num_parameters": shape.num_parameters,
        "weight_bytes": shape.weight_bytes,
        "kv_bytes_per_token": shape.kv_bytes_per_token,
        "hidden_size": mc.hidden_size,
        "num_hidden_layers": mc.num_hidden_layers,
        "num_key_value_heads": mc.num_key_value_heads,
        "head_dim": mc.head_dim,
        "vocab_size": mc.vocab_size,
        "dtype": str(engine.dtype).removeprefix("torch."),
    }


def _run_config(config: BenchConfig) -> dict[str, Any]:
    return {
        "model_dir": config.model_dir,
        "dtype": config.dtype,
        "device": config.device,
        "context": config.context_tokens,
        "steps": config.steps,
        "rounds": config.rounds,
        "warmup_steps": WARMUP_STEPS,
        "seed": config.seed,
        "batch_sizes": list(config.batch_sizes),
        "throughput_batches": list(config.throughput_batches),
        "step_token_budget": STEP_TOKEN_BUDGET,
        "git_revision": runtime_facts()["git_revision"],
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _fmt(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def render_table(result: dict[str, Any]) -> Table:
    model, config = result["model"], result["config"]
    table = Table(
        title=f"{model['num_parameters'] / 1e6:.1f}M params {model['dtype']}, "
        f"{result['threads']} threads, context {config['context']}",
        caption=f"C {result['C_flops'] / 1e9:.0f} GFLOP/s, BW {result['BW_bytes_s'] / 1e9:.1f} "
        f"GB/s; step: median of {config['rounds']}x{config['steps']}; tok/s: 4·B requests",
    )
    # Two-line headers keep the table inside 80 columns (rich's width when piped).
    for name in ("B", "step\nms", "estimate\nms", "measured\n/estimate", "limited\nby",
                 "engine\ntok/s", "naive\ntok/s", "engine\n/naive"):  # fmt: skip
        table.add_column(name, justify="right")
    for row in result["rows"]:
        naive = row["baseline_tokens_s"]
        speedup = None if naive is None else row["tokens_s"] / naive
        table.add_row(
            str(row["batch"]),
            _fmt(row["step_s"], 1e3),
            _fmt(row["estimate_s"], 1e3),
            _fmt(row["ratio"], digits=2),
            row["limiting"],
            _fmt(row["tokens_s"]),
            _fmt(naive),
            _fmt(speedup, digits=2),
        )
    return table


def _add_throughput(
    config: BenchConfig, rows: list[dict[str, Any]], progress: Console
) -> list[dict[str, Any]]:
    comparisons = []
    for batch in config.throughput_batches:
        comparison = compare_throughput(config, batch)
        comparisons.append(comparison)
        row = next(r for r in rows if r["batch"] == batch)
        for key in ("tokens_s", "baseline_tokens_s"):
            row[key] = comparison[key]
        progress.log(
            f"B={batch}: engine {row['tokens_s']:.0f} tok/s in {comparison['engine_s']:.0f} s, "
            f"naive {row['baseline_tokens_s']:.0f} tok/s in {comparison['baseline_s']:.0f} s"
        )
    return comparisons


def run_engine_bench(args: argparse.Namespace) -> int:
    config = BenchConfig.from_args(args)
    console, progress = Console(), Console(stderr=True)
    # Other processes' load is the main source of noise on a shared machine: record it.
    load_at_start = os.getloadavg()[0]
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    engine = _step_engine(config)
    samples, round_rates = measure_steps(config, engine, progress)
    rates = median_rates(round_rates)
    rows = step_rows(config, model_shape(engine), rates, samples)
    model = _model_info(config, engine)
    del engine  # its KV cache is the largest allocation; the next engines need the room
    throughput = _add_throughput(config, rows, progress)
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
        "config": _run_config(config),
        "rows": rows,
        "throughput": throughput,
    }
    console.print(render_table(result))
    if config.json_path:
        Path(config.json_path).write_text(json.dumps(result, indent=2) + "\n")
    return 0
