"""bench.report.run_folder / plots / report on synthetic records and samples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bench.report.plots as plots_module
import bench.report.render as report_module
import bench.report.run_folder as run_folder_module
from bench.load.records import OK, REJECTED, MetricSample, RequestRecord
from bench.report.plots import VS_LOAD_FILES, plot_timeline, plot_vs_load
from bench.report.render import render_comparison, render_report
from bench.report.run_folder import RUN_FILES, read_run_folder, write_run_folder
from bench.report.summary import headline_ratios, summarize
from policies.envelope import Envelope

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
WORKLOAD_TOML = 'name = "mixed"\nduration_s = 10\n'


def _records() -> list[RequestRecord]:
    records = [
        RequestRecord(
            request_id=f"chat{i}",
            request_class="interactive",
            prompt_tokens=20,
            max_tokens=16,
            scheduled_s=0.5 * i,
            sent_s=0.5 * i,
            outcome=OK,
            status_code=200,
            queue_delay_s=0.005,
            ttft_s=0.05 + 0.01 * i,
            itls_s=[0.02, 0.03, 0.025],
            e2e_s=0.2 + 0.01 * i,
            output_tokens=4,
        )
        for i in range(10)
    ]
    records.append(
        RequestRecord(
            request_id="job0",
            request_class="bulk",
            prompt_tokens=500,
            max_tokens=100,
            scheduled_s=0.0,
            sent_s=0.0,
            outcome=OK,
            ttft_s=1.0,
            e2e_s=8.0,
            output_tokens=100,
        )
    )
    records.append(
        RequestRecord(
            request_id="job1",
            request_class="bulk",
            prompt_tokens=500,
            max_tokens=100,
            scheduled_s=1.0,
            sent_s=1.0,
            outcome=REJECTED,
            status_code=429,
            error_code="queue_full",
        )
    )
    return records


def _samples() -> list[MetricSample]:
    return [
        MetricSample(
            t_s=float(t),
            queue_depth={"interactive": float(t % 3), "bulk": float(10 - t)},
            running={"interactive": 1.0, "bulk": 2.0},
            kv_usage=t / 10,
        )
        for t in range(10)
    ]


def _is_png(path: Path) -> bool:
    data = path.read_bytes()
    return len(data) > 100 and data.startswith(PNG_MAGIC)


def test_all_exports_exist() -> None:
    for module in (plots_module, report_module, run_folder_module):
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"


def test_write_run_folder_writes_every_file(tmp_path: Path) -> None:
    records, samples = _records(), _samples()
    summary = summarize(records, duration_s=10.0)
    runtime_config = {
        "envelope": Envelope.default().to_dict(),
        "engine": {"block_size_tokens": 16},
        "model": {"preset": "tiny", "num_parameters": 1234},
        "hardware": {"gpu": "none"},
    }
    out = write_run_folder(
        tmp_path / "run",
        workload_toml=WORKLOAD_TOML,
        runtime_config=runtime_config,
        records=records,
        samples=samples,
        summary=summary,
        title="Mixed run",
    )
    for name in RUN_FILES:
        assert (out / name).is_file(), name
    assert _is_png(out / "kv_usage_and_queue_depth.png")

    config = json.loads((out / "config.json").read_text())
    assert config["envelope"]["max_active_seqs"] == Envelope.default().max_active_seqs
    assert config["model"]["preset"] == "tiny"
    # The caller's hardware facts are kept; this process's are added.
    assert config["hardware"]["gpu"] == "none"
    assert config["hardware"]["cpu_count"] >= 1
    assert config["versions"]["python"].count(".") == 2
    assert "git_revision" in config

    report = (out / "report.md").read_text()
    assert report.startswith("# Mixed run")
    assert "| class | requests | ok | rejected |" in report
    assert "| interactive | 10 | 10 | 0 |" in report
    assert "TTFT p99 (ms)" in report
    assert "kv_usage_and_queue_depth.png" in report
    assert '"preset": "tiny"' in report

    folder = read_run_folder(out)
    assert folder.summary == json.loads(json.dumps(summary))
    assert folder.records == records
    assert folder.samples == samples
    assert folder.workload_toml == WORKLOAD_TOML
    assert folder.config["engine"] == {"block_size_tokens": 16}


def test_read_run_folder_rejects_incomplete(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(ValueError, match="requests.jsonl"):
        read_run_folder(tmp_path)


def test_plot_timeline_without_samples(tmp_path: Path) -> None:
    path = plot_timeline([], tmp_path / "empty.png")
    assert _is_png(path)


def _points() -> list[dict[str, object]]:
    points: list[dict[str, object]] = []
    for policy, slowdown in (("mixgate", 1.0), ("fifo", 3.0)):
        for load in (1.0, 2.0, 4.0):
            records = _records()
            for record in records:
                if record.ttft_s is not None:
                    record.ttft_s *= load * slowdown
            points.append({"policy": policy, "offered_load": load, **summarize(records, 10.0)})
    return points


def test_plot_vs_load_writes_four_pngs(tmp_path: Path) -> None:
    paths = plot_vs_load(_points(), tmp_path)
    assert [p.name for p in paths] == list(VS_LOAD_FILES)
    for path in paths:
        assert path.parent == tmp_path
        assert _is_png(path), path


def test_plot_vs_load_with_a_name_prefix(tmp_path: Path) -> None:
    paths = plot_vs_load(_points(), f"{tmp_path}/sweep_")
    assert paths[0] == tmp_path / "sweep_ttft_p99_vs_load.png"
    assert all(_is_png(p) for p in paths)
    with pytest.raises(ValueError, match="policy"):
        plot_vs_load([{"offered_load": 1.0}], tmp_path)


def test_render_report_tables_and_extra_sections() -> None:
    summary = summarize(_records(), duration_s=10.0)
    text = render_report(
        "Run", summary, {"git_revision": "abc123"}, extra_tables={"Extra": "| a |\n|---|"}
    )
    assert "## Outcomes" in text
    assert "## Latency" in text
    assert "| bulk | 2 | 1 | 1 |" in text
    # Interactive TTFT over 0.05..0.14 s by nearest rank: p50 90 ms, p90 130 ms, p99 140 ms.
    rows = [line for line in text.splitlines() if line.startswith("| interactive | 90.0 |")]
    assert len(rows) == 1
    assert rows[0].startswith("| interactive | 90.0 | 130.0 | 140.0 |")
    assert "| bulk | 10.0 | 50.00% |" in text
    assert "## Extra" in text
    assert "**git revision**" in text


def test_render_comparison_has_policies_classes_and_ratios() -> None:
    chat_alone = summarize(_records()[:10], 10.0)
    mixed = summarize(_records(), 10.0)
    bulk_alone = summarize(_records()[10:], 10.0)
    text = render_comparison(
        [
            {
                "policy": "mixgate",
                "summary": mixed,
                "ratios": headline_ratios(mixed, chat_alone, bulk_alone),
            },
            {"policy": "fifo", "summary": mixed, "ratios": None},
        ]
    )
    assert "| policy | class | TTFT p50 (ms) | TTFT p99 (ms) | ITL p99 (ms) |" in text
    assert "| mixgate | interactive |" in text
    assert "| fifo | bulk |" in text
    assert "| mixgate | 1.00× | 1.00× | 1.00× |" in text
    assert "| fifo | - | - | - |" in text
