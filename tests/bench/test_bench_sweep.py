"""`mixgate bench sweep` then `mixgate envelope derive`, end to end on the tiny preset: two
load points, an envelope that meets a (lenient) SLO, and the provenance that says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from mixgate.cli import main
from policies.envelope import load_envelope
from tests.bench.test_bench_compare import TINY_WORKLOAD

LENIENT_SLO = """
headroom = 0.2
max_rejection_rate = 0.5

[[target]]
class = "interactive"
metric = "ttft_s"
percentile = 99
max = 30.0
"""


@pytest.mark.slow
@pytest.mark.redis
def test_sweep_then_derive(tiny_model_dir: Path, redis_server: str, tmp_path: Path) -> None:
    workload = tmp_path / "tiny.toml"
    workload.write_text(TINY_WORKLOAD.replace('name = "tiny-mixed"', 'name = "tiny-sweep"'))
    out = tmp_path / "sweep"
    assert (
        main(
            [
                "bench",
                "sweep",
                "--workload",
                str(workload),
                "--out",
                str(out),
                "--model",
                str(tiny_model_dir),
                "--redis-url",
                redis_server,
                "--loads",
                "0.5,1",
                "--max-active-seqs",
                "8",
                "--step-token-budgets",
                "64",
                "--bulk-prefill-chunks",
                "32",
                "--duration-s",
                "2",
            ]
        )
        == 0
    )
    points = sorted(p.name for p in out.glob("point-*"))
    assert points == ["point-000", "point-001"]
    assert all((out / p / "summary.json").is_file() for p in points)
    assert (out / "sweep_ttft_p99_vs_load.png").is_file()

    slo = tmp_path / "slo.toml"
    slo.write_text(LENIENT_SLO)
    envelope_path = tmp_path / "envelope.toml"
    assert (
        main(["envelope", "derive", str(out), "--slo", str(slo), "--out", str(envelope_path)]) == 0
    )
    envelope = load_envelope(envelope_path.read_text())
    assert envelope.max_active_seqs == 8 and envelope.step_token_budget == 64
    assert envelope.bulk_prefill_chunk_tokens == 32
    assert envelope.provenance.source == "sweep"
    assert envelope.provenance.workload == "tiny-sweep"
