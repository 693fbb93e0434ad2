"""`mixgate bench batch`'s flags, apart from the benchmark so that building the CLI parser
does not import the HTTP clients."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_SLO = Path(__file__).resolve().parents[1] / "slos" / "chat-over-backlog.toml"


def add_batch_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model folder (default: make --preset)")
    parser.add_argument("--preset", default="tiny", help="preset made when --model is not given")
    parser.add_argument("--redis-url", default=None, help="default: a throwaway redis-server")
    parser.add_argument("--threads", type=int, default=1, help="server torch threads")
    parser.add_argument("--lines", type=int, default=200, help="batch lines")
    parser.add_argument("--line-max-tokens", type=int, default=64)
    parser.add_argument("--chats", type=int, default=40, help="streamed chats per phase")
    parser.add_argument("--chat-max-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=2, help="chats in flight at once")
    parser.add_argument("--slo", default=str(DEFAULT_SLO), help="SLO TOML (interactive targets)")
    parser.add_argument("--json", default=None, help="write results here")
