"""`mixgate bench simulate`, `bench sweep --simulate` and `bench compare --simulate` write the
live runs' folders: the summary, report, plots and `mixgate envelope derive` read them."""

from __future__ import annotations

import json
from pathlib import Path

from bench.report.run_folder import RUN_FILES, read_run_folder
from bench.report.summary import summarize
from mixgate.cli import main
from policies.envelope import load_envelope
from tests.bench.test_bench_sweep import LENIENT_SLO

WORKLOAD = """
name = "sim-cli-mix"
duration_s = 3.0
seed = 2

[interactive]
arrival = {kind = "poisson", rate_per_s = 20.0}
prompt_tokens = {kind = "uniform", min = 16, max = 300}
output_tokens = {kind = "uniform", min = 4, max = 32}

[bulk]
arrival = {kind = "backlog", count = 40}
prompt_tokens = {kind = "uniform", min = 200, max = 600}
output_tokens = {kind = "uniform", min = 8, max = 64}
"""
# A device and model whose steps take milliseconds, so a few seconds of load queue up.
TARGET = ["--model", "100m", "--device", "l4", "--dtype", "fp32", "--drain-s", "2"]


def _workload(tmp_path: Path) -> str:
    path = tmp_path / "workload.toml"
    path.write_text(WORKLOAD)
    return str(path)


def test_simulate_writes_a_run_folder_the_readers_accept(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["bench", "simulate", "--workload", _workload(tmp_path), "--out", str(out), *TARGET]
    assert main(argv) == 0
    assert all((out / name).is_file() for name in RUN_FILES)
    run = read_run_folder(out)
    # The summary is bench.report.summary's over the records it wrote, nothing simulator-specific.
    recomputed = summarize(run.records, run.summary["duration_s"])
    assert recomputed["classes"] == run.summary["classes"]
    chat = run.summary["classes"]["interactive"]
    assert chat["count"] > 30 and chat["ttft_s"]["p99"] > 0 and chat["itl_s"]["p50"] > 0
    assert run.summary["classes"]["bulk"]["output_tokens"] > 0
    assert run.samples and run.samples[-1].steps > 0
    assert run.config["simulated"] is True
    assert run.config["simulation"]["devices"] == 1
    assert "ideal" in run.config["simulation"]["scaling"]
    assert run.config["envelope"]["max_active_seqs"] == 32  # the built-in default
    assert "(simulated)" in (out / "report.md").read_text()


def test_simulated_sweep_derives_an_envelope(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    argv = ["bench", "sweep", "--simulate", "--workload", _workload(tmp_path), "--out", str(out)]
    argv += ["--loads", "0.5,1", "--max-active-seqs", "8", "--step-token-budgets", "64,256"]
    assert main([*argv, *TARGET, "--jobs", "2"]) == 0
    points = json.loads((out / "sweep.json").read_text())
    assert [(p["policy"], p["offered_load"]) for p in points] == [
        ("seqs=8 budget=64", 0.5),
        ("seqs=8 budget=64", 1.0),
        ("seqs=8 budget=256", 0.5),
        ("seqs=8 budget=256", 1.0),
    ]
    assert (out / "sweep_ttft_p99_vs_load.png").is_file()
    slo = tmp_path / "slo.toml"
    slo.write_text(LENIENT_SLO)
    envelope_path = tmp_path / "envelope.toml"
    assert (
        main(["envelope", "derive", str(out), "--slo", str(slo), "--out", str(envelope_path)]) == 0
    )
    envelope = load_envelope(envelope_path.read_text())
    assert envelope.max_active_seqs == 8 and envelope.step_token_budget in (64, 256)
    assert envelope.provenance.source == "sweep"
    assert envelope.provenance.workload == "sim-cli-mix"


def test_simulated_compare_puts_policies_side_by_side(tmp_path: Path) -> None:
    out = tmp_path / "compare"
    argv = ["bench", "compare", "--simulate", "--workload", _workload(tmp_path), "--out", str(out)]
    assert main([*argv, "--policies", "fcfs,mixgate", *TARGET]) == 0
    rows = json.loads((out / "comparison.json").read_text())
    assert [row["policy"] for row in rows] == ["fcfs", "mixgate"]
    for row in rows:
        assert row["ratios"]["interactive_ttft_p99_ratio"] is not None
        assert set(row["alone"]) == {"chat-alone", "bulk-alone"}
    for policy in ("fcfs", "mixgate"):
        assert read_run_folder(out / policy / "mixed").config["policy"] == policy


def test_simulated_compare_with_repeats_reports_medians_and_paired_ratios(tmp_path: Path) -> None:
    out = tmp_path / "compare"
    argv = ["bench", "compare", "--simulate", "--workload", _workload(tmp_path), "--out", str(out)]
    argv += ["--policies", "fcfs,mixgate", "--repeats", "2", "--peer", "fcfs", *TARGET]
    assert main(argv) == 0
    document = json.loads((out / "comparison.json").read_text())
    assert document["repeats"] == 2 and document["peer"] == "fcfs"
    # Each repeat's runs in a folder of its own, both policies in each.
    for repeat in (0, 1):
        for policy in ("fcfs", "mixgate"):
            folder = out / f"rep{repeat}" / policy / "mixed"
            assert read_run_folder(folder).config["policy"] == policy
    # Rows in --policies order whatever order a repeat ran them in.
    assert [[row["policy"] for row in run] for run in document["runs"]] == [["fcfs", "mixgate"]] * 2
    assert [row["policy"] for row in document["median"]] == ["fcfs", "mixgate"]
    # Virtual time: both repeats measure the same, so the median is each repeat's number.
    first = document["runs"][0][1]["summary"]["classes"]["interactive"]["ttft_s"]["p99"]
    assert document["median"][1]["summary"]["classes"]["interactive"]["ttft_s"]["p99"] == first
    ttft = document["paired"]["mixgate"]["chat_ttft_p99"]
    assert len(ttft["per_repeat"]) == 2 and ttft["median"] == ttft["per_repeat"][0]
    assert "fcfs" not in document["paired"]
    assert "paired within each repeat" in (out / "comparison.md").read_text()
