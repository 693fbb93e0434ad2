"""`mixgate bench compare`: the same seeded workload under each policy, side by side.

Per policy it runs the workload as given ("mixed"), and each class alone ("chat-alone",
"bulk-alone"), so the headline ratios say what sharing the engine costs each class:
interactive TTFT p99 and ITL p99 under the bulk load over chat alone, and bulk tokens/s
under the chat load over bulk alone. Each phase draws its own prompts (the alone phases run
with other seeds): a server whose prefix cache outlived a phase, or a reused one, would
otherwise answer the next phase from its cache.

Goodput per class (requests per second whose own TTFT and mean ITL met the ``--slo`` file's
bounds, as vLLM's benchmark and AIPerf count it) goes into each summary as ``"goodput"``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.live_run import RunSpec, run_live
from bench.plots import plot_vs_load
from bench.processes import redis_url
from bench.records import read_records
from bench.report import render_comparison
from bench.slo import DEFAULT_SLO_PATH, goodput_bounds
from bench.summary import goodput, headline_ratios
from bench.vllm_baseline import is_vllm_policy, run_policy
from bench.workload import Workload, load_workload
from engine.make_model import make_model
from policies.request_class import RequestClass
from policies.scheduling_policy import SchedulingPolicy


class _Named(str):
    """A policy that is only a name (the vLLM ones), with `.value` like the enum's."""

    @property
    def value(self) -> str:
        return str(self)


def ensure_model(model: str | None, out: Path, preset: str) -> Path:
    if model is not None:
        return Path(model)
    model_dir = out / "model"
    if not (model_dir / "config.json").is_file():
        make_model(model_dir, preset, seed=0)
    return model_dir


# Seed offsets of the alone phases: fresh prompts per phase (FIELD-NOTES: a phase that reused
# another's prompts measured vLLM's prefix cache, not its scheduler).
ALONE_SEED_OFFSETS = {"chat-alone": 1, "bulk-alone": 2}


def variants(workload: Workload) -> list[tuple[str, Workload]]:
    runs = [("mixed", workload)]
    if len(workload.classes) == 2:
        for name, cls in (
            ("chat-alone", RequestClass.INTERACTIVE),
            ("bulk-alone", RequestClass.BULK),
        ):
            alone = workload.only(cls)
            runs.append((name, replace(alone, seed=workload.seed + ALONE_SEED_OFFSETS[name])))
    return runs


def with_goodput(
    summary: dict[str, Any], folder: Path, bounds: dict[str, dict[str, float]]
) -> dict[str, Any]:
    """The summary plus ``"goodput"`` per class, counted from the run folder's records."""
    records = read_records(folder / "requests.jsonl")
    return {**summary, "goodput": goodput(records, summary["duration_s"], bounds)}


def run_compare(args: argparse.Namespace) -> int:
    if getattr(args, "simulate", False):
        from bench.sim_compare import run_simulated_compare  # virtual time, no server

        return run_simulated_compare(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workload = load_workload(args.workload)
    if args.duration_s is not None:
        workload = replace(workload, duration_s=args.duration_s)
    # NOTE: the vLLM policies (bench/vllm_baseline.py) are names, not engine presets.
    names = [p.strip() for p in args.policies.split(",")]
    policies = [_Named(n) if is_vllm_policy(n) else SchedulingPolicy(n) for n in names]
    model_dir = ensure_model(args.model, out, args.preset)
    slo_path = Path(getattr(args, "slo", None) or DEFAULT_SLO_PATH)
    bounds = goodput_bounds(slo_path)
    rows: list[dict[str, Any]] = []
    with redis_url(args.redis_url, out / "redis") as url:
        for policy in policies:
            spec = RunSpec(model_dir, url, policy.value, threads=args.threads)
            run = partial(run_policy, policy.value) if is_vllm_policy(policy.value) else run_live
            summaries = {
                name: with_goodput(
                    run(
                        spec,
                        wl,
                        out / policy.value / name,
                        f"{workload.name}: {name} under {policy.value}",
                        {"variant": name, "workload_name": wl.name},
                    ),
                    out / policy.value / name,
                    bounds,
                )
                for name, wl in variants(workload)
            }
            ratios = headline_ratios(
                summaries["mixed"], summaries.get("chat-alone"), summaries.get("bulk-alone")
            )
            rows.append(
                {
                    "policy": policy.value,
                    "summary": summaries["mixed"],
                    "ratios": ratios,
                    "alone": {k: v for k, v in summaries.items() if k != "mixed"},
                    "slo": {"path": str(slo_path), "goodput_bounds_s": bounds},
                }
            )
    (out / "comparison.json").write_text(json.dumps(rows, indent=2) + "\n")
    (out / "comparison.md").write_text(
        f"# {workload.name}: {', '.join(p.value for p in policies)}\n\n" + render_comparison(rows)
    )
    plot_vs_load(
        [{"policy": r["policy"], "offered_load": 1.0, **r["summary"]} for r in rows], out / "vs_"
    )
    _print(rows)
    print(f"results in {out}")
    return 0


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def _x(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _per_s(summary: dict[str, Any], request_class: str) -> str:
    block = (summary.get("goodput") or {}).get(request_class) or {}
    value = block.get("goodput_per_s")
    return "-" if value is None else f"{value:.2f}"


def _print(rows: list[dict[str, Any]]) -> None:
    table = Table(title="interactive under the bulk load vs chat alone; bulk vs bulk alone")
    for column in (
        "policy",
        "chat TTFT p50",
        "chat TTFT p99",
        "chat ITL p99",
        "bulk tok/s",
        "bulk tok/busy s",
        "chat rejected",
        "chat goodput/s",
        "bulk goodput/s",
        "TTFT p99 ratio",
        "ITL p99 ratio",
        "bulk tok/s ratio",
        "bulk tok/busy s ratio",
    ):
        table.add_column(column, justify="right")
    for row in rows:
        classes = row["summary"]["classes"]
        chat, bulk = classes.get("interactive", {}), classes.get("bulk", {})
        ratios = row["ratios"]
        table.add_row(
            row["policy"],
            _ms((chat.get("ttft_s") or {}).get("p50")),
            _ms((chat.get("ttft_s") or {}).get("p99")),
            _ms((chat.get("itl_s") or {}).get("p99")),
            f"{bulk.get('output_tokens_per_s') or 0:.0f}",
            f"{bulk.get('output_tokens_per_busy_s') or 0:.0f}",
            f"{chat.get('rejection_rate') or 0:.1%}",
            _per_s(row["summary"], "interactive"),
            _per_s(row["summary"], "bulk"),
            _x(ratios.get("interactive_ttft_p99_ratio")),
            _x(ratios.get("interactive_itl_p99_ratio")),
            _x(ratios.get("bulk_tokens_per_s_ratio")),
            _x(ratios.get("bulk_busy_tokens_per_s_ratio")),
        )
    # Wide enough that a log file keeps every column whole (rich wraps to the terminal).
    Console(width=220).print(table)
