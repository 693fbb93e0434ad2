"""`mixgate bench gateway`'s flags (kept beside the bench so that adding one touches one file)."""

from __future__ import annotations

import argparse


def add_gateway_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--redis-url", default=None, help="default: a throwaway redis-server")
    parser.add_argument("--admissions", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    # 400: the p99 is the 4th slowest chat of each side, not the 2nd.
    parser.add_argument("--chats", type=int, default=400, help="timed chats on each side")
    # 3 rounds of 3,000: all of them stay under the default envelope's bulk queue bound
    # (10,000), which the submissions fill since the bench server runs no bulk.
    parser.add_argument(
        "--submissions", type=int, default=3000, help="jobs posted through HTTP per round, timed"
    )
    parser.add_argument(
        "--polls", type=int, default=20000, help="job status polls per round, timed"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of admissions, submissions and polls; their rates are the medians",
    )
    parser.add_argument(
        "--connections", type=int, default=64, help="keep-alive connections for jobs and polls"
    )
    parser.add_argument(
        "--command-chats",
        type=int,
        default=32,
        help="streamed chats whose Redis commands are counted (the count is per chat)",
    )
    parser.add_argument(
        "--command-idle-s",
        type=float,
        default=10.0,
        help="idle window before the counted chats: the replica's own rate, subtracted",
    )
    parser.add_argument("--json", default=None, help="write results here")
