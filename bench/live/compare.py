"""`mixgate bench compare`: the same seeded workload under each policy, side by side, on any
runner (bench/live/runners.py: live servers, vLLM's, or `--simulate`: virtual time).

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
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.live.runners import Runner, RunPoint, ensure_model, runner_from_args
from bench.load.records import read_records
from bench.load.workload import Workload
from bench.report.plots import plot_vs_load
from bench.report.render import render_comparison
from bench.report.summary import goodput, headline_ratios
from planning.slo import DEFAULT_SLO_PATH, goodput_bounds
from policies.request_class import RequestClass

# NOTE: ensure_model is re-exported for its older callers (bench/gateway/breakdown.py).
__all__ = ["compare_policies", "ensure_model", "run_compare", "variants", "with_goodput"]

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


def compare_policies(
    runner: Runner, workload: Workload, policies: list[str], out: Path, slo_path: Path
) -> list[dict[str, Any]]:
    """Every variant of the workload under every policy, on one runner: the comparison's rows."""
    bounds = goodput_bounds(slo_path)
    rows: list[dict[str, Any]] = []
    for policy in policies:
        summaries: dict[str, dict[str, Any]] = {}
        for name, wl in variants(workload):
            folder = out / policy / name
            point = RunPoint(
                policy,
                wl,
                folder,
                f"{workload.name}: {name} under {policy}",
                {"variant": name, "workload_name": wl.name},
            )
            summaries[name] = with_goodput(runner.run(point), folder, bounds)
        rows.append(
            {
                "policy": policy,
                "summary": summaries["mixed"],
                "ratios": headline_ratios(
                    summaries["mixed"], summaries.get("chat-alone"), summaries.get("bulk-alone")
                ),
                "alone": {k: v for k, v in summaries.items() if k != "mixed"},
                "slo": {"path": str(slo_path), "goodput_bounds_s": bounds},
            }
        )
    return rows


def run_compare(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    slo_path = Path(getattr(args, "slo", None) or DEFAULT_SLO_PATH)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    with runner_from_args(args, out) as runner:
        for policy in policies:
            runner.check_policy(policy)
        workload = runner.load_workload(args.workload)
        if args.duration_s is not None:
            workload = replace(workload, duration_s=args.duration_s)
        rows = compare_policies(runner, workload, policies, out, slo_path)
    simulated = " (simulated)" if runner.simulated else ""
    (out / "comparison.json").write_text(json.dumps(rows, indent=2) + "\n")
    (out / "comparison.md").write_text(
        f"# {workload.name}{simulated}: {', '.join(policies)}\n\n" + render_comparison(rows)
    )
    plot_vs_load(
        [{"policy": r["policy"], "offered_load": 1.0, **r["summary"]} for r in rows], out / "vs_"
    )
    _print(rows)
    print(f"results in {out}{simulated}")
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
