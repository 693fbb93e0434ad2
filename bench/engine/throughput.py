"""`mixgate bench engine`, part (b): the engine's throughput against naive static batching on
4·B seeded requests of mixed lengths, on the same weights."""

from __future__ import annotations

import random
import time
from typing import Any

from rich.console import Console

from bench.engine.config import BenchConfig, blocks, greedy, make_engine, random_prompt
from bench.engine.naive_baseline import BenchRequest, run_naive
from engine.core.llm_engine import LLMEngine
from engine.core.request import GenerationRequest

__all__ = ["add_throughput", "compare_throughput", "mixed_workload", "run_engine_requests"]

# Mixed workload of the throughput comparison (uniform, inclusive), from the issue.
PROMPT_TOKENS_RANGE = (16, 256)
OUTPUT_TOKENS_RANGE = (8, 128)
REQUESTS_PER_BATCH_SLOT = 4


def mixed_workload(num_requests: int, vocab: int, rng: random.Random) -> list[BenchRequest]:
    return [
        BenchRequest(
            request_id=f"mixed-{i}",
            prompt_token_ids=random_prompt(rng, rng.randint(*PROMPT_TOKENS_RANGE), vocab),
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
            GenerationRequest(r.request_id, r.prompt_token_ids, greedy(r.max_tokens))
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
    blocks_per_seq = blocks(PROMPT_TOKENS_RANGE[1] + OUTPUT_TOKENS_RANGE[1])
    engine = make_engine(config, batch, batch * blocks_per_seq + 1)
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


def add_throughput(
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
