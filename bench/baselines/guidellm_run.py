"""One `guidellm run` against an OpenAI-compatible server, and what its JSON report says.

Shared by tests/gateway/test_client_guidellm.py (a short run in CI) and
bench/baselines/guidellm_compare.py (guidellm's sweep against mixgate and against plain vLLM on the
same folder and threads). guidellm lives in its own environment, `.venv-guidellm`
(scripts/setup-guidellm).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["GUIDELLM", "GuidellmRun", "benchmark_row"]

GUIDELLM = Path(__file__).resolve().parents[2] / ".venv-guidellm" / "bin" / "guidellm"


@dataclass(frozen=True)
class GuidellmRun:
    target: str  # the server's base URL
    model: str  # the served model name
    tokenizer_dir: Path  # the model folder (guidellm counts prompt tokens with it)
    endpoint: str  # "/v1/chat/completions" or "/v1/completions"
    profile: str  # guidellm's --profile, e.g. "kind=sweep,sweep_size=6"
    prompt_tokens: int
    output_tokens: int
    constraint: str  # guidellm's --constraint, e.g. "kind=max_requests,count=6"

    def command(self, report: Path) -> list[str]:
        data = (
            f"kind=synthetic_text,prompt_tokens={self.prompt_tokens},"
            f"output_tokens={self.output_tokens}"
        )
        backend = f"kind=openai_http,target={self.target},model={self.model}"
        return [
            str(GUIDELLM),
            "run",
            "--backend",
            f"{backend},request_format={self.endpoint}",
            "--tokenizer",
            f"kind=hf_auto,model={self.tokenizer_dir}",
            "--profile",
            self.profile,
            "--data",
            data,
            "--constraint",
            self.constraint,
            "--output",
            f"kind=json,path={report}",
            "--disable-console",
        ]

    def run(self, out: Path, timeout_s: float) -> list[dict[str, Any]]:
        """Run it in `out`; its benchmarks (one per profile step) from the JSON report."""
        report = out / "report.json"
        # Offline: the tokenizer is the model folder; nothing may reach for a hub.
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "NO_COLOR": "1"}
        # One worker process (it runs the streams as tasks): guidellm spawns up to 10 by
        # default, each re-importing guidellm and torch, ~4 s of CPU apiece, per benchmark.
        env["GUIDELLM__MAX_WORKER_PROCESSES"] = "1"
        done = subprocess.run(
            self.command(report),
            cwd=out,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"guidellm failed:\n{(done.stdout + done.stderr)[-6000:]}")
        benchmarks: list[dict[str, Any]] = json.loads(report.read_text())["benchmarks"]
        return benchmarks


def _median(metrics: dict[str, Any], name: str) -> float | None:
    successful = (metrics.get(name) or {}).get("successful") or {}
    value = successful.get("median")
    return None if value is None else float(value)


def benchmark_row(benchmark: dict[str, Any]) -> dict[str, Any]:
    """One profile step: its strategy and rate, TTFT and ITL medians, output tokens/s, errors."""
    metrics = benchmark["metrics"]
    strategy = benchmark["config"].get("strategy", {})
    output_rate = (metrics.get("output_tokens_per_second") or {}).get("successful") or {}
    return {
        "strategy": strategy.get("type_"),
        "rate": strategy.get("rate") or strategy.get("streams"),
        "requests_per_s": ((metrics.get("requests_per_second") or {}).get("successful") or {}).get(
            "mean"
        ),
        "ttft_ms_median": _median(metrics, "time_to_first_token_ms"),
        "itl_ms_median": _median(metrics, "inter_token_latency_ms"),
        "output_tokens_per_s": output_rate.get("mean"),
        "errored": metrics["request_totals"]["errored"],
        "successful": metrics["request_totals"]["successful"],
    }
