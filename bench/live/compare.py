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

``--repeats N`` runs the whole comparison N times, the policy order rotated each time
(bench/live/repeats.py), and reports the median of every number per policy, plus each policy's
ratios to the peer policy (``--peer``, default the first) taken within each repeat; the runs of
repeat r go to OUT/rep{r}/ (OUT/ itself when N is 1).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.live.repeats import median_tree, paired_ratios, rotated
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
    repeats = int(getattr(args, "repeats", 1) or 1)
    if repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    peer = getattr(args, "peer", None) or policies[0]
    if peer not in policies:
        raise SystemExit(f"--peer {peer!r} is not one of --policies")
    runs: list[list[dict[str, Any]]] = []
    with runner_from_args(args, out) as runner:
        for policy in policies:
            runner.check_policy(policy)
        workload = runner.load_workload(args.workload)
        if args.duration_s is not None:
            workload = replace(workload, duration_s=args.duration_s)
        for repeat in range(repeats):
            folder = out if repeats == 1 else out / f"rep{repeat}"
            order = rotated(policies, repeat)
            by_policy = {
                row["policy"]: row
                for row in compare_policies(runner, workload, order, folder, slo_path)
            }
            runs.append([by_policy[policy] for policy in policies])
    # Every repeat has one row per policy, in --policies order.
    per_policy = zip(*runs, strict=True)
    rows = runs[0] if repeats == 1 else [median_tree(list(group)) for group in per_policy]
    simulated = " (simulated)" if runner.simulated else ""
    document: Any = rows
    title = f"# {workload.name}{simulated}: {', '.join(policies)}"
    body = render_comparison(rows)
    if repeats > 1:
        paired = paired_ratios(runs, peer)
        document = {
            "repeats": repeats,
            "peer": peer,
            "median": rows,
            "paired": paired,
            "runs": runs,
        }
        title += f" (medians of {repeats} repeats, policy order rotated)"
        body += "\n\n" + _paired_markdown(paired, peer)
    (out / "comparison.json").write_text(json.dumps(document, indent=2) + "\n")
    (out / "comparison.md").write_text(f"{title}\n\n{body}")
    plot_vs_load(
        [{"policy": r["policy"], "offered_load": 1.0, **r["summary"]} for r in rows], out / "vs_"
    )
    _print(rows)
    print(f"results in {out}{simulated}")
    return 0


def _paired_markdown(paired: dict[str, dict[str, Any]], peer: str) -> str:
    lines = [
        f"Ratios to {peer}, paired within each repeat (median; each repeat's in brackets):",
        "",
        "| policy | chat TTFT p99 | chat ITL p99 | bulk tokens/s |",
        "|---|---|---|---|",
    ]
    for policy, entry in paired.items():
        cells = []
        for name in ("chat_ttft_p99", "chat_itl_p99", "bulk_output_tokens_per_s"):
            block = entry[name]
            each = ", ".join("-" if r is None else f"{r:.2f}" for r in block["per_repeat"])
            cells.append(f"{_x(block['median'])} [{each}]")
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


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
