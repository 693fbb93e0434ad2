"""Bringing the engine up: the model folder, an engine config from the envelope, warm-up."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

import structlog

from engine.core.config import EngineConfig
from engine.core.request import GenerationRequest
from engine.core.sampling_params import SamplingParams
from engine.process.async_engine import AsyncEngine
from gateway.runtime.settings import Settings
from policies.envelope import Envelope
from policies.request_class import RequestClass

log = structlog.get_logger("mixgate.engine")

DEFAULT_PRESET = "small"


def resolve_model_dir(settings: Settings) -> Path:
    """The configured folder, or the default preset made on first run under the data folder."""
    if settings.model_dir is not None:
        if not (settings.model_dir / "config.json").is_file():
            raise FileNotFoundError(f"no config.json in model folder {settings.model_dir}")
        return settings.model_dir
    model_dir = settings.models_dir / DEFAULT_PRESET
    if not (model_dir / "config.json").is_file():
        from engine.model.make_model import make_model

        log.info("making_default_model", preset=DEFAULT_PRESET, path=str(model_dir))
        make_model(model_dir, DEFAULT_PRESET, seed=0)
    return model_dir


def engine_config(envelope: Envelope, settings: Settings) -> EngineConfig:
    return EngineConfig(
        max_active_seqs=envelope.max_active_seqs,
        # The envelope's interactive slots sit on top of bulk's (docs/ARCHITECTURE.md, "Slots"),
        # as far as the step budget has a decode token for each.
        interactive_overcommit_seqs=max(
            0,
            min(
                envelope.interactive_reserved_seqs,
                envelope.step_token_budget - envelope.max_active_seqs,
            ),
        ),
        step_token_budget=envelope.step_token_budget,
        bulk_prefill_chunk_tokens=envelope.bulk_prefill_chunk_tokens,
        bulk_min_share=envelope.bulk_min_share,
        bulk_aging_s=envelope.bulk_aging_s,
        max_model_len=max(
            envelope.interactive_limits.max_context_tokens,
            envelope.bulk_limits.max_context_tokens,
        ),
        kv_cache_bytes=settings.kv_cache_bytes,
        dtype=settings.dtype,
        device=settings.device,
        num_threads=settings.num_threads,
        adapt_threads=settings.adapt_threads,
        scheduling_policy=settings.policy,
        paged_attention_kernel=settings.paged_attention_kernel,
        fused_elementwise_kernels=settings.fused_elementwise_kernels,
        small_linear_kernel=settings.small_linear_kernel,
        fused_step_forward=settings.fused_step_forward,
        decode_graphs=settings.decode_graphs,
        prewarm=settings.prewarm,
    )


async def _start_vllm(model_dir: Path, config: EngineConfig) -> AsyncEngine:
    """vLLM's async engine behind the same interface (engine/backends/vllm/backend.py)."""
    from engine.backends.vllm.backend import VllmAsyncEngine

    vllm_engine = VllmAsyncEngine(model_dir, config)
    await vllm_engine.start()
    # NOTE: duck-typed: VllmAsyncEngine offers every method and attribute the gateway uses
    # of AsyncEngine (generate, abort, load, start, stop, is_running, engine.text.tokenizer,
    # engine.clock, engine.validate); tests/engine/test_vllm_backend.py runs the gateway on it.
    return cast(AsyncEngine, vllm_engine)


async def _start_in_thread(model_dir: Path, config: EngineConfig) -> AsyncEngine:
    """The step loop on a thread of this interpreter (tests and the simulator use it)."""
    # NOTE: imported here: LLMEngine pulls in torch, which the gateway's process does not
    # need when the engine runs in its own process.
    from engine.core.llm_engine import LLMEngine

    async_engine = AsyncEngine(await asyncio.to_thread(LLMEngine, model_dir, config))
    await async_engine.start()
    return async_engine


async def _start_process(model_dir: Path, config: EngineConfig) -> AsyncEngine:
    """The step loop in an engine core child process that this process owns."""
    from engine.process.client import EngineCoreClient

    client = EngineCoreClient(model_dir, config)
    # NOTE: started from the event-loop thread (this coroutine), never from a worker thread:
    # the child's parent-death signal fires when the thread that forked it exits.
    await client.start()
    # NOTE: duck-typed like the vLLM backend: EngineCoreClient offers AsyncEngine's interface
    # (tests/engine/test_engine_process.py runs the gateway on it).
    return cast(AsyncEngine, client)


async def start_engine(
    model_dir: Path, config: EngineConfig, *, backend: str = "native", in_process: bool = False
) -> AsyncEngine:
    """Start the engine (its own process, unless `in_process` or vLLM's), and warm up.

    Warm-up runs a few requests through the engine so that its prefill and decode rates are
    measured before admission has to predict waits from them.
    """
    if backend == "vllm":
        async_engine = await _start_vllm(model_dir, config)
    elif in_process:
        async_engine = await _start_in_thread(model_dir, config)
    else:
        async_engine = await _start_process(model_dir, config)
    engine = async_engine.engine
    prompt = tuple(range(1, 1 + min(64, engine.max_model_len // 4)))
    sampling = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, detokenize=False)

    async def one(index: int) -> None:
        request = GenerationRequest(f"warmup-{index}", prompt, sampling, RequestClass.BULK)
        async for _ in async_engine.generate(request):
            pass

    await asyncio.gather(*(one(i) for i in range(4)))
    load = async_engine.load()
    log.info(
        "engine_ready",
        model=str(model_dir),
        engine=backend,
        kv_blocks=load.num_free_blocks,
        max_model_len=engine.max_model_len,
        prefill_tokens_per_s=load.prefill_tokens_per_s,
        decode_tokens_per_s=load.decode_tokens_per_s,
    )
    return async_engine
