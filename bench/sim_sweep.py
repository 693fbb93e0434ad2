"""`mixgate bench sweep --simulate`: the sweep's points in virtual time, a few at once.

The same points, folders and files as the live sweep (bench/sweep.py), so `mixgate envelope
derive` reads the result unchanged; each point is a `bench.simulate.run_simulated` run. Points
are independent, so they run in `--jobs` processes (forked: the imports are paid once).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from bench.plots import plot_vs_load
from bench.sim_workloads import load_sim_workload
from bench.simulate import SimSpec, run_simulated, sim_spec_from_args
from bench.sweep import _floats, _ints, point_envelope
from bench.workload import Workload
from policies.envelope import Envelope, dump_envelope

__all__ = ["run_simulated_sweep"]


def _run_point(
    spec: SimSpec, workload: Workload, folder: Path, title: str, extra: dict[str, Any]
) -> dict[str, Any]:
    return run_simulated(spec, workload, folder, title, extra)


def run_simulated_sweep(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workload = load_sim_workload(args.workload)
    if args.duration_s is not None:
        workload = dataclasses.replace(workload, duration_s=args.duration_s)
    spec = sim_spec_from_args(args, args.model or args.preset)
    base = spec.envelope or Envelope.default()
    knobs = list(itertools.product(_ints(args.max_active_seqs), _ints(args.step_token_budgets)))
    jobs: list[tuple[str, float, tuple[Any, ...]]] = []
    for index, ((max_active, budget), load) in enumerate(
        itertools.product(knobs, _floats(args.loads))
    ):
        envelope = point_envelope(base, max_active, budget)
        folder = out / f"point-{index:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "envelope.toml").write_text(dump_envelope(envelope))
        point_knobs = {
            "max_active_seqs": max_active,
            "step_token_budget": budget,
            "bulk_prefill_chunk_tokens": envelope.bulk_prefill_chunk_tokens,
        }
        extra = {
            "sweep_point": {"offered_load": load, "knobs": point_knobs, "workload": workload.name}
        }
        title = f"{workload.name} x{load:g}, max_active_seqs={max_active}, budget={budget}"
        point_spec = dataclasses.replace(spec, envelope=envelope)
        label = f"seqs={max_active} budget={budget}"
        jobs.append((label, load, (point_spec, workload.scaled(load), folder, title, extra)))
    workers = max(1, min(args.jobs or os.cpu_count() or 1, len(jobs)))
    if workers == 1:
        summaries = [_run_point(*job) for _, _, job in jobs]
    else:
        # NOTE: fork, so workers inherit the imported modules (torch, matplotlib) instead of
        # importing them again; nothing here has started threads yet.
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(workers, mp_context=context) as pool:
            summaries = list(pool.map(_run_point, *zip(*(job for _, _, job in jobs), strict=True)))
    points = [
        {"policy": label, "offered_load": load, **summary}
        for (label, load, _), summary in zip(jobs, summaries, strict=True)
    ]
    (out / "sweep.json").write_text(json.dumps(points, indent=2) + "\n")
    plot_vs_load(points, out / "sweep_")
    wall_s = time.perf_counter() - started
    print(
        f"{len(points)} simulated points in {out} ({wall_s:.1f} s, {workers} processes); "
        f"next: mixgate envelope derive {out} --slo SLO.toml"
    )
    return 0
