"""`mixgate bench engine`'s settings and the engine and request helpers its parts share."""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass

from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.sampling_params import SamplingParams

__all__ = [
    "BLOCK_SIZE_TOKENS",
    "STEP_TOKEN_BUDGET",
    "WARMUP_STEPS",
    "BenchConfig",
    "blocks",
    "greedy",
    "make_engine",
    "parse_sizes",
    "random_prompt",
]

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
    # EngineConfig.paged_attention_kernel: False times decode attention by gather + SDPA.
    paged_attention_kernel: bool = True
    # EngineConfig.fused_elementwise_kernels: False times eager torch's elementwise ops.
    fused_elementwise_kernels: bool = True
    # EngineConfig.small_linear_kernel: False times oneDNN for every linear call.
    small_linear_kernel: bool = True
    # EngineConfig.fused_step_forward: False times the layer-by-layer forward.
    fused_step_forward: bool = True
    # EngineConfig.decode_graphs: "off" times the eager forward on CUDA too.
    decode_graphs: str = "auto"

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
            batch_sizes=parse_sizes(args.batch_sizes),
            throughput_batches=parse_sizes(args.throughput_batches),
            context_tokens=args.context,
            steps=args.steps,
            rounds=getattr(args, "rounds", 1),
            dtype=args.dtype,
            device=args.device,
            threads=args.threads,
            seed=args.seed,
            json_path=args.json,
            matrix_bytes=None if matrix_mb is None else matrix_mb << 20,
            paged_attention_kernel=getattr(args, "decode_attention", "kernel") == "kernel",
            fused_elementwise_kernels=getattr(args, "elementwise", "fused") == "fused",
            small_linear_kernel=getattr(args, "small_linears", "kernel") == "kernel",
            decode_graphs=getattr(args, "decode_graphs", "auto"),
            fused_step_forward=getattr(args, "step_forward", "fused") == "fused",
        )

    def all_batch_sizes(self) -> list[int]:
        """Every throughput batch also gets a step timing, so each row has both numbers."""
        return sorted(set(self.batch_sizes) | set(self.throughput_batches))


def parse_sizes(text: str) -> tuple[int, ...]:
    sizes = tuple(int(part) for part in text.split(",") if part.strip())
    if any(size < 1 for size in sizes):
        raise ValueError(f"batch sizes must be positive integers, got {text!r}")
    return sizes


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)


def blocks(tokens: int) -> int:
    return -(-tokens // BLOCK_SIZE_TOKENS)


def make_engine(config: BenchConfig, max_active_seqs: int, num_kv_blocks: int) -> LLMEngine:
    """The engine as `mixgate serve` runs it (prewarmed), its KV pages committed before timing."""
    engine = LLMEngine(
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
            paged_attention_kernel=config.paged_attention_kernel,
            fused_elementwise_kernels=config.fused_elementwise_kernels,
            small_linear_kernel=config.small_linear_kernel,
            decode_graphs=config.decode_graphs,
            fused_step_forward=config.fused_step_forward,
            # Without it a step that opens a fresh block page-faults inside the timed write of
            # its K/V (index_copy_ took 3.0 ms of a 25 ms B=8 step on 100m in step-profile).
            prewarm=True,
        ),
    )
    engine.runner.wait_kv_cache_committed()
    return engine


def random_prompt(rng: random.Random, length: int, vocab: int) -> tuple[int, ...]:
    return tuple(rng.randrange(vocab) for _ in range(length))
