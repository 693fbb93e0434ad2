"""Service settings: one dataclass, read from the environment and then from command-line flags.

This is the only module that reads the environment.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from gateway.dispatch.config import DEFAULT_MAX_UNSTARTED_BULK_JOBS
from policies.scheduling_policy import SchedulingPolicy

ENV_PREFIX = "MIXGATE_"


def _default_replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True, slots=True)
class Settings:
    # Model folder; None: the `small` preset, made on first run under data_dir/models/.
    model_dir: Path | None = None
    # The model id clients send and /v1/models lists; None: the folder's name.
    model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    # None: an embedded redis-server child (or in-process fakeredis when none is installed).
    redis_url: str | None = None
    data_dir: Path = Path("data")
    envelope_path: Path | None = None
    # API keys: a JSON/TOML file, or the JSON text itself (MIXGATE_API_KEYS). Neither: open mode.
    api_keys_path: Path | None = None
    api_keys_json: str | None = None
    key_prefix: str = "{mixgate}:"
    replica_id: str = field(default_factory=_default_replica_id)
    lease_s: float = 10.0
    # Redis connections per replica: every open SSE stream holds one while it blocks on
    # XREAD; past this, callers wait up to redis_pool_timeout_s, then get 503.
    redis_max_connections: int = 4096
    redis_pool_timeout_s: float = 5.0
    # NOTE: short, so a Redis that is down or hung is noticed in about a second; the socket
    # timeout must stay above the longest blocking read (XREAD/BZPOPMIN wait about 1 s).
    redis_connect_timeout_s: float = 1.0
    redis_socket_timeout_s: float = 5.0
    # How often the health watcher pings Redis; while it is down, requests get 503 at once.
    redis_check_interval_s: float = 0.5
    max_attempts: int = 3
    max_body_bytes: int = 4 * 1024 * 1024
    # Job submissions being parsed, tokenized and admitted at once; the rest wait parked. NOTE:
    # without a bound, a client that posts a backlog of 400 jobs at once puts 400 runnable tasks
    # on the event loop and every await of a chat request queues behind all of them (chats sent
    # during such a burst waited seconds for their first token).
    job_intake_concurrency: int = 16
    # ... and while a chat waits for its first token (gateway/admission/intake_lane.py; at
    # most job_intake_concurrency).
    job_intake_concurrency_while_chats_wait: int = 0
    # ... past which one parked submission still starts every this many seconds while chats
    # wait, so that a flood of chats slows bulk intake and never stops it.
    job_intake_trickle_s: float = 0.02
    # The longest one chat holds bulk intake at that lower limit (a chat whose first text
    # never comes, say its client left before its body began, must not hold it for good).
    chat_intake_hold_max_s: float = 1.0
    # A request body must arrive within this (all of it): a slow-loris client gets 408.
    body_read_timeout_s: float = 30.0
    # Token streams stay readable this long after they end (late readers, resumes).
    stream_ttl_s: int = 3600
    # A stream with no event for this long ends with an error (a dead dispatcher).
    stream_idle_timeout_s: float = 60.0
    # A resumable stream (`stream_options.resumable`) whose client left keeps generating this
    # long for a resume (`GET /v1/chat/completions/{id}/stream`); then it is cancelled.
    stream_resume_grace_s: float = 30.0
    drain_timeout_s: float = 30.0
    # Engine placement.
    device: str = "auto"
    dtype: str = "float32"
    num_threads: int | None = None
    kv_cache_bytes: int = 1 << 30
    # The native engine's decode attention by its own kernel over the paged cache (CPU, fp32 or
    # bf16: built with the machine's gcc on first use; CUDA: Triton), and its prefill attention
    # likewise (CPU, fp32); false keeps torch's gather + SDPA.
    paged_attention_kernel: bool = True
    # RMSNorm, SiLU * up and rotary by the native engine's own C kernels (CPU, fp32; built with
    # the machine's gcc on first use); false keeps eager torch.
    fused_elementwise_kernels: bool = True
    # Decode-sized calls of small fp32 weights through the native engine's own C loop instead of
    # oneDNN (CPU); false keeps oneDNN.
    small_linear_kernel: bool = True
    # The native engine's steps of up to 128 rows on CPU (fp32, the C kernels above), decodes and
    # prefill chunks, as one C call for every layer instead of one Python call per layer and
    # kernel; false keeps the layers.
    fused_step_forward: bool = True
    # The native engine's core process runs a step on fewer threads while other work (this
    # gateway, tokenizers, clients on the same machine) holds its cores (EngineConfig.
    # adapt_threads); false keeps num_threads for every step.
    adapt_threads: bool = True
    # The native engine's pure-decode steps as CUDA graphs: "auto" (on CUDA), "off".
    decode_graphs: str = "auto"
    # The native engine's first steps as fast as its later ones (EngineConfig.prewarm: the CPU KV
    # cache committed in the background, oneDNN's GEMM shapes made before ready).
    prewarm: bool = True
    log_level: str = "info"
    log_json: bool = True
    # "mixgate" | "priority" | "fcfs": the scheduling preset (policies/scheduling_policy.py).
    policy: str = "mixgate"
    # "native" (mixgate's engine) | "vllm" (vLLM's async engine in-process; the vllm extra).
    engine: str = "native"
    # The native engine's step loop in a child process of its own (off this interpreter's GIL);
    # false runs it on a thread here (tests, the simulator). The vLLM engine has its own.
    engine_process: bool = True
    # Classes this replica claims from the queues (comma-separated). Every replica admits and
    # streams any class; e.g. "bulk" keeps interactive work on the other replicas.
    claim_classes: str = "interactive,bulk"
    # Bulk jobs this replica holds that its engine has given no token yet, at most; past it,
    # bulk is claimed only as one of them makes its first token (DispatcherConfig.
    # max_unstarted_bulk_jobs: a backlog stays in Redis, in reach of every replica). 0: no
    # pacing, bulk fills its slots at once. More for an engine that prefills several long
    # prompts a step (a fast accelerator, a large step budget) and is starved by four.
    max_unstarted_bulk_jobs: int = DEFAULT_MAX_UNSTARTED_BULK_JOBS
    # The Batch API (OpenAI's limits by default): an input file's size and non-blank lines;
    # how often each replica's batch supervisor looks at the active batches; how long its
    # per-batch lock lasts (a replica that dies holding it delays the batch this long); how
    # many of one batch's lines may be in the bulk queue at once (room for other bulk work).
    batch_max_file_bytes: int = 200 * 1024 * 1024
    batch_max_lines: int = 50_000
    batch_poll_interval_s: float = 0.25
    batch_lock_s: float = 30.0
    batch_max_queued_lines: int = 512

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536 and self.port != 0:
            raise ValueError("port must be in 0..65535")
        if self.lease_s <= 0 or self.drain_timeout_s < 0 or self.stream_idle_timeout_s <= 0:
            raise ValueError("lease_s and stream_idle_timeout_s must be positive")
        if self.stream_resume_grace_s < 0:
            raise ValueError("stream_resume_grace_s must be >= 0")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be at least 1024")
        self._check_intake_limits()
        if self.policy not in {p.value for p in SchedulingPolicy}:
            raise ValueError(f"unknown policy {self.policy!r}: fcfs, priority or mixgate")
        if self.decode_graphs not in ("auto", "off"):
            raise ValueError(f"unknown decode_graphs {self.decode_graphs!r}: auto or off")
        if self.engine not in ("native", "vllm"):
            raise ValueError(f"unknown engine {self.engine!r}: native or vllm")
        self._check_redis_timeouts()
        if not self.claimed_classes or not self.claimed_classes <= {"interactive", "bulk"}:
            raise ValueError("claim_classes must name interactive and/or bulk, comma-separated")
        self._check_batch_limits()
        if "{" not in self.key_prefix or "}" not in self.key_prefix:
            raise ValueError("key_prefix must contain a {hash tag} (Redis Cluster slots)")

    def _check_intake_limits(self) -> None:
        if self.job_intake_concurrency < 1:
            raise ValueError("job_intake_concurrency must be at least 1")
        if self.job_intake_concurrency_while_chats_wait < 0:
            raise ValueError("job_intake_concurrency_while_chats_wait must be at least 0")
        if self.job_intake_trickle_s <= 0:
            raise ValueError("job_intake_trickle_s must be positive")
        if self.chat_intake_hold_max_s <= 0:
            raise ValueError("chat_intake_hold_max_s must be positive")
        if self.max_unstarted_bulk_jobs < 0:
            raise ValueError("max_unstarted_bulk_jobs must be >= 0 (0: no bulk claim pacing)")

    def _check_redis_timeouts(self) -> None:
        timeouts = (
            self.redis_connect_timeout_s,
            self.redis_socket_timeout_s,
            self.redis_check_interval_s,
            self.body_read_timeout_s,
        )
        if min(timeouts) <= 0:
            raise ValueError("redis timeouts, redis_check_interval_s, body_read_timeout_s > 0")

    @property
    def claimed_classes(self) -> frozenset[str]:
        return frozenset(c.strip() for c in self.claim_classes.split(",") if c.strip())

    @property
    def bulk_claim_pacing(self) -> int | None:
        """`DispatcherConfig.max_unstarted_bulk_jobs`: None where the setting turns pacing off."""
        return self.max_unstarted_bulk_jobs or None

    def _check_batch_limits(self) -> None:
        if min(self.batch_max_file_bytes, self.batch_max_lines, self.batch_max_queued_lines) < 1:
            raise ValueError("batch_max_file_bytes, batch_max_lines, batch_max_queued_lines >= 1")
        if self.batch_poll_interval_s <= 0 or self.batch_lock_s <= 0:
            raise ValueError("batch_poll_interval_s and batch_lock_s must be positive")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Settings from MIXGATE_* variables, and REDIS_URL (docs/ARCHITECTURE.md, "Processes")."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is not None and raw != "":
                values[f.name] = _parse(f.name, raw)
        if "redis_url" not in values and env.get("REDIS_URL"):
            values["redis_url"] = env["REDIS_URL"]
        if "api_keys_json" not in values and env.get("MIXGATE_API_KEYS"):
            values["api_keys_json"] = env["MIXGATE_API_KEYS"]
        return cls(**values)

    def with_overrides(self, **overrides: Any) -> Settings:
        """Flags win over the environment; None means "flag not given"."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"

    @property
    def files_dir(self) -> Path:
        """Where the Files API keeps uploaded and batch-written bytes."""
        return self.data_dir / "files"


