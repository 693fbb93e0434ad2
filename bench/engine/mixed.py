"""The mixed long-context step: decodes over long contexts beside a prefill chunk, timed and split.

    python -m bench.engine.mixed --model DIR --threads 2 [--profile] [--json OUT]

Under chat-over-backlog the step that sets chat ITL is ~30 decodes over 100-1,500-token
contexts plus a 256-token bulk chunk at position ~1,000 (`bench.engine.mixed_step`); `mixgate bench
engine` times only short-context pure decodes. This times three steps over one ModelRunner's
paged cache, interleaved round by round (mixed, its decodes alone, its chunk alone), so a
before/after on a quiet machine sees the mixed step and what it is made of. `--profile` adds
the torch profiler's split of the mixed step: input building, attention metadata, K/V
write + gather, SDPA, the paged decode and prefill kernels, linears, and the rest.
`--decode-attention both` times every step with the paged decode kernel and with gather + SDPA,
interleaved, in one process (the kernel's before/after on the same cache); the chunk takes the
engine's prefill path in both. `--forward both` times every step through the one-call C forward
(engine/model/kernels/step_forward.py) and through the layers, interleaved likewise. Gather +
SDPA and the profile's split run the layers (the C forward calls the C kernels only, and the
profiler cannot see inside it).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.profiler import profile, record_function

from bench.engine.mixed_step import MixedStepShape, blocks_for, build_mixed_step
from engine.core.scheduler_output import SchedulerOutput
from engine.model import attention
from engine.model import runner as model_runner
from engine.model.attention import DecodeKernel
from engine.model.kernels.step_forward import StepForward
from engine.model.prepacked_linear import PrepackedLinear
from engine.model.runner import ModelRunner
from engine.model.weights import DTYPES, load_model

__all__ = ["mixed_step_rows", "profile_shares", "run_mixed_step_bench"]


def _shapes(args: argparse.Namespace) -> dict[str, MixedStepShape]:
    low, high = (int(part) for part in args.context_range.split(","))
    mixed = MixedStepShape(
        decodes=args.decodes,
        min_context_tokens=low,
        max_context_tokens=high,
        prefill_chunk_tokens=args.chunk_tokens,
        prefill_start_pos=args.chunk_start,
        seed=args.seed,
    )
    shapes = {
        "mixed": mixed,
        "decodes only": dataclasses.replace(mixed, prefill_chunk_tokens=0),
        "chunk only": dataclasses.replace(mixed, decodes=0),
    }
    # A step with no decodes (or no chunk) has one part only: drop the empty and the duplicate.
    if not mixed.decodes or not mixed.prefill_chunk_tokens:
        return {"mixed": mixed}
    return shapes


def _time_step(runner: ModelRunner, step: SchedulerOutput, repeats: int) -> float:
    started = time.perf_counter()
    for _ in range(repeats):
        runner.execute(step)
    return (time.perf_counter() - started) / repeats


def mixed_step_rows(
    runner: ModelRunner,
    shapes: dict[str, MixedStepShape],
    rounds: int,
    repeats: int,
    decode_attention: str = "engine",
    forward: str = "engine",
) -> list[dict[str, Any]]:
    """Per step shape: the median over rounds of its mean over `repeats` back-to-back runs.

    NOTE: the shapes alternate inside each round (A, B, C, A, B, C, ...), so a burst of load
    from another process spoils one sample of each, not every sample of one. With
    `decode_attention="both"` each shape runs twice per round, with the runner's paged decode
    kernel and without it (gather + SDPA); with `forward="both"`, through the one-call C forward
    and through the layers.
    """
    kernel, fused = runner.decode_kernel, runner.step_forward
    if decode_attention in ("kernel", "both") and kernel is None:
        raise SystemExit("the paged decode kernel is not available here (see the log above)")
    if forward in ("fused", "both") and fused is None:
        raise SystemExit("the one-call C forward does not run here (see the log above)")
    attentions: dict[str, list[DecodeKernel | None]] = {
        "engine": [kernel],
        "kernel": [kernel],
        "sdpa": [None],
        "both": [kernel, None],
    }
    forwards: dict[str, list[StepForward | None]] = {
        "engine": [fused],
        "fused": [fused],
        "layers": [None],
        "both": [fused, None],
    }
    # (decode kernel, C forward): gather + SDPA runs in the layers only.
    variants = [
        (attend, step_forward if attend is not None else None)
        for attend in attentions[decode_attention]
        for step_forward in forwards[forward]
    ]
    runs = [
        (name, shape, variant, build_mixed_step(runner, shape))
        for name, shape in shapes.items()
        for variant in dict.fromkeys(variants)
    ]
    samples: list[list[float]] = [[] for _ in runs]
    for _, _, variant, step in runs:  # warm-up: first touches of the cache and the buffers
        runner.decode_kernel, runner.step_forward = variant
        runner.execute(step)
    for _ in range(rounds):
        for index, (_, _, variant, step) in enumerate(runs):
            runner.decode_kernel, runner.step_forward = variant
            samples[index].append(_time_step(runner, step, repeats))
    runner.decode_kernel, runner.step_forward = kernel, fused
    rows = []
    for (name, shape, (attend, step_forward), _), times in zip(runs, samples, strict=True):
        step_s = statistics.median(times)
        rows.append(
            {
                "step": name,
                "decode_attention": "paged-kernel" if attend is not None else "gather-sdpa",
                "forward": "c" if step_forward is not None else "layers",
                "shape": dataclasses.asdict(shape),
                "label": shape.label,
                "step_ms": step_s * 1e3,
                "step_ms_min": min(times) * 1e3,
                "tokens_per_s": (shape.decodes + shape.prefill_chunk_tokens) / step_s,
            }
        )
    return rows


@contextlib.contextmanager
def _patched(owner: Any, name: str, wrap: Callable[[Any], Any]) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, wrap(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


def _ranged(label: str) -> Callable[[Any], Any]:
    def wrap(original: Any) -> Any:
        def ranged(*args: Any, **kwargs: Any) -> Any:
            with record_function(label):
                return original(*args, **kwargs)

        return ranged

    return wrap


def profile_shares(runner: ModelRunner, step: SchedulerOutput, steps: int) -> dict[str, float]:
    """Milliseconds per step in each part of `step`, from profiler ranges around each part, run
    through the layers (the profiler cannot see inside the one-call C forward)."""
    fused, runner.step_forward = runner.step_forward, None
    try:
        return _profile_shares(runner, step, steps)
    finally:
        runner.step_forward = fused


def _profile_shares(runner: ModelRunner, step: SchedulerOutput, steps: int) -> dict[str, float]:
    runner.execute(step)
    linears = [
        m for m in runner.model.modules() if isinstance(m, (torch.nn.Linear, PrepackedLinear))
    ]
    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(runner.inputs, "build", _ranged("mix:inputs")))
        stack.enter_context(_patched(runner, "_metadata", _ranged("mix:metadata")))
        paged = attention.PagedAttention
        stack.enter_context(_patched(paged, "attend", _ranged("mix:attend")))
        stack.enter_context(_patched(paged, "_gather", _ranged("mix:gather")))
        # attention.py looks F.scaled_dot_product_attention up at each call: patch the module.
        stack.enter_context(_patched(F, "scaled_dot_product_attention", _ranged("mix:sdpa")))
        if runner.decode_kernel is not None:
            kernel = runner.decode_kernel
            stack.enter_context(_patched(kernel, "attend", _ranged("mix:kernel")))
        if runner.prefill_kernel is not None:
            chunk_kernel = runner.prefill_kernel
            stack.enter_context(_patched(chunk_kernel, "attend", _ranged("mix:prefill_kernel")))
        for linear in linears:
            stack.enter_context(_patched(linear, "forward", _ranged("mix:linear")))
        # Timed inside the profiler's context: its start and its stop took ~170 ms here, which
        # at one repeat was 95% of the "rest" this split reports.
        with profile() as prof:
            started = time.perf_counter()
            for _ in range(steps):
                runner.execute(step)
            wall_ms = (time.perf_counter() - started) / steps * 1e3
    totals = {
        e.key: e.cpu_time_total / 1e3 / steps
        for e in prof.key_averages()
        if e.key.startswith("mix:")
    }
    attend = totals.get("mix:attend", 0.0)
    sdpa = totals.get("mix:sdpa", 0.0)
    kernel_ms = totals.get("mix:kernel", 0.0)
    gather = totals.get("mix:gather", 0.0)
    prefill_kernel_ms = totals.get("mix:prefill_kernel", 0.0)
    shares = {
        "inputs (positions, slots, block tables)": totals.get("mix:inputs", 0.0),
        "attention metadata (groups, masks)": totals.get("mix:metadata", 0.0),
        "attention: K/V gather": gather,
        "attention: K/V write and the rest": attend - sdpa - gather - kernel_ms - prefill_kernel_ms,
        "attention: SDPA": sdpa,
        "attention: paged decode kernel": kernel_ms,
        "attention: paged prefill kernel": prefill_kernel_ms,
        "linears (qkv, o, mlp, lm_head)": totals.get("mix:linear", 0.0),
    }
    shares["rest (norms, rope, activations, sampling, Python)"] = wall_ms - sum(shares.values())
    shares["profiled step (wall)"] = wall_ms
    return shares


def _runner(args: argparse.Namespace, shapes: dict[str, MixedStepShape]) -> ModelRunner:
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    model, _ = load_model(args.model, dtype, device)
    # Room for every shape's sequences at once: each shape draws its blocks from the whole cache.
    num_blocks = sum(blocks_for(shape, args.block_size) for shape in shapes.values())
    return ModelRunner(model, num_blocks, args.block_size, dtype, device, seed=args.seed)


def run_mixed_step_bench(args: argparse.Namespace) -> int:
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    load_at_start = os.getloadavg()[0]
    if args.decode_group_kb is not None:
        model_runner.DECODE_GROUP_BYTES = (args.decode_group_kb << 10) or None
    shapes = _shapes(args)
    runner = _runner(args, shapes)
    rows = mixed_step_rows(
        runner, shapes, args.rounds, args.repeats, args.decode_attention, args.forward
    )
    result: dict[str, Any] = {
        "model": str(args.model),
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "prepacked_linears": runner.prepacked,
        "decode_attention": args.decode_attention,
        "forward": args.forward,
        "upcast_cpu_decode": attention.UPCAST_CPU_DECODE,
        "decode_group_bytes": model_runner.DECODE_GROUP_BYTES,
        "rows": rows,
    }
    for row in rows:
        attention_used, forward_used = row["decode_attention"], row["forward"]
        print(
            f"{row['step']:<13} {attention_used:<12} {forward_used:<6} {row['label']:<48}"
            f" {row['step_ms']:8.2f} ms"
        )
    if args.profile:
        shares = profile_shares(runner, build_mixed_step(runner, shapes["mixed"]), args.repeats)
        result["profile_ms"] = shares
        wall = shares["profiled step (wall)"]
        for part, ms in shares.items():
            print(f"  {part:<52} {ms:7.2f} ms {100 * ms / wall:5.1f}%")
        plain_ms = next(row["step_ms"] for row in rows if row["step"] == "mixed")
        print(
            "  (the layers' split; the rest holds the profiler's own cost per op; unprofiled,"
            f" {rows[0]['forward']}: {plain_ms:.2f} ms)"
        )
    result["load_average_1min"] = {"start": load_at_start, "end": os.getloadavg()[0]}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True, help="model folder")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--decodes", type=int, default=30, help="decoding sequences")
    parser.add_argument("--context-range", default="100,1500", help="LOW,HIGH decode contexts")
    parser.add_argument("--chunk-tokens", type=int, default=256, help="prefill chunk (0: none)")
    parser.add_argument("--chunk-start", type=int, default=1000, help="the chunk's first position")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=3, help="back-to-back steps per sample")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--decode-group-kb",
        type=int,
        default=None,
        help="cap on one decode group's gathered K/V in KiB (0: no cap; default: the engine's)",
    )
    parser.add_argument(
        "--decode-attention",
        choices=("engine", "kernel", "sdpa", "both"),
        default="engine",
        help=(
            "decode attention: the engine's choice, the paged kernel, gather + SDPA, or both"
            " (the chunk takes the engine's prefill path in every variant)"
        ),
    )
    parser.add_argument(
        "--forward",
        choices=("engine", "fused", "layers", "both"),
        default="engine",
        help=(
            "the forward: the engine's choice, the one-call C forward, the layers from Python, or"
            " both (gather + SDPA runs in the layers whatever this says)"
        ),
    )
    parser.add_argument(
        "--profile", action="store_true", help="split the mixed step by part (in the layers)"
    )
    parser.add_argument("--json", default=None, help="write results here")
    return parser


def main() -> int:
    return run_mixed_step_bench(build_parser().parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
