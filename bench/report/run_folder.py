"""A run's results folder: the load-test inputs and runtime configuration kept with the result.

Layout::

    workload.toml                  the workload exactly as run
    config.json                    runtime configuration: what the caller passed (envelope,
                                   engine and model config, sweep_point, ...) plus hardware,
                                   versions and git revision added here
    requests.jsonl                 one RequestRecord per line
    metrics.jsonl                  one MetricSample per line
    summary.json                   bench.report.summary.summarize(...)
    report.md                      bench.report.render.render_report(...)
    kv_usage_and_queue_depth.png   bench.report.plots.plot_timeline(...)
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

from bench.load.records import (
    MetricSample,
    RequestRecord,
    read_records,
    read_samples,
    write_jsonl,
)
from bench.load.workload import Workload, dump_workload
from bench.report.plots import plot_timeline
from bench.report.render import render_report
from bench.report.summary import summarize

__all__ = [
    "RUN_FILES",
    "RunFolder",
    "RunResult",
    "read_run_folder",
    "runtime_facts",
    "server_pressure",
    "write_run",
    "write_run_folder",
]

RUN_FILES = (
    "workload.toml",
    "config.json",
    "requests.jsonl",
    "metrics.jsonl",
    "summary.json",
    "report.md",
    "kv_usage_and_queue_depth.png",
)
_REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class RunFolder:
    path: Path
    summary: dict[str, Any]
    records: list[RequestRecord]
    samples: list[MetricSample]
    config: dict[str, Any]
    workload_toml: str


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args],
            cwd=_REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def runtime_facts() -> dict[str, Any]:
    """Hardware, versions and git revision of this process and checkout."""
    # NOTE: torch is not imported for this (seconds, and the load generator may not use it);
    # the thread count is reported only when this process already runs torch. A server in
    # another process should pass its own in runtime_config["hardware"].
    torch = sys.modules.get("torch")
    status = _git("status", "--porcelain")
    return {
        "hardware": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "machine": platform.machine(),
            "processor": platform.processor() or None,
            "torch_threads": torch.get_num_threads() if torch is not None else None,
        },
        "versions": {
            "python": platform.python_version(),
            "torch": _version("torch"),
            "mixgate": _version("mixgate"),
        },
        "git_revision": _git("rev-parse", "HEAD"),
        # Uncommitted changes make the revision an approximation; say so.
        "git_dirty": None if status is None else bool(status),
    }


def _merged_config(runtime_config: dict[str, Any]) -> dict[str, Any]:
    facts = runtime_facts()
    config = dict(runtime_config)
    for key in ("hardware", "versions"):
        # The caller knows things this process cannot (the server's GPU, its torch threads).
        config[key] = {**facts[key], **runtime_config.get(key, {})}
    for key in ("git_revision", "git_dirty"):
        config.setdefault(key, facts[key])
    return config


def write_run_folder(
    out_dir: Path,
    *,
    workload_toml: str,
    runtime_config: dict[str, Any],
    records: list[RequestRecord],
    samples: list[MetricSample],
    summary: dict[str, Any],
    title: str,
) -> Path:
    """Write every file of ``RUN_FILES`` into ``out_dir`` (created if needed); return it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = _merged_config(runtime_config)
    (out_dir / "workload.toml").write_text(workload_toml)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, default=str) + "\n")
    write_jsonl(out_dir / "requests.jsonl", records)
    write_jsonl(out_dir / "metrics.jsonl", samples)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot_timeline(samples, out_dir / "kv_usage_and_queue_depth.png")
    (out_dir / "report.md").write_text(render_report(title, summary, config))
    return out_dir


def server_pressure(samples: list[MetricSample]) -> dict[str, Any]:
    """Cache pressure and queueing over the run, from the /metrics samples."""
    if not samples:
        return {}
    kv = [s.kv_usage for s in samples]
    classes = sorted({c for s in samples for c in s.queue_depth})
    return {
        "kv_usage_max": max(kv),
        "kv_usage_mean": sum(kv) / len(kv),
        "queue_depth_max": {c: max(s.queue_depth.get(c, 0.0) for s in samples) for c in classes},
        "preemptions": samples[-1].preemptions - samples[0].preemptions,
        "engine_steps": samples[-1].steps - samples[0].steps,
    }


class RunResult(Protocol):
    """What a run measured: the load generator's LoadResult or the simulator's SimResult."""

    @property
    def records(self) -> list[RequestRecord]: ...

    @property
    def samples(self) -> list[MetricSample]: ...

    @property
    def duration_s(self) -> float: ...


def write_run(
    folder: Path, workload: Workload, result: RunResult, runtime_config: dict[str, Any], title: str
) -> dict[str, Any]:
    """The end of every run (live, vLLM, simulated): summarize its records, add the server's
    pressure when its /metrics were sampled, write the folder; return the summary."""
    summary = summarize(result.records, result.duration_s)
    if result.samples:
        # NOTE: a plain vLLM server's /metrics are its own and not sampled: no pressure then.
        summary["server"] = server_pressure(result.samples)
    write_run_folder(
        folder,
        workload_toml=dump_workload(workload),
        runtime_config=runtime_config,
        records=result.records,
        samples=result.samples,
        summary=summary,
        title=title,
    )
    return summary


def read_run_folder(path: Path) -> RunFolder:
    path = Path(path)
    missing = [name for name in RUN_FILES if not (path / name).is_file()]
    # The PNG and report are derived; a folder without the data files is not a run.
    needed = [name for name in missing if name.endswith((".json", ".jsonl", ".toml"))]
    if needed:
        raise ValueError(f"{path} is not a complete run folder: missing {needed}")
    return RunFolder(
        path=path,
        summary=json.loads((path / "summary.json").read_text()),
        records=read_records(path / "requests.jsonl"),
        samples=read_samples(path / "metrics.jsonl"),
        config=json.loads((path / "config.json").read_text()),
        workload_toml=(path / "workload.toml").read_text(),
    )
