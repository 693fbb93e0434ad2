"""`mixgate` command: each subcommand lives in its own layer; imports are lazy so that
`mixgate --help` stays fast and a missing optional extra only breaks its own command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence


def _make_model(args: argparse.Namespace) -> int:
    from engine.model.make_model import make_model

    path = make_model(
        args.dir,
        args.preset,
        seed=args.seed,
        dtype=args.dtype,
        max_shard_bytes=args.shard_bytes,
        draw_device=args.draw_device,
    )
    print(f"wrote {args.preset} model to {path}")
    return 0


def _bench_engine(args: argparse.Namespace) -> int:
    from bench.engine.bench import run_engine_bench

    return run_engine_bench(args)


def _bench_gateway(args: argparse.Namespace) -> int:
    from bench.gateway.bench import run_gateway_bench

    return run_gateway_bench(args)


def _bench_compare(args: argparse.Namespace) -> int:
    from bench.live.compare import run_compare

    return run_compare(args)


def _bench_sweep(args: argparse.Namespace) -> int:
    from bench.live.sweep import run_sweep

    return run_sweep(args)


def _bench_simulate(args: argparse.Namespace) -> int:
    from bench.sim.simulate import run_simulate

    return run_simulate(args)


def _envelope_derive(args: argparse.Namespace) -> int:
    from planning.envelope_command import run_envelope_derive

    return run_envelope_derive(args)


def _add_live_run_arguments(parser: argparse.ArgumentParser) -> None:
    """What compare and sweep share: the workload, the model, the machine split."""
    parser.add_argument("--workload", required=True, help="a builtin name or a TOML file")
    parser.add_argument("--out", required=True, help="results folder")
    parser.add_argument("--model", default=None, help="model folder (default: make --preset)")
    parser.add_argument("--preset", default="small", help="preset made when --model is not given")
    parser.add_argument("--redis-url", default=None, help="default: a throwaway redis-server")
    parser.add_argument("--threads", type=int, default=1, help="server torch threads")
    parser.add_argument("--duration-s", type=float, default=None, help="override the workload's")


def _add_envelope(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    envelope = sub.add_parser("envelope", help="operating envelopes")
    kinds = envelope.add_subparsers(dest="envelope_kind", required=True)
    derive = kinds.add_parser("derive", help="pick the envelope that meets an SLO from a sweep")
    derive.add_argument("dir", help="a sweep folder (mixgate bench sweep --out)")
    derive.add_argument("--slo", required=True, help="SLO targets (TOML)")
    derive.add_argument("--out", required=True, help="envelope TOML to write")
    derive.add_argument("--base", default=None, help="envelope to start from (TOML)")
    derive.set_defaults(handler=_envelope_derive)


def _serve(args: argparse.Namespace) -> int:
    from gateway.runtime.serve import run_serve

    return run_serve(args)


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from gateway.runtime.serve import add_serve_arguments

    p = sub.add_parser("serve", help="run the gateway + engine (OpenAI-compatible HTTP)")
    add_serve_arguments(p)
    p.set_defaults(handler=_serve)


def _add_make_model(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from engine.model.presets import PRESET_NAMES

    p = sub.add_parser("make-model", help="write a seeded random model folder (HF layout)")
    p.add_argument("dir", help="output folder")
    p.add_argument("--preset", choices=PRESET_NAMES, default="tiny")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--shard-bytes", type=int, default=None, help="split weights into shards")
    p.add_argument(
        "--draw-device",
        default="cpu",
        help="where the random weights are drawn: cuda makes an 8b folder in seconds, with "
        "other numbers than cpu's for the same seed",
    )
    p.set_defaults(handler=_make_model)


def _add_bench(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = sub.add_parser("bench", help="benchmarks that print numbers and write JSON")
    kinds = bench.add_subparsers(dest="bench_kind", required=True)
    engine = kinds.add_parser("engine", help="decode step vs estimate; engine vs naive batching")
    engine.add_argument("--model", required=True, help="model folder")
    engine.add_argument("--batch-sizes", default="1,2,4,8,16,32,64")
    engine.add_argument("--context", type=int, default=128, help="context for the step timing")
    engine.add_argument(
        "--steps", type=int, default=10, help="timed decode steps per batch size and round"
    )
    engine.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="repeat rates and step timings; medians over rounds resist bursts of load",
    )
    engine.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    engine.add_argument("--device", default="cpu")
    engine.add_argument("--threads", type=int, default=None)
    engine.add_argument(
        "--throughput-batches",
        default="8,32",
        help="batch sizes for the mixed-length throughput comparison",
    )
    engine.add_argument("--seed", type=int, default=0)
    engine.add_argument(
        "--decode-attention",
        choices=("kernel", "sdpa"),
        default="kernel",
        help="decode attention: the paged kernel over the cache in place (the engine's default "
        "where it builds), or gathered K/V copies through torch's SDPA",
    )
    engine.add_argument(
        "--decode-graphs",
        choices=("auto", "off"),
        default="auto",
        help="pure-decode steps as CUDA graphs on a GPU (the engine's default), or eager",
    )
    engine.add_argument(
        "--elementwise",
        choices=("fused", "eager"),
        default="fused",
        help="RMSNorm, SiLU * up and rotary: the engine's fused kernels (C on CPU, Triton on CUDA; "
        "its default where they run), or eager torch ops",
    )
    engine.add_argument(
        "--small-linears",
        choices=("kernel", "onednn"),
        default="kernel",
        help="decode-sized calls (<= 128 rows with AVX-512, 64 with AVX2; weights <= 64 MiB): "
        "the engine's C loop (its default where it builds), or oneDNN for every call",
    )
    engine.add_argument(
        "--step-forward",
        choices=("fused", "layers"),
        default="fused",
        help="steps of up to 128 rows on CPU (fp32, the C kernels above): every layer in one C "
        "call (the engine's default where it runs), or layer by layer from Python",
    )
    engine.add_argument("--json", default=None, help="write results here")
    engine.add_argument(
        "--bandwidth-matrix-mb",
        type=int,
        default=None,
        help="matrix size for the bandwidth measurement (default: 2x the L3, at least 256)",
    )
    engine.set_defaults(handler=_bench_engine)
    from bench.gateway.args import add_gateway_bench_arguments

    gateway = kinds.add_parser("gateway", help="queue round trips; TTFT via gateway vs engine")
    add_gateway_bench_arguments(gateway)
    gateway.set_defaults(handler=_bench_gateway)
    compare = kinds.add_parser("compare", help="one workload under each policy, side by side")
    _add_live_run_arguments(compare)
    compare.add_argument("--policies", default="fcfs,priority,mixgate")
    compare.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run the whole comparison N times (policy order rotated) and report medians",
    )
    compare.add_argument(
        "--peer",
        default=None,
        help="with --repeats: the policy each other policy's paired ratios are taken against "
        "(default: the first of --policies)",
    )
    compare.add_argument(
        "--slo",
        default=None,
        help="SLO whose TTFT/ITL bounds count goodput (default: bench/slos/chat-over-backlog.toml)",
    )
    compare.set_defaults(handler=_bench_compare)
    sweep = kinds.add_parser("sweep", help="offered load x engine knobs, for envelope derive")
    _add_live_run_arguments(sweep)
    sweep.add_argument("--loads", default="0.5,1,1.5", help="load factors applied to the workload")
    sweep.add_argument("--max-active-seqs", default="16,32")
    sweep.add_argument("--step-token-budgets", default="256,512")
    sweep.add_argument(
        "--bulk-prefill-chunks",
        default="",
        help="bulk prefill chunk sizes in tokens (default: the base envelope's, capped by "
        "the budget): the knob that bounds the step a chat decodes beside",
    )
    sweep.add_argument("--policy", default="mixgate")
    sweep.set_defaults(handler=_bench_sweep)
    _add_soak(kinds)
    _add_step_profile(kinds)
    _add_simulation(kinds, compare, sweep)
    _add_batch_bench(kinds)
    _add_breakdown(kinds)


def _bench_breakdown(args: argparse.Namespace) -> int:
    from bench.gateway.breakdown import run_breakdown

    return run_breakdown(args)


def _add_breakdown(kinds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from bench.gateway.breakdown_args import add_breakdown_arguments

    breakdown = kinds.add_parser(
        "breakdown", help="where chat TTFT/ITL go: queueing, engine, Redis, event-loop lag"
    )
    add_breakdown_arguments(breakdown)
    breakdown.set_defaults(handler=_bench_breakdown)


def _bench_soak(args: argparse.Namespace) -> int:
    from bench.soak.run import run_soak

    return run_soak(args)


def _bench_batch(args: argparse.Namespace) -> int:
    from bench.gateway.batch_bench import run_batch_bench

    return run_batch_bench(args)


def _add_batch_bench(kinds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from bench.gateway.batch_bench_args import add_batch_bench_arguments

    batch = kinds.add_parser("batch", help="streamed chat TTFT/ITL with and without a batch")
    add_batch_bench_arguments(batch)
    batch.set_defaults(handler=_bench_batch)


def _bench_step_profile(args: argparse.Namespace) -> int:
    from bench.engine.step_profile import run_step_profile

    return run_step_profile(args)


def _add_step_profile(kinds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from bench.engine.step_profile_args import add_step_profile_arguments

    profile = kinds.add_parser(
        "step-profile", help="where a decode step's time goes: host vs kernels, top operators"
    )
    add_step_profile_arguments(profile)
    profile.set_defaults(handler=_bench_step_profile)


def _add_soak(kinds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from bench.soak.args import add_soak_arguments

    soak = kinds.add_parser("soak", help="bounded soak under load: memory, KV blocks, tasks")
    add_soak_arguments(soak)
    soak.set_defaults(handler=_bench_soak)


def _add_simulation(
    kinds: argparse._SubParsersAction[argparse.ArgumentParser],
    compare: argparse.ArgumentParser,
    sweep: argparse.ArgumentParser,
) -> None:
    """`bench simulate`, and `--simulate` (virtual time, cost model) for compare and sweep."""
    from bench.sim.args import add_simulate_arguments, add_simulation_flags

    simulate = kinds.add_parser(
        "simulate", help="the real scheduler in virtual time, step times from the cost model"
    )
    add_simulate_arguments(simulate)
    simulate.set_defaults(handler=_bench_simulate)
    for parser in (compare, sweep):
        add_simulation_flags(parser, switch=True)


def _plan(args: argparse.Namespace) -> int:
    from engine.model.presets import preset_configs
    from planning.plan_command import run_plan

    return run_plan(args, preset_configs())


def _plan_calibrate(args: argparse.Namespace) -> int:
    from bench.engine.calibrate import run_calibrate

    return run_calibrate(args)


def _add_plan(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`plan` (cost model per batch size, best B, starting envelope) and `plan calibrate`."""
    from bench.engine.calibrate_args import add_calibrate_arguments
    from planning.plan_command import add_plan_arguments

    plan = sub.add_parser("plan", help="capacity plan from the cost model; `calibrate` measures")
    add_plan_arguments(plan)
    plan.set_defaults(handler=_plan)
    modes = plan.add_subparsers(dest="plan_mode", required=False)
    calibrate = modes.add_parser("calibrate", help="fit the cost model's rates to engine steps")
    add_calibrate_arguments(calibrate)
    calibrate.set_defaults(handler=_plan_calibrate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mixgate", description="Mixed-workload LLM serving: interactive chat + bulk jobs."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add in _SUBCOMMANDS:
        add(sub)
    return parser


_SUBCOMMANDS: list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]] = [
    _add_serve,
    _add_make_model,
    _add_bench,
    _add_envelope,
    _add_plan,
]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
