"""`mixgate bench breakdown`'s flags, apart from the benchmark itself.

NOTE: the CLI builds every parser at start, `mixgate serve` included; importing the benchmark
here would load torch (through bench.live.compare) into every gateway process and slow its exit.
"""

from __future__ import annotations

import argparse

DEFAULT_WORKLOAD = "chat-over-backlog"


def add_breakdown_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", default=DEFAULT_WORKLOAD, help="a builtin name or TOML")
    parser.add_argument("--out", required=True, help="results folder")
    parser.add_argument("--model", default=None, help="model folder (default: make --preset)")
    parser.add_argument("--preset", default="small", help="preset made when --model is not given")
    parser.add_argument("--redis-url", default=None, help="default: a throwaway redis-server")
    parser.add_argument("--threads", type=int, default=2, help="server torch threads")
    parser.add_argument("--duration-s", type=float, default=None, help="override the workload's")
    parser.add_argument("--policy", default="mixgate", help="the server's scheduling policy")
    parser.add_argument(
        "--engine",
        choices=("native", "vllm"),
        default="native",
        help="the server's engine (vllm: start it from .venv-vllm/bin/python)",
    )
    parser.add_argument("--envelope", default=None, help="envelope TOML for the server")
    parser.add_argument("--drain-s", type=float, default=10.0, help="wait after the schedule")
    parser.add_argument("--json", default=None, help="default: OUT/breakdown.json")
