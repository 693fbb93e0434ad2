"""guidellm's sweep against `mixgate serve` and against plain vLLM (its OpenAI server), one
after the other, on the same model folder and CPU threads; writes each report and a table of
TTFT, ITL and output tokens/s per rate.

    .venv/bin/python -m bench.baselines.guidellm_compare --model-dir models/small --threads 2 \\
        --out bench-out/guidellm-compare

Needs .venv-guidellm (scripts/setup-guidellm) and .venv-vllm (scripts/setup-vllm). Run it on
a quiet machine: both servers and guidellm share its cores.
"""

from __future__ import annotations

import argparse
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.baselines.guidellm_run import GuidellmRun, benchmark_row
from bench.baselines.vllm_server import VllmServer
from bench.live.processes import ServerProcess, redis_url
from policies.envelope import Envelope


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.baselines.guidellm_compare")
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of each engine")
    parser.add_argument("--kv-cache-bytes", type=int, default=1 << 30)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--endpoint", default="/v1/chat/completions")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--sweep-size", type=int, default=6)
    parser.add_argument("--seconds-per-rate", type=int, default=30)
    parser.add_argument("--redis-url", default=None, help="default: a throwaway redis-server")
    parser.add_argument("--only", choices=["mixgate", "vllm"], default=None)
    # NOTE: guidellm's `throughput` step sends every request at once; mixgate's admission
    # answers what overflows the interactive queue with 429 queue_full (counted as errored),
    # vLLM queues it all. Pass an envelope with a larger queue_limit, or a baseline policy,
    # to compare like with like.
    parser.add_argument("--envelope", type=Path, default=None, help="mixgate serve --envelope")
    parser.add_argument("--policy", default=None, help="mixgate serve --policy")
    return parser.parse_args(argv)


@contextmanager
def _mixgate(args: argparse.Namespace, folder: Path) -> Iterator[str]:
    with redis_url(args.redis_url, folder / "redis") as url:
        server = ServerProcess(
            args.model_dir,
            url,
            f"{{gl-{uuid.uuid4().hex[:8]}}}:",
            folder / "server",
            envelope_path=args.envelope,
            policy=args.policy,
            extra_env={
                "MIXGATE_NUM_THREADS": str(args.threads),
                "MIXGATE_KV_CACHE_BYTES": str(args.kv_cache_bytes),
            },
        ).start(ready_timeout_s=600)
        try:
            yield server.url
        finally:
            server.stop()


@contextmanager
def _vllm(args: argparse.Namespace, folder: Path) -> Iterator[str]:
    server = VllmServer(
        args.model_dir,
        "fcfs",
        Envelope.default("vllm"),
        args.threads,
        args.kv_cache_bytes,
        folder,
        served_model_name=args.model_dir.name,
    ).start()
    try:
        yield server.url
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    servers = {"mixgate": _mixgate, "vllm": _vllm}
    table: dict[str, list[dict[str, Any]]] = {}
    for name, serve in servers.items():
        if args.only not in (None, name):
            continue
        folder = args.out / name
        folder.mkdir(exist_ok=True)
        with serve(args, folder) as url:
            run = GuidellmRun(
                target=url,
                model=args.model_dir.name,
                tokenizer_dir=args.model_dir.resolve(),
                endpoint=args.endpoint,
                profile=f"kind=sweep,sweep_size={args.sweep_size}",
                prompt_tokens=args.prompt_tokens,
                output_tokens=args.output_tokens,
                constraint=f"kind=max_duration,seconds={args.seconds_per_rate}",
            )
            timeout_s = 600 + 3 * args.sweep_size * args.seconds_per_rate
            table[name] = [benchmark_row(b) for b in run.run(folder, timeout_s)]
    (args.out / "summary.json").write_text(json.dumps(table, indent=2))
    for name, rows in table.items():
        print(f"== {name}")
        print("strategy     rate    req/s   TTFT p50 ms  ITL p50 ms  out tok/s  errored")
        for row in rows:
            print(
                f"{row['strategy']:<12} {row['rate'] or 0:6.2f} {row['requests_per_s'] or 0:7.2f} "
                f"{row['ttft_ms_median'] or 0:12.1f} {row['itl_ms_median'] or 0:11.2f} "
                f"{row['output_tokens_per_s'] or 0:10.1f} {row['errored']:8d}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
