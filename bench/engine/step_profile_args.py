"""`mixgate bench step-profile`'s arguments (no torch import: `mixgate --help` stays fast)."""

from __future__ import annotations

import argparse

__all__ = ["add_step_profile_arguments"]


def add_step_profile_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model folder")
    parser.add_argument("--batch-sizes", default="8,32")
    parser.add_argument("--context", type=int, default=512, help="prompt tokens per sequence")
    parser.add_argument("--steps", type=int, default=10, help="profiled decode steps")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the result here")
    parser.add_argument(
        "--decode-graphs",
        choices=("auto", "off"),
        default="auto",
        help="pure-decode steps as CUDA graphs on a GPU (the engine's default), or eager",
    )
    # BenchConfig's other fields: no throughput comparison here.
    parser.set_defaults(throughput_batches="")
