"""`mixgate bench engine`'s report: what was run, on which model, and the printed table."""

from __future__ import annotations

import time
from typing import Any

from rich.table import Table

from bench.engine.config import STEP_TOKEN_BUDGET, WARMUP_STEPS, BenchConfig
from bench.report.run_folder import runtime_facts
from engine.core.llm_engine import LLMEngine
from engine.model.kernels.fused_elementwise_triton import TritonFusedElementwise
from engine.model.kernels.paged_decode_triton import TritonPagedDecode
from planning.costmodel import ModelShape

__all__ = ["fmt", "model_info", "render_table", "run_config"]


def model_info(config: BenchConfig, engine: LLMEngine, shape: ModelShape) -> dict[str, Any]:
    mc = engine.model_config
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
        # Which GEMM path the decode steps took (EngineConfig.prepack_linears): on a Zen 4 CPU
        # it is the largest single factor in the step time.
        "linears": _linears(engine),
        # Which decode attention ran (EngineConfig.paged_attention_kernel).
        "decode_attention": _decode_attention(engine),
        # Which elementwise ops ran (EngineConfig.fused_elementwise_kernels).
        "elementwise": _elementwise(engine),
        # Whether pure-decode steps ran every layer in one C call (EngineConfig.
        # fused_step_forward).
        "step_forward": "c" if engine.runner.step_forward is not None else "layers",
        # Whether pure-decode steps replayed CUDA graphs (EngineConfig.decode_graphs).
        "decode_graphs": decode_graph_info(engine),
    }


def _elementwise(engine: LLMEngine) -> str:
    kernels = engine.runner.fused_elementwise
    if kernels is None:
        return "eager-torch"
    return "triton" if isinstance(kernels, TritonFusedElementwise) else "c"


def decode_graph_info(engine: LLMEngine) -> dict[str, Any] | None:
    graphs = engine.runner.decode_graphs
    if graphs is None:
        return None
    return {
        "capture": graphs.capture,
        "graphs_captured": graphs.graphs_captured,
        "steps_served": graphs.steps_served,
        "replays": graphs.replays,
        "disabled_reason": graphs.disabled_reason,
        "sdpa_backends": graphs.sdpa_backends,
    }


def run_config(config: BenchConfig) -> dict[str, Any]:
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


def fmt(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def render_table(result: dict[str, Any]) -> Table:
    model, config = result["model"], result["config"]
    table = Table(
        title=f"{model['num_parameters'] / 1e6:.1f}M params {model['dtype']}, "
        f"{model.get('linears', 'torch')} linears, "
        f"{result['threads']} threads, context {config['context']}"
        + _graphs_title(model.get("decode_graphs")),
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
            fmt(row["step_s"], 1e3),
            fmt(row["estimate_s"], 1e3),
            fmt(row["ratio"], digits=2),
            row["limiting"],
            fmt(row["tokens_s"]),
            fmt(naive),
            fmt(speedup, digits=2),
        )
    return table


def _decode_attention(engine: LLMEngine) -> str:
    kernel = engine.runner.decode_kernel
    if kernel is None:
        return "gather-sdpa"
    return "paged-triton" if isinstance(kernel, TritonPagedDecode) else "paged-kernel"


def _graphs_title(graphs: dict[str, Any] | None) -> str:
    if graphs is None or not graphs["capture"]:
        return ""
    if graphs["disabled_reason"]:
        return ", CUDA graphs failed (eager)"
    return f", CUDA graphs ({graphs['graphs_captured']} captured)"


def _linears(engine: LLMEngine) -> str:
    if not engine.runner.prepacked:
        return "torch"
    # Decode-sized calls through the engine's own loop (small_linear_kernel).
    return "onednn-prepacked+skinny-kernel" if engine.runner.skinny_linear else "onednn-prepacked"
