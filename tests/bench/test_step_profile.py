"""`mixgate bench step-profile` end to end on the tiny model (CPU: no kernel times)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mixgate.cli import main


def test_step_profile_writes_each_batch_and_its_top_operators(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "profile.json"
    argv = ["bench", "step-profile", "--model", str(tiny_model_dir), "--batch-sizes", "1,3",
            "--context", "20", "--steps", "3", "--threads", "1", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["decode_graphs"] is None
    assert [row["batch"] for row in result["rows"]] == [1, 3]
    for row in result["rows"]:
        assert row["step_ms"] > 0
        # No GPU: no kernel time, no launches, no device table.
        assert row["kernel_ms_per_step"] is None and row["top_by_device"] == []
        names = [op["name"] for op in row["top_by_host"]]
        assert names and all(op["calls_per_step"] > 0 for op in row["top_by_host"])
        assert any(name.startswith("aten::") for name in names)
    assert "decode step profile (cpu, float32)" in capsys.readouterr().out
