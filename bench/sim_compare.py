"""`mixgate bench compare --simulate`: the policies side by side in virtual time.

The same runs (the workload, and each class alone), folders and headline ratios as the live
comparison (bench/compare.py); each run is a `bench.simulate.run_simulated` run. Only the
engine's own presets (mixgate, priority, fcfs) can be simulated: an external server cannot.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.compare import _print, variants
from bench.plots import plot_vs_load
from bench.report import render_comparison
from bench.sim_workloads import load_sim_workload
from bench.simulate import run_simulated, sim_spec_from_args
from bench.summary import headline_ratios
from policies.scheduling_policy import SchedulingPolicy

__all__ = ["run_simulated_compare"]


def _policies(text: str) -> list[SchedulingPolicy]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    known = {p.value for p in SchedulingPolicy}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"cannot simulate {unknown}: only {sorted(known)} run in the simulator")
    return [SchedulingPolicy(name) for name in names]


def run_simulated_compare(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workload = load_sim_workload(args.workload)
    if args.duration_s is not None:
        workload = replace(workload, duration_s=args.duration_s)
    policies = _policies(args.policies)
    base = sim_spec_from_args(args, args.model or args.preset)
    rows: list[dict[str, Any]] = []
    for policy in policies:
        spec = replace(base, policy=policy.value)
        summaries = {
            name: run_simulated(
                spec,
                wl,
                out / policy.value / name,
                f"{workload.name}: {name} under {policy.value}",
                {"variant": name, "workload_name": wl.name},
            )
            for name, wl in variants(workload)
        }
        rows.append(
            {
                "policy": policy.value,
                "summary": summaries["mixed"],
                "ratios": headline_ratios(
                    summaries["mixed"], summaries.get("chat-alone"), summaries.get("bulk-alone")
                ),
                "alone": {k: v for k, v in summaries.items() if k != "mixed"},
            }
        )
    (out / "comparison.json").write_text(json.dumps(rows, indent=2) + "\n")
    (out / "comparison.md").write_text(
        f"# {workload.name} (simulated): {', '.join(p.value for p in policies)}\n\n"
        + render_comparison(rows)
    )
    plot_vs_load(
        [{"policy": r["policy"], "offered_load": 1.0, **r["summary"]} for r in rows], out / "vs_"
    )
    _print(rows)
    print(f"results in {out} (simulated)")
    return 0
