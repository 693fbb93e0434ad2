"""Calibration: the least-squares fit recovers known rates from exact rows, and
`mixgate plan calibrate` runs on the tiny model end to end and writes a file the planner reads.
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

import pytest

from bench.engine.calibrate import run_calibrate
from bench.engine.calibrate_args import add_calibrate_arguments
from engine.model.presets import preset_configs
from planning.calibration_file import load_rates, resolve_device
from planning.costmodel import HardwareRates
from planning.costmodel_fit import FitRow, fit_rates, row_estimate
from planning.model_shape_from_config import shape_from_hf_config
from planning.plan_command import load_model_config
from planning.planner import make_plan

SHAPE = shape_from_hf_config(load_model_config("100m", preset_configs()), dtype_bytes=4)
ROW_SHAPES = [(0, 1), (0, 4), (0, 16), (0, 32), (64, 0), (256, 0), (56, 8), (248, 8)]


def _rows(truth: HardwareRates, context: int = 128) -> list[FitRow]:
    rows = []
    for prefill, decodes in ROW_SHAPES:
        probe = FitRow(prefill, decodes, context if decodes else 0, 1.0)
        rows.append(
            FitRow(prefill, decodes, probe.context_tokens, row_estimate(SHAPE, truth, probe).step_s)
        )
    return rows


@pytest.mark.parametrize("overlap", [0.0, 0.5, 1.0])
def test_fit_recovers_the_rates_that_made_the_rows(overlap: float) -> None:
    truth = HardwareRates(
        flops_per_s=8e10,
        bytes_per_s=2.5e10,
        source="truth",
        step_overhead_s=0.02,
        compute_memory_overlap=overlap,
        kv_bytes_per_s=6e9,
    )
    base = HardwareRates(flops_per_s=1.7e11, bytes_per_s=2.5e10, source="microbenchmark")
    fit = fit_rates(SHAPE, _rows(truth), base)
    assert fit.relative_rms < 1e-6
    assert fit.rates.compute_memory_overlap == overlap
    assert fit.rates.flops_per_s == pytest.approx(8e10, rel=1e-6)
    assert fit.rates.step_overhead_s == pytest.approx(0.02, rel=1e-6)
    assert fit.rates.effective_kv_bytes_per_s == pytest.approx(6e9, rel=1e-6)
    assert fit.rates.source == "microbenchmark"


def test_fit_needs_rows() -> None:
    base = HardwareRates(flops_per_s=1e11, bytes_per_s=1e10, source="x")
    with pytest.raises(ValueError):
        fit_rates(SHAPE, _rows(base)[:2], base)
    with pytest.raises(ValueError):
        FitRow(0, 0, 0, 1.0)


def test_plan_calibrate_on_the_tiny_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_calibrate_arguments(parser)
    out = tmp_path / "calibration.toml"
    args = parser.parse_args(
        [
            "--model",
            str(tiny_model_dir),
            "--threads",
            "1",
            "--rounds",
            "1",
            "--steps",
            "2",
            "--batch-sizes",
            "1,2,4",
            "--token-budgets",
            "8,24",
            "--mixed-decodes",
            "2",
            "--context",
            "16",
            "--matmul-size",
            "128",
            "--bandwidth-matrix-mb",
            "8",
            "--out",
            str(out),
        ]  # fmt: skip
    )
    assert run_calibrate(args) == 0
    content = tomllib.loads(out.read_text())
    rows = list(content["rows"].values())
    # 3 decode sizes + 2 prompt chunks alone + 2 beside 2 decodes.
    assert sorted((r["prefill_tokens"], r["decode_seqs"]) for r in rows) == [
        (0, 1), (0, 2), (0, 4), (6, 2), (8, 0), (22, 2), (24, 0)
    ]  # fmt: skip
    for row in rows:
        assert row["ratio"] == pytest.approx(row["measured_s"] / row["estimate_s"])
        assert row["measured_s"] > 0
    assert content["threads"] == 1 and content["dtype"] == "float32"
    rates = load_rates(out)
    assert rates.flops_per_s == content["flops_per_s"]
    # The planner takes the measured device like any preset.
    measured = resolve_device(f"measured:{out}")
    tiny = shape_from_hf_config(load_model_config(str(tiny_model_dir)), dtype_bytes=4)
    plan = make_plan(tiny, measured, context_tokens=64, itl_slo_s=1.0, batch_sizes=(1, 8))
    assert plan.rows[0].step_s >= rates.step_overhead_s
