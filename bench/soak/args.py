"""The flags of `mixgate bench soak` (kept apart so `mixgate --help` imports nothing heavy)."""

from __future__ import annotations

import argparse


def add_soak_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, required=True, help="how long to drive load")
    parser.add_argument("--url", default=None, help="a running server (default: start one)")
    parser.add_argument("--pid", type=int, default=None, help="its pid, for RSS (with --url)")
    parser.add_argument("--model", default=None, help="model folder (default: make --preset)")
    parser.add_argument("--preset", default="small", help="preset made when --model is not given")
    parser.add_argument("--redis-url", default=None, help="default: a throwaway redis-server")
    parser.add_argument("--threads", type=int, default=2, help="server torch threads")
    parser.add_argument(
        "--shape",
        choices=("chat-over-backlog", "short"),
        default="chat-over-backlog",
        help="request lengths: chat-over-backlog's (83-275-token chats of 32 tokens, "
        "769-1519-token jobs of 128) or short ones (for tests on the tiny model)",
    )
    parser.add_argument("--chat-rate", type=float, default=2.0, help="chat streams per second")
    parser.add_argument("--job-rate", type=float, default=1.0, help="bulk jobs per second")
    parser.add_argument("--cancel-fraction", type=float, default=0.2, help="cancelled mid-way")
    parser.add_argument("--sample-s", type=float, default=None, help="default: 30 samples")
    parser.add_argument("--settle-s", type=float, default=30.0, help="wait for idle at the end")
    parser.add_argument(
        "--max-rss-growth-mb", type=float, default=32.0, help="RSS growth allowed (2nd half)"
    )
    parser.add_argument("--json", default=None, help="write the samples and verdict here")
