"""`mixgate bench sweep`: offered load × engine knobs, one run per point, on any runner
(bench/live/runners.py: a live server per point, or `--simulate`: virtual time, points in
`--jobs` processes).

Each point is a run folder whose config.json carries `sweep_point` (the load factor and the
knobs), which is what `mixgate envelope derive` reads to pick the operating envelope.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import time
from pathlib import Path
from typing import Any

from bench.live.runners import Runner, RunPoint, runner_from_args
from bench.load.workload import Workload
from bench.report.plots import plot_vs_load
from policies.envelope import Envelope, dump_envelope


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def point_envelope(
    base: Envelope, max_active: int, budget: int, bulk_chunk_tokens: int | None = None
) -> Envelope:
    """The envelope of one sweep point: the base with the point's knobs."""
    chunk = base.bulk_prefill_chunk_tokens if bulk_chunk_tokens is None else bulk_chunk_tokens
    return dataclasses.replace(
        base,
        max_active_seqs=max_active,
        step_token_budget=budget,
        bulk_prefill_chunk_tokens=min(chunk, budget),
        interactive_reserved_seqs=min(base.interactive_reserved_seqs, max_active - 1),
    )


def sweep_points(
    runner: Runner, workload: Workload, args: argparse.Namespace, out: Path
) -> list[dict[str, Any]]:
    """Every (max_active_seqs, budget, bulk chunk) x load point, its folder and envelope file
    written, run on the runner: the sweep's rows, labelled by their knobs."""
    chunks: list[int | None] = list(_ints(getattr(args, "bulk_prefill_chunks", ""))) or [None]
    knobs = list(
        itertools.product(_ints(args.max_active_seqs), _ints(args.step_token_budgets), chunks)
    )
    labelled: list[tuple[str, float, RunPoint]] = []
    for index, ((max_active, budget, chunk), load) in enumerate(
        itertools.product(knobs, _floats(args.loads))
    ):
        envelope = point_envelope(runner.base_envelope, max_active, budget, chunk)
        folder = out / f"point-{index:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        envelope_file = folder / "envelope.toml"
        envelope_file.write_text(dump_envelope(envelope))
        point_knobs = {
            "max_active_seqs": max_active,
            "step_token_budget": budget,
            "bulk_prefill_chunk_tokens": envelope.bulk_prefill_chunk_tokens,
        }
        sweep_point = {"offered_load": load, "knobs": point_knobs, "workload": workload.name}
        point = RunPoint(
            args.policy,
            workload.scaled(load),
            folder,
            f"{workload.name} x{load:g}, max_active_seqs={max_active}, budget={budget}, "
            f"bulk chunk={envelope.bulk_prefill_chunk_tokens}",
            {"sweep_point": sweep_point},
            envelope_file=envelope_file,
        )
        label = f"seqs={max_active} budget={budget}"
        if chunk is not None:
            label += f" chunk={envelope.bulk_prefill_chunk_tokens}"
        labelled.append((label, load, point))
    summaries = runner.run_all([point for _, _, point in labelled])
    return [
        {"policy": label, "offered_load": load, **summary}
        for (label, load, _), summary in zip(labelled, summaries, strict=True)
    ]


def run_sweep(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with runner_from_args(args, out) as runner:
        runner.check_policy(args.policy)
        workload = runner.load_workload(args.workload)
        if args.duration_s is not None:
            workload = dataclasses.replace(workload, duration_s=args.duration_s)
        points = sweep_points(runner, workload, args, out)
    (out / "sweep.json").write_text(json.dumps(points, indent=2) + "\n")
    plot_vs_load(points, out / "sweep_")
    kind = "simulated points" if runner.simulated else "points"
    wall_s = time.perf_counter() - started
    print(
        f"{len(points)} {kind} in {out} ({wall_s:.1f} s); "
        f"next: mixgate envelope derive {out} --slo SLO.toml"
    )
    return 0
