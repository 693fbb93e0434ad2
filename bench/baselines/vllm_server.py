"""A plain vLLM OpenAI server as a child process: the outside baseline of `bench compare`.

It runs from the vLLM environment (`scripts/setup-vllm` makes `.venv-vllm`) on the same model
folder, with the envelope's limits as vLLM flags and the same CPU threads as mixgate's engine
(`engine.backends.vllm.args.vllm_environment`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.live.processes import answers_ok, free_port, stop_process
from engine.backends.vllm.args import fitting_max_model_len, vllm_environment
from engine.model.config import ModelConfig
from policies.envelope import Envelope

__all__ = ["VllmServer", "vllm_python"]

REPO_ROOT = Path(__file__).resolve().parents[2]


def vllm_python() -> Path:
    """The interpreter that has vLLM: this one, else the repository's .venv-vllm."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return Path(sys.executable)
    candidate = REPO_ROOT / ".venv-vllm" / "bin" / "python"
    if not candidate.is_file():
        raise RuntimeError(
            "vLLM is not installed: run scripts/setup-vllm (or pip install 'mixgate[vllm]')"
        )
    return candidate


@dataclass
class VllmServer:
    model_dir: Path
    # "fcfs" | "priority"
    scheduling_policy: str
    envelope: Envelope
    threads: int
    kv_cache_bytes: int
    log_dir: Path
    served_model_name: str = "model"
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    started_in_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def max_model_len(self) -> int:
        limits = (self.envelope.interactive_limits, self.envelope.bulk_limits)
        wanted = max(limit.max_context_tokens for limit in limits)
        model = ModelConfig.from_pretrained(self.model_dir)
        return fitting_max_model_len(model, self.kv_cache_bytes, "float32", wanted)

    def args(self) -> list[str]:
        env = self.envelope
        return [
            str(vllm_python()),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.served_model_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            "float32",
            "--max-model-len",
            str(self.max_model_len()),
            "--max-num-seqs",
            str(env.max_active_seqs),
            "--max-num-batched-tokens",
            str(env.step_token_budget),
            "--enable-chunked-prefill",
            "--long-prefill-token-threshold",
            str(env.bulk_prefill_chunk_tokens),
            "--scheduling-policy",
            self.scheduling_policy,
            "--kv-cache-memory-bytes",
            str(self.kv_cache_bytes),
            "--enforce-eager",
            "--disable-uvicorn-access-log",
        ]

    def environment(self) -> dict[str, str]:
        return vllm_environment(self.threads, self.log_dir / "cache")

    def settings_record(self) -> dict[str, Any]:
        """What the run folder records about this server."""
        env = self.environment()
        return {
            "vllm_version": vllm_version(),
            "args": self.args()[3:],
            "VLLM_CPU_OMP_THREADS_BIND": env.get("VLLM_CPU_OMP_THREADS_BIND"),
            "VLLM_CPU_NUM_OF_RESERVED_CPU": env.get("VLLM_CPU_NUM_OF_RESERVED_CPU"),
            # Unset: the KV cache is sized by --kv-cache-memory-bytes instead (finer than GiB).
            "VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE"),
            "kv_cache_memory_bytes": self.kv_cache_bytes,
            "threads": self.threads,
            "startup_s": self.started_in_s,
        }

    def start(self, ready_timeout_s: float = 600.0) -> VllmServer:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
        env |= self.environment()
        log_path = self.log_dir / f"vllm-{self.port}.log"
        started = time.monotonic()
        with log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.args(), env=env, stdout=log, stderr=subprocess.STDOUT
            )
        remaining_s = started + ready_timeout_s - time.monotonic()
        if answers_ok(self.url + "/health", self.process, remaining_s, interval_s=0.2):
            self.started_in_s = time.monotonic() - started
            return self
        if self.process.poll() is not None:
            raise RuntimeError(f"vLLM exited early; see {log_path}")
        self.stop()
        raise RuntimeError(f"vLLM not ready in {ready_timeout_s} s; see {log_path}")

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process, 30.0)


def vllm_version() -> str | None:
    try:
        out = subprocess.run(
            [str(vllm_python()), "-c", "import vllm; print(vllm.__version__)"],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
    except (subprocess.SubprocessError, RuntimeError, OSError):
        return None
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else None
