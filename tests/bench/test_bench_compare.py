"""`mixgate bench compare` end to end, for a few seconds on the tiny preset: every file of the
results folder is written, for every variant of the policy run.

One live policy: each variant is a fresh server (three here, ~10 CPU-s each on a 2-vCPU Xeon with
the rest of the suite beside it; two policies took the test to its 120 s timeout in CI). Policies
side by side are tested through the same code by the simulated compare
(tests/bench/test_simulator_cli.py), and live by every `mixgate bench compare` run."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bench.report.run_folder import RUN_FILES
from mixgate.cli import main
from policies.envelope import Envelope, dump_envelope

TINY_WORKLOAD = """
name = "tiny-mixed"
description = "a second and a half of chat over a small bulk backlog"
duration_s = 1.5
seed = 7

[interactive]
arrival = { kind = "poisson", rate_per_s = 4.0 }
prompt_tokens = { kind = "uniform", min = 16, max = 48 }
output_tokens = { kind = "uniform", min = 4, max = 8 }

[bulk]
arrival = { kind = "backlog", count = 6 }
prompt_tokens = { kind = "uniform", min = 32, max = 64 }
output_tokens = { kind = "uniform", min = 4, max = 8 }
"""


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.timeout(300)
def test_compare_writes_every_file(tiny_model_dir: Path, redis_server: str, tmp_path: Path) -> None:
    workload = tmp_path / "tiny.toml"
    workload.write_text(TINY_WORKLOAD)
    # An envelope the live servers must run (a chunk no default has).
    envelope = tmp_path / "envelope.toml"
    envelope.write_text(
        dump_envelope(dataclasses.replace(Envelope.default(), bulk_prefill_chunk_tokens=24))
    )
    out = tmp_path / "out"
    code = main(
        [
            "bench",
            "compare",
            "--workload",
            str(workload),
            "--out",
            str(out),
            "--model",
            str(tiny_model_dir),
            "--redis-url",
            redis_server,
            "--policies",
            "mixgate",
            "--envelope",
            str(envelope),
        ]
    )
    assert code == 0
    for policy in ("mixgate",):
        for variant in ("mixed", "chat-alone", "bulk-alone"):
            folder = out / policy / variant
            missing = [name for name in RUN_FILES if not (folder / name).is_file()]
            assert not missing, f"{folder}: missing {missing}"
            summary = json.loads((folder / "summary.json").read_text())
            assert summary["overall"]["count"] > 0
            served = json.loads((folder / "config.json").read_text())["envelope"]
            assert served["bulk_prefill_chunk_tokens"] == 24, served
    rows = json.loads((out / "comparison.json").read_text())
    assert [r["policy"] for r in rows] == ["mixgate"]
    assert all(r["ratios"]["interactive_ttft_p99_ratio"] is not None for r in rows)
    # Goodput per class, counted with the default SLO's per-request bounds, in every phase.
    for row in rows:
        assert row["slo"]["goodput_bounds_s"] == {"interactive": {"ttft_s": 0.5, "itl_s": 0.1}}
        for summary in (row["summary"], *row["alone"].values()):
            for cls in ("interactive", "bulk"):
                block = summary["goodput"][cls]
                assert 0 <= block["good"] <= block["count"]
                assert block["goodput_per_s"] == block["good"] / summary["duration_s"]
        assert row["summary"]["goodput"]["interactive"]["count"] > 0
    assert "goodput (req/s)" in (out / "comparison.md").read_text()
    assert (out / "comparison.md").read_text().count("mixgate") >= 1
    assert sorted(p.name for p in out.glob("vs_*.png"))


def test_alone_phases_draw_fresh_prompts() -> None:
    from bench.live.compare import variants
    from bench.load.workload import load_workload

    workload = load_workload("chat-over-backlog")
    seeds = {name: wl.seed for name, wl in variants(workload)}
    # A prefix cache must not carry one phase's prompts into another: each phase its own seed.
    assert len(set(seeds.values())) == 3
    assert seeds["mixed"] == workload.seed
