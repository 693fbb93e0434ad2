"""Aggregate throughput, native engine vs vLLM, in-process, same folder, same threads.

    .venv-vllm/bin/python -m bench.baselines.vllm_throughput --model DIR --threads 2 --json out.json

N prompts of P tokens, each generating O tokens (greedy, EOS ignored), all submitted at once;
tokens/s = generated tokens / wall time from submission to the last token, median of rounds.
Both engines get the envelope's limits (`max_active_seqs`, `step_token_budget`) and the same
threads (`--threads`: torch's intra-op threads for native, OpenMP cores 0..N-1 for vLLM).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
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
    return [
        GenerationRequest(
            f"{tag}-{i}",
            tuple((i * 31 + j * 7) % 250 + 1 for j in range(prompt_tokens)),
            sampling,
            RequestClass.BULK,
        )
        for i in range(count)
    ]


def native_round(engine: LLMEngine, requests: list[Any]) -> float:
    started = time.monotonic()
    for request in requests:
        engine.add_request(request)
    generated = 0
    while engine.has_unfinished_requests():
        generated += sum(len(out.new_token_ids) for out in engine.step())
    return generated / (time.monotonic() - started)


async def vllm_round(engine: VllmAsyncEngine, requests: list[Any]) -> float:
    async def one(request: Any) -> int:
        return sum([len(out.new_token_ids) async for out in engine.generate(request)])

    started = time.monotonic()
    generated = sum(await asyncio.gather(*(one(r) for r in requests)))
    return generated / (time.monotonic() - started)


async def _vllm(model: Path, config: EngineConfig, args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    engine = VllmAsyncEngine(model, config)
    await engine.start()
    startup_s = time.monotonic() - started
    try:
        await vllm_round(engine, _requests("warm", 4, args.prompt_tokens, 4))
        rates = [
            await vllm_round(
                engine, _requests(f"r{k}", args.count, args.prompt_tokens, args.output_tokens)
            )
            for k in range(args.rounds)
        ]
    finally:
        await engine.stop()
    return {"tokens_per_s": rates, "median": statistics.median(rates), "startup_s": startup_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--count", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    config = EngineConfig(
        max_active_seqs=32,
        step_token_budget=512,
        kv_cache_bytes=512 << 20,
        max_model_len=1024,
        device="cpu",
        num_threads=args.threads,
        scheduling_policy="priority",
    )
    native = LLMEngine(args.model, config)
    native_round(native, _requests("warm", 4, args.prompt_tokens, 4))
    native_rates = [
        native_round(native, _requests(f"n{k}", args.count, args.prompt_tokens, args.output_tokens))
        for k in range(args.rounds)
    ]
    del native
    vllm = asyncio.run(_vllm(args.model, config, args))
    result = {
        "model": str(args.model),
        "threads": args.threads,
        "workload": vars(args) | {"model": str(args.model), "json": None},
        "native": {"tokens_per_s": native_rates, "median": statistics.median(native_rates)},
        "vllm": vllm,
        "native_over_vllm": statistics.median(native_rates) / vllm["median"],
    }
    print(json.dumps(result, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
