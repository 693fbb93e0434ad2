"""Native engine vs vLLM, in-process, same folder, same threads: decode throughput and prefill.

    .venv-vllm/bin/python -m bench.baselines.vllm_throughput --model DIR --threads 2 --json out.json
    .venv-vllm/bin/python -m bench.baselines.vllm_throughput --model DIR --mode prefill \
        --prefill-lengths 512,2048 --json prefill.json

`--mode throughput` (default): N prompts of P tokens, each generating O tokens (greedy, EOS
ignored), all submitted at once; tokens/s = generated tokens / wall time from submission to the
last token, median of rounds (N = 32 is issue 14's decode at B = 32).
`--mode prefill`: for each length L, `--prefill-count` prompts of L tokens that generate one
token; prefill tokens/s = prompt tokens / wall time, median of rounds (issue 14's 512 and
2,048). Both engines get the same limits (`max_active_seqs`, `step_token_budget`, for prefill
a budget and bulk chunk of max(L) so that neither engine splits a prompt more than the other)
and the same threads (`--threads`: torch's intra-op threads for native, OpenMP cores 0..N-1 for
vLLM). Every round draws fresh prompts (seeded), so neither engine's prefix cache serves a
later round from an earlier one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.backends.vllm.backend import VllmAsyncEngine
from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.request import GenerationRequest
from engine.core.sampling_params import SamplingParams
from policies.request_class import RequestClass


def _requests(tag: str, count: int, prompt_tokens: int, output_tokens: int) -> list[Any]:
    sampling = SamplingParams(
        max_tokens=output_tokens, temperature=0.0, ignore_eos=True, detokenize=False
    )
    rng = random.Random(tag)  # a fresh prompt set per tag: no prefix-cache hits across rounds
    return [
        GenerationRequest(
            f"{tag}-{i}",
            tuple(rng.randrange(1, 251) for _ in range(prompt_tokens)),
            sampling,
            RequestClass.BULK,
        )
        for i in range(count)
    ]


def _prompt_tokens(requests: list[Any]) -> int:
    return sum(len(r.prompt_token_ids) for r in requests)


def native_round(engine: LLMEngine, requests: list[Any], *, prefill: bool = False) -> float:
    """Generated tokens/s, or with `prefill` prompt tokens/s, of one batch run to the end."""
    started = time.monotonic()
    for request in requests:
        engine.add_request(request)
    generated = 0
    while engine.has_unfinished_requests():
        generated += sum(len(out.new_token_ids) for out in engine.step())
    counted = _prompt_tokens(requests) if prefill else generated
    return counted / (time.monotonic() - started)


async def vllm_round(
    engine: VllmAsyncEngine, requests: list[Any], *, prefill: bool = False
) -> float:
    async def one(request: Any) -> int:
        return sum([len(out.new_token_ids) async for out in engine.generate(request)])

    started = time.monotonic()
    generated = sum(await asyncio.gather(*(one(r) for r in requests)))
    counted = _prompt_tokens(requests) if prefill else generated
    return counted / (time.monotonic() - started)


@dataclass(frozen=True, slots=True)
class Workload:
    """One measured row: `count` prompts of `prompt_tokens`, `output_tokens` each."""

    label: str
    count: int
    prompt_tokens: int
    output_tokens: int
    prefill: bool  # count prompt tokens/s (else generated tokens/s)


def workloads(args: argparse.Namespace) -> list[Workload]:
    if args.mode == "prefill":
        return [
            Workload(f"prefill-{length}", args.prefill_count, length, 1, prefill=True)
            for length in parse_lengths(args.prefill_lengths)
        ]
    return [
        Workload("throughput", args.count, args.prompt_tokens, args.output_tokens, prefill=False)
    ]


def parse_lengths(text: str) -> list[int]:
    lengths = [int(part) for part in text.split(",") if part.strip()]
    if not lengths or min(lengths) < 1:
        raise SystemExit(f"--prefill-lengths needs positive integers, got {text!r}")
    return lengths


def run_native(model: Path, config: EngineConfig, args: argparse.Namespace) -> dict[str, Any]:
    engine = LLMEngine(model, config)
    # Timed rounds start on a committed cache, as vLLM's (its CPU cache is torch.zeros, every
    # page written at start-up): measured, the first rounds' page faults on fresh blocks took
    # 4×512-token prefill from 1,165 to ~970 tokens/s on 100m.
    engine.runner.wait_kv_cache_committed()
    native_round(engine, _requests("warm", 4, 16, 4))
    result = {}
    for load in workloads(args):
        # Untimed, one prompt of this length: first calls at a new row count build kernels.
        native_round(engine, _requests(f"warm-{load.label}", 1, load.prompt_tokens, 1))
        rates = [
            native_round(
                engine,
                _requests(
                    f"n-{load.label}-{k}", load.count, load.prompt_tokens, load.output_tokens
                ),
                prefill=load.prefill,
            )
            for k in range(args.rounds)
        ]
        result[load.label] = {"tokens_per_s": rates, "median": statistics.median(rates)}
    return result


async def _vllm(model: Path, config: EngineConfig, args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    engine = VllmAsyncEngine(model, config)
    await engine.start()
    result: dict[str, Any] = {"startup_s": time.monotonic() - started}
    try:
        await vllm_round(engine, _requests("warm", 4, 16, 4))
        for load in workloads(args):
            await vllm_round(engine, _requests(f"warm-{load.label}", 1, load.prompt_tokens, 1))
            rates = []
            for k in range(args.rounds):
                requests = _requests(
                    f"v-{load.label}-{k}", load.count, load.prompt_tokens, load.output_tokens
                )
                rates.append(await vllm_round(engine, requests, prefill=load.prefill))
            result[load.label] = {"tokens_per_s": rates, "median": statistics.median(rates)}
    finally:
        await engine.stop()
    return result


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The same limits for both engines; prefill mode gives both a budget of the longest prompt."""
    loads = workloads(args)
    longest = max(load.prompt_tokens + load.output_tokens for load in loads)
    budget = max(512, *(load.prompt_tokens for load in loads)) if args.mode == "prefill" else 512
    return EngineConfig(
        max_active_seqs=32,
        step_token_budget=budget,
        bulk_prefill_chunk_tokens=budget if args.mode == "prefill" else 128,
        kv_cache_bytes=args.kv_cache_mb << 20,
        max_model_len=max(1024, longest + 16),
        device="cpu",
        num_threads=args.threads,
        scheduling_policy="priority",
        # As `mixgate serve` runs it: KV pages committed and oneDNN's primitives made before
        # the first request (vLLM's engine does both before it reports ready too).
        prewarm=True,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--mode", choices=("throughput", "prefill"), default="throughput")
    parser.add_argument("--count", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--prefill-lengths", default="512,2048")
    parser.add_argument("--prefill-count", type=int, default=4, help="prompts per prefill round")
    parser.add_argument("--kv-cache-mb", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--engines", default="native,vllm", help="which to run (a comma list of native, vllm)"
    )
    parser.add_argument("--json", type=Path, default=None)
    return parser


def main() -> int:
    args = build_parser().parse_args()
    config = engine_config(args)
    engines = {part.strip() for part in args.engines.split(",") if part.strip()}
    result: dict[str, Any] = {
        "model": str(args.model),
        "threads": args.threads,
        "mode": args.mode,
        "workload": vars(args) | {"model": str(args.model), "json": None},
        "limits": {
            "step_token_budget": config.step_token_budget,
            "bulk_prefill_chunk_tokens": config.bulk_prefill_chunk_tokens,
            "max_active_seqs": config.max_active_seqs,
        },
    }
    if "native" in engines:
        result["native"] = run_native(args.model, config, args)
    if "vllm" in engines:
        result["vllm"] = asyncio.run(_vllm(args.model, config, args))
    if "native" in engines and "vllm" in engines:
        result["native_over_vllm"] = {
            load.label: result["native"][load.label]["median"]
            / result["vllm"][load.label]["median"]
            for load in workloads(args)
        }
    print(json.dumps(result, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
