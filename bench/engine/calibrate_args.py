"""Arguments of `mixgate plan calibrate`, apart from bench.engine.calibrate so that building the CLI
parser does not import torch and the engine (mixgate/cli.py keeps its imports lazy)."""

from __future__ import annotations

import argparse

from planning.calibration_file import DEFAULT_CALIBRATION_PATH

__all__ = ["add_calibrate_arguments"]


def add_calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="100m", help="model folder or preset (made in /tmp)")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    parser.add_argument("--context", type=int, default=128, help="decoders' prompt tokens")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32")
    parser.add_argument("--token-budgets", default="64,256", help="prompt-chunk step sizes")
    parser.add_argument("--mixed-decodes", type=int, default=8, help="decodes beside a chunk")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per row and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bandwidth-matrix-mb", type=int, default=None)
    parser.add_argument("--matmul-size", type=int, default=None, help="n of the C benchmark")
    parser.add_argument("--out", default=str(DEFAULT_CALIBRATION_PATH), help="calibration TOML")
    parser.add_argument("--json", default=None, help="also write the rows as JSON here")