_PATHS = {"model_dir", "data_dir", "envelope_path", "api_keys_path"}
_BOOLS = {
    "log_json",
    "engine_process",
    "paged_attention_kernel",
    "fused_elementwise_kernels",
    "small_linear_kernel",
    "fused_step_forward",
    "adapt_threads",
    "prewarm",
}
_INTS = {
    "port",
    "max_attempts",
    "max_body_bytes",
    "job_intake_concurrency",
    "job_intake_concurrency_while_chats_wait",
    "max_unstarted_bulk_jobs",
    "stream_ttl_s",
    "num_threads",
    "kv_cache_bytes",
    "redis_max_connections",
    "batch_max_file_bytes",
    "batch_max_lines",
    "batch_max_queued_lines",
}
_FLOATS = {
    "chat_intake_hold_max_s",
    "job_intake_trickle_s",
    "lease_s",
    "stream_idle_timeout_s",
    "stream_resume_grace_s",
    "drain_timeout_s",
    "redis_pool_timeout_s",
    "redis_connect_timeout_s",
    "redis_socket_timeout_s",
    "redis_check_interval_s",
    "body_read_timeout_s",
    "batch_poll_interval_s",
    "batch_lock_s",
}


def _parse(name: str, raw: str) -> Any:
    try:
        if name in _PATHS:
            return Path(raw)
        if name in _INTS:
            return int(raw)
        if name in _FLOATS:
            return float(raw)
        if name in _BOOLS:
            return raw.lower() in ("1", "true", "yes", "on")
    except ValueError as error:
        raise ValueError(f"{ENV_PREFIX}{name.upper()}={raw!r}: {error}") from error
    return raw
