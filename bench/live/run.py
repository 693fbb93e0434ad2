"""One measured run: a fresh `mixgate serve` under a policy (and envelope), a workload driven
over HTTP by the load generator, and the results folder written."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.live.processes import ServerProcess
from bench.load.generator import run_load
from bench.load.workload import Workload
from bench.report.run_folder import write_run
from engine.model.config import ModelConfig


@dataclass(frozen=True, slots=True)
class RunSpec:
    model_dir: Path
    redis_url: str
    policy: str
    # Torch threads of the server (the load generator takes the rest of the machine).
    threads: int = 1
    kv_cache_bytes: int = 256 << 20
    envelope_path: Path | None = None
    # "native" | "vllm" (mixgate serve --engine vllm: run the bench from .venv-vllm).
    engine: str = "native"


def model_name(url: str) -> str:
    return str(httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"])


def run_live(
    spec: RunSpec, workload: Workload, folder: Path, title: str, extra: dict[str, Any]
) -> dict[str, Any]:
    """Run the workload against a fresh server; write the run folder; return its summary."""
    server = ServerProcess(
        spec.model_dir,
        spec.redis_url,
        f"{{mg-run-{uuid.uuid4().hex[:8]}}}:",
        folder / "server",
        envelope_path=spec.envelope_path,
        policy=spec.policy,
        extra_env={
            "MIXGATE_NUM_THREADS": str(spec.threads),
            "MIXGATE_KV_CACHE_BYTES": str(spec.kv_cache_bytes),
            "MIXGATE_LEASE_S": "10",
            "MIXGATE_LOG_LEVEL": "warning",
            "MIXGATE_ENGINE": spec.engine,
        },
    ).start(ready_timeout_s=120.0 if spec.engine == "native" else 600.0)
    try:
        envelope = httpx.get(server.url + "/v1/envelope", timeout=10).json()
        result = asyncio.run(run_load(server.url, workload, model=model_name(server.url)))
    finally:
        server.stop()
    model = ModelConfig.from_pretrained(spec.model_dir)
    runtime_config = {
        "policy": spec.policy,
        "envelope": envelope,
        "server": {
            "threads": spec.threads,
            "kv_cache_bytes": spec.kv_cache_bytes,
            "engine": spec.engine,
        },
        "model": {
            "dir": str(spec.model_dir),
            "architecture": model.architecture,
            "num_parameters": model.num_parameters(),
            "config": json.loads((spec.model_dir / "config.json").read_text()),
        },
        "offered": result.offered,
        **extra,
    }
    return write_run(folder, workload, result, runtime_config, title)
