"""Command-line flags of simulated runs (kept free of heavy imports: mixgate --help stays fast)."""

from __future__ import annotations

import argparse

__all__ = ["add_simulate_arguments", "add_simulation_flags"]


def add_simulation_flags(parser: argparse.ArgumentParser, *, switch: bool) -> None:
    """The target of a simulation; with `switch`, a `--simulate` flag turns simulation on
    (sweep, compare), and `--model` is the existing flag (a folder, a config.json or a name)."""
    if switch:
        parser.add_argument(
            "--simulate",
            action="store_true",
            help="run in virtual time with the cost model instead of a live server",
        )
        parser.add_argument(
            "--jobs", type=int, default=None, help="simulated runs at once (default: CPU count)"
        )
        parser.add_argument(
            "--envelope",
            default=None,
            help="the base envelope TOML: a live server runs it, the simulator reads it "
            "(default: built-in)",
        )
    parser.add_argument(
        "--device",
        default="h100",
        help="simulated device: h100, h200, a100-80gb, l4, or measured[:FILE] (a calibration)",
    )
    parser.add_argument(
        "--devices",
        type=int,
        default=1,
        help="tensor-parallel devices, as ideal scaling (C, BW and memory times N)",
    )
    parser.add_argument("--dtype", default="bf16", help="weights and KV: bf16, fp16, fp32, fp8")
    parser.add_argument(
        "--seed", type=int, default=None, help="override the workload's seed (and the sampler's)"
    )
    parser.add_argument(
        "--drain-s", type=float, default=10.0, help="simulated seconds after the workload ends"
    )


def add_simulate_arguments(parser: argparse.ArgumentParser) -> None:
    """`mixgate bench simulate`."""
    parser.add_argument("--workload", required=True, help="a builtin name or a TOML file")
    parser.add_argument(
        "--model",
        required=True,
        help="model folder, config.json, preset (tiny, small, 100m) or bench/configs name",
    )
    parser.add_argument("--out", required=True, help="results folder")
    parser.add_argument("--envelope", default=None, help="envelope TOML (default: built-in)")
    parser.add_argument("--policy", default="mixgate", help="mixgate, priority or fcfs")
    parser.add_argument("--duration-s", type=float, default=None, help="override the workload's")
    parser.add_argument(
        "--rate-scale", type=float, default=1.0, help="multiply arrival rates and backlog counts"
    )
    add_simulation_flags(parser, switch=False)
