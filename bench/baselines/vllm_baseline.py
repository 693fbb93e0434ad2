"""The vLLM policies of `bench compare`: `vllm-fcfs`, `vllm-priority` (a plain vLLM OpenAI
server, driven as its users would) and `mixgate-vllm` (mixgate serve --engine vllm).

A plain vLLM run writes the same run folder as a mixgate run (workload, records, summary,
report), with vLLM's version, its flags and its CPU thread settings in the runtime config.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from bench.baselines.vllm_loadgen import VllmSender
from bench.baselines.vllm_server import VllmServer
from bench.live.run import RunSpec, run_live
from bench.load.generator import run_load
from bench.load.workload import Workload
from bench.report.run_folder import write_run
from policies.envelope import Envelope, load_envelope

__all__ = ["VLLM_POLICIES", "is_vllm_policy", "run_policy"]

# Plain vLLM servers: policy name -> vLLM's --scheduling-policy.
_PLAIN = {"vllm-fcfs": "fcfs", "vllm-priority": "priority"}
VLLM_POLICIES = (*_PLAIN, "mixgate-vllm")


def is_vllm_policy(name: str) -> bool:
    return name in VLLM_POLICIES


def _envelope(path: Path | None) -> Envelope:
    return load_envelope(path.read_text()) if path is not None else Envelope.default("vllm")


def run_policy(
    name: str, spec: RunSpec, workload: Workload, folder: Path, title: str, extra: dict[str, Any]
) -> dict[str, Any]:
    """Run one workload variant under a vLLM policy; returns its summary."""
    if name == "mixgate-vllm":
        return run_live(
            RunSpec(
                spec.model_dir,
                spec.redis_url,
                "mixgate",
                threads=spec.threads,
                kv_cache_bytes=spec.kv_cache_bytes,
                envelope_path=spec.envelope_path,
                engine="vllm",
            ),
            workload,
            folder,
            title,
            extra,
        )
    envelope = _envelope(spec.envelope_path)
    server = VllmServer(
        spec.model_dir,
        _PLAIN[name],
        envelope,
        threads=spec.threads,
        kv_cache_bytes=spec.kv_cache_bytes,
        log_dir=folder / "server",
    ).start()
    try:
        result = asyncio.run(
            run_load(
                server.url,
                workload,
                model=server.served_model_name,
                sender_class=VllmSender,
                sender_options={"use_priority": _PLAIN[name] == "priority"},
                # vLLM's /metrics are its own; nothing to sample.
                scrape_metrics=False,
            )
        )
    finally:
        server.stop()
    runtime_config = {
        "policy": name,
        "engine": "vllm-openai-server",
        "vllm": server.settings_record(),
        "envelope_limits": {
            "max_num_seqs": envelope.max_active_seqs,
            "max_num_batched_tokens": envelope.step_token_budget,
            "long_prefill_token_threshold": envelope.bulk_prefill_chunk_tokens,
        },
        "model": {
            "dir": str(spec.model_dir),
            "config": json.loads((spec.model_dir / "config.json").read_text()),
        },
        "offered": result.offered,
        **extra,
    }
    return write_run(folder, workload, result, runtime_config, title)
