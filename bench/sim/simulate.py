"""`mixgate bench simulate`: one workload through the real scheduler in virtual time.

    mixgate bench simulate --workload gpu-mixed --model llama-3-70b --device h200 \\
        --devices 8 --out /tmp/sim

The engine is the live one (`engine.sim.engine.SimulatedEngine`: `LLMEngine`'s step loop, its
`Scheduler` and `BlockManager`) with a cost-model executor; the gateway's admission, queues and
claims are modelled in `bench.sim.gateway`, the clients in `bench.sim.run`. The results folder is a
live run's (`bench.report.run_folder`), so `bench.report.summary`, the report, the plots and
`mixgate envelope derive` read it unchanged; its config.json says it was simulated, on what, and
under which assumptions.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.load.generator import offered_load
from bench.load.workload import Workload
from bench.report.run_folder import write_run
from bench.sim.gateway import SimGateway
from bench.sim.run import SimResult, simulate_load, warm_up
from bench.sim.setup import SimTarget, resolve_target
from bench.sim.workloads import load_sim_workload
from engine.core.config import EngineConfig
from engine.sim.engine import SimulatedEngine
from gateway.runtime.engine_setup import engine_config
from gateway.runtime.settings import Settings
from policies.envelope import Envelope, load_envelope
from policies.scheduling_policy import SchedulingPolicy, gateway_envelope

__all__ = [
    "SimSpec",
    "print_summary",
    "run_simulate",
    "run_simulated",
    "sim_spec_from_args",
    "simulate",
]

NOT_MODELLED = (
    "HTTP, Redis and client latency: claims happen at step boundaries",
    "leases, reclaims, retries, several replicas",
    "tensor-parallel communication (--devices is ideal scaling)",
    "SSE chunk merging: one token is one content chunk",
    "the live gateway's moving-average prompt share of queued tokens (exact here)",
)


@dataclass(frozen=True, slots=True)
class SimSpec:
    """What a simulated run runs on; the counterpart of bench.live.run.RunSpec."""

    target: SimTarget
    policy: str = "mixgate"
    envelope: Envelope | None = None  # None: the built-in default
    seed: int | None = None  # None: the workload's own seed, engine seed 0
    drain_s: float = 10.0


def sim_engine_config(envelope: Envelope, policy: str, seed: int | None) -> EngineConfig:
    """The EngineConfig the live service would build from this envelope (gateway/engine_setup)."""
    config = engine_config(envelope, Settings(policy=policy))
    return dataclasses.replace(config, seed=seed or 0)


def simulate(spec: SimSpec, workload: Workload) -> tuple[SimResult, SimulatedEngine, Envelope]:
    """The run itself, nothing written: its result, the engine it ran on, the envelope the
    gateway enforced."""
    policy = SchedulingPolicy(spec.policy)
    envelope = gateway_envelope(spec.envelope or Envelope.default(), policy)
    if spec.seed is not None:
        workload = dataclasses.replace(workload, seed=spec.seed)
    config = sim_engine_config(envelope, policy.value, spec.seed)
    target = spec.target
    engine = SimulatedEngine(
        target.raw_config,
        config,
        shape=target.shape,
        hardware=target.hardware,
        num_kv_blocks=target.num_kv_blocks(config.block_size_tokens, config.step_token_budget),
    )
    warm_up(engine)
    gateway = SimGateway(engine, envelope, policy)
    return simulate_load(workload, engine, gateway, drain_s=spec.drain_s), engine, envelope


def run_simulated(
    spec: SimSpec, workload: Workload, folder: Path, title: str, extra: dict[str, Any]
) -> dict[str, Any]:
    """Simulate the workload; write the run folder; return its summary (as `run_live` does)."""
    started = time.perf_counter()
    result, engine, envelope = simulate(spec, workload)
    if spec.seed is not None:
        workload = dataclasses.replace(workload, seed=spec.seed)
    config, target = engine.config, spec.target
    runtime_config = {
        "policy": spec.policy,
        "envelope": envelope.to_dict(),
        "engine": dataclasses.asdict(config),
        "simulated": True,
        "simulation": {
            **target.describe(config.step_token_budget),
            "kv_blocks": engine.block_manager.num_blocks,
            "seed": spec.seed,
            "drain_s": spec.drain_s,
            "steps": engine.executor.steps,
            "busy_s": engine.executor.busy_s,
            "wall_s": time.perf_counter() - started,
            "not_modelled": list(NOT_MODELLED),
        },
        "hardware": {"simulated": f"{target.devices}x {target.device}"},
        "model": {"name": target.model_name, "config": target.raw_config},
        "offered": offered_load(workload, result.issued),
        "workload_name": workload.name,
        **extra,
    }
    return write_run(folder, workload, result, runtime_config, f"{title} (simulated)")


def sim_spec_from_args(args: argparse.Namespace, model: str) -> SimSpec:
    envelope_path = getattr(args, "envelope", None)
    return SimSpec(
        target=resolve_target(model, args.device, devices=args.devices, dtype=args.dtype),
        policy=getattr(args, "policy", "mixgate"),
        envelope=load_envelope(Path(envelope_path).read_text()) if envelope_path else None,
        seed=args.seed,
        drain_s=args.drain_s,
    )


_OUTCOMES = ("ok", "rejected", "expired", "cancelled", "incomplete")
_COUNT_COLUMNS = ("class", "sent", *_OUTCOMES)
_LATENCY_COLUMNS = ("TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def print_summary(summary: dict[str, Any], title: str) -> None:
    table = Table(title=title)
    for column in (*_COUNT_COLUMNS, *_LATENCY_COLUMNS, "out tok/s"):
        table.add_column(column, justify="right")
    for name, block in summary["classes"].items():
        outcomes = block["outcomes"]
        table.add_row(
            name,
            str(block["count"]),
            *(str(outcomes.get(k, 0)) for k in _OUTCOMES),
            _ms(block["ttft_s"]["p50"]),
            _ms(block["ttft_s"]["p99"]),
            _ms(block["itl_s"]["p50"]),
            _ms(block["itl_s"]["p99"]),
            f"{block['output_tokens_per_s']:.0f}",
        )
    Console(width=160).print(table)


def run_simulate(args: argparse.Namespace) -> int:
    workload = load_sim_workload(args.workload)
    if args.duration_s is not None:
        workload = dataclasses.replace(workload, duration_s=args.duration_s)
    if args.rate_scale != 1.0:
        workload = workload.scaled(args.rate_scale)
    spec = sim_spec_from_args(args, args.model)
    started = time.perf_counter()
    out = Path(args.out)
    summary = run_simulated(spec, workload, out, f"{workload.name} on {args.model}", {})
    wall_s = time.perf_counter() - started
    target = spec.target
    print_summary(
        summary,
        f"{workload.name}: {target.model_name} on {target.devices}x {target.device} "
        f"({spec.policy}), {summary['duration_s']:.0f} simulated s in {wall_s:.1f} s",
    )
    print(f"results in {out}")
    return 0
