"""`mixgate bench sweep`: offered load × engine knobs, one live run per point.

Each point is a run folder whose config.json carries `sweep_point` (the load factor and the
knobs), which is what `mixgate envelope derive` reads to pick the operating envelope.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

from bench.compare import ensure_model
from bench.live_run import RunSpec, run_live
from bench.plots import plot_vs_load
from bench.processes import redis_url
from bench.workload import load_workload
from policies.envelope import Envelope, dump_envelope


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def point_envelope(base: Envelope, max_active: int, budget: int) -> Envelope:
    """The envelope of one sweep point: the base with the point's knobs."""
    return dataclasses.replace(
        base,
        max_active_seqs=max_active,
        step_token_budget=budget,
        bulk_prefill_chunk_tokens=min(base.bulk_prefill_chunk_tokens, budget),
        interactive_reserved_seqs=min(base.interactive_reserved_seqs, max_active - 1),
    )


def run_sweep(args: argparse.Namespace) -> int:
    if getattr(args, "simulate", False):
        from bench.sim_sweep import run_simulated_sweep  # virtual time, no server

        return run_simulated_sweep(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workload = load_workload(args.workload)
    if args.duration_s is not None:
        workload = dataclasses.replace(workload, duration_s=args.duration_s)
    model_dir = ensure_model(args.model, out, args.preset)
    base = Envelope.default()
    knobs = list(itertools.product(_ints(args.max_active_seqs), _ints(args.step_token_budgets)))
    points: list[dict[str, Any]] = []
    with redis_url(args.redis_url, out / "redis") as url:
        for index, ((max_active, budget), load) in enumerate(
            itertools.product(knobs, _floats(args.loads))
        ):
            envelope = point_envelope(base, max_active, budget)
            folder = out / f"point-{index:03d}"
            folder.mkdir(parents=True, exist_ok=True)
            envelope_path = folder / "envelope.toml"
            envelope_path.write_text(dump_envelope(envelope))
            spec = RunSpec(
                model_dir, url, args.policy, threads=args.threads, envelope_path=envelope_path
            )
            point_knobs = {
                "max_active_seqs": max_active,
                "step_token_budget": budget,
                "bulk_prefill_chunk_tokens": envelope.bulk_prefill_chunk_tokens,
            }
            summary = run_live(
                spec,
                workload.scaled(load),
                folder,
                f"{workload.name} x{load:g}, max_active_seqs={max_active}, budget={budget}",
                {
                    "sweep_point": {
                        "offered_load": load,
                        "knobs": point_knobs,
                        "workload": workload.name,
                    }
                },
            )
            label = f"seqs={max_active} budget={budget}"
            points.append({"policy": label, "offered_load": load, **summary})
    (out / "sweep.json").write_text(json.dumps(points, indent=2) + "\n")
    plot_vs_load(points, out / "sweep_")
    print(f"{len(points)} points in {out}; next: mixgate envelope derive {out} --slo SLO.toml")
    return 0
