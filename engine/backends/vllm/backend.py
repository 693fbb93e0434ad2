"""`VllmAsyncEngine`: vLLM's async engine in-process, behind the same face as `AsyncEngine`.

The gateway sees what it sees of the native engine: `generate()` yields `RequestOutput` deltas
(the last one `finished`), `abort()` stops a request wherever it is, `load()` is a snapshot
for admission and /metrics, and `.engine` offers the tokenizer, the clock and `validate()`.

Token ids go in and out: the gateway tokenizes with the folder's tokenizer and chat template, and
the deltas are detokenized here with the same incremental detokenizer as the native engine (stop
strings included), so text matches byte for byte. EOS is passed to vLLM as stop token ids, so no
vLLM tokenizer is loaded at all. The class is vLLM's priority (interactive 0, bulk 1); under the
`mixgate` policy `engine.backends.vllm.scheduler.ClassAwareScheduler` composes the steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.backends.vllm.args import (
    engine_kwargs,
    fitting_max_model_len,
    kv_bytes_per_token,
    require_vllm,
    uses_class_aware_scheduler,
    vllm_environment,
)
from engine.backends.vllm.client_context import destroy_client_context
from engine.backends.vllm.stats import VllmStatsTracker, stat_logger_factory
from engine.backends.vllm.step_channel import StepNotice, StepReceiver, cancel_quietly
from engine.core.config import EngineConfig
from engine.core.errors import EngineDeadError, RequestValidationError
from engine.core.request import GenerationRequest, RequestMetrics, RequestOutput
from engine.core.request_limits import check_request_limits
from engine.core.step_record import LoadSnapshot, StepRecord
from engine.model.config import ModelConfig
from engine.process.omp_wait import omp_wait_settings
from engine.text.detokenizer import IncrementalDetokenizer
from engine.text.tokenizer import Tokenizer
from policies.request_class import RequestClass

__all__ = ["VllmAsyncEngine", "VllmEngineInfo"]

_PRIORITY = {RequestClass.INTERACTIVE: 0, RequestClass.BULK: 1}


class VllmEngineInfo:
    """What the gateway reads as `async_engine.engine`: tokenizer, clock, validation."""

    def __init__(self, model_dir: Path, config: EngineConfig, clock: Callable[[], float]):
        self.model_config = ModelConfig.from_pretrained(model_dir)
        self.tokenizer = Tokenizer.from_pretrained(model_dir)
        self.clock = clock
        context = self.model_config.max_context_tokens
        self.max_model_len = fitting_max_model_len(
            self.model_config,
            config.kv_cache_bytes,
            config.dtype,
            min(config.max_model_len or context, context),
        )
        per_token = kv_bytes_per_token(self.model_config, config.dtype)
        self.kv_capacity_tokens = config.kv_cache_bytes // per_token
        self.eos_token_ids = tuple(
            dict.fromkeys(self.tokenizer.eos_token_ids + self.model_config.eos_token_ids)
        )

    def validate(self, request: GenerationRequest) -> None:
        """The native engine's checks, so the gateway's 400s read the same on both engines."""
        check_request_limits(
            request,
            max_model_len=self.max_model_len,
            kv_capacity_tokens=self.kv_capacity_tokens,
            vocab_size=self.model_config.vocab_size,
        )


@dataclass(slots=True)
class _Live:
    request: GenerationRequest
    metrics: RequestMetrics
    detokenizer: IncrementalDetokenizer | None
    num_output_tokens: int = 0
    # abort() was called (vLLM is told; its last output ends the stream).
    abort_requested: bool = False


class VllmAsyncEngine:
    def __init__(
        self,
        model_dir: str | Path,
        config: EngineConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        require_vllm()
        self.model_dir = Path(model_dir)
        self.config = config
        self.engine = VllmEngineInfo(self.model_dir, config, clock)
        self._clock = clock
        # Under the mixgate policy the class-aware scheduler sends each step's record, split by
        # class (step_channel); the other policies keep vLLM's own per-step counts.
        self._steps_from_scheduler = uses_class_aware_scheduler(config)
        self._stats = VllmStatsTracker(clock, records_steps=not self._steps_from_scheduler)
        self._step_receiver: StepReceiver | None = None
        self._step_task: asyncio.Task[None] | None = None
        self._step_listeners: list[Callable[[StepNotice], None]] = []
        self._live: dict[str, _Live] = {}
        self._llm: Any = None
        self._stopping = False
        # Abort calls to vLLM under way (kept from GC until they are done).
        self._aborts: set[asyncio.Task[None]] = set()

    @property
    def tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    @property
    def is_running(self) -> bool:
        return self._llm is not None and not self._stopping and not self._llm.errored

    async def start(self) -> None:
        """Start vLLM's engine-core and worker processes (tens of seconds, off the loop)."""
        if self._llm is not None:
            raise RuntimeError("the engine is already started")
        cache_dir = Path(os.environ.get("MIXGATE_VLLM_CACHE_DIR") or tempfile.gettempdir())
        os.environ.update(vllm_environment(self.config.num_threads, cache_dir / "mixgate-vllm"))
        # vLLM's engine-core process inherits this environment: its OpenMP threads spin as
        # briefly as the native engine's (engine/process/omp_wait.py).
        os.environ.update(omp_wait_settings(os.environ))
        if self._steps_from_scheduler:
            self._step_receiver = StepReceiver()
        sink = self._step_receiver.address if self._step_receiver is not None else None
        kwargs = engine_kwargs(
            self.model_dir, self.config, self.engine.max_model_len, step_sink=sink
        )
        try:
            self._llm = await asyncio.to_thread(self._build, kwargs)
        except BaseException:
            self._close_step_receiver()
            raise
        if self._step_receiver is not None:
            self._step_task = asyncio.create_task(self._step_receiver.run(self._on_step))

    def add_step_listener(self, listener: Callable[[StepNotice], None]) -> None:
        """Call `listener` with each step's record as it comes in (/metrics, the console)."""
        self._step_listeners.append(listener)

    def _on_step(self, record: StepRecord) -> None:
        self._stats.history.add(record)
        notice = StepNotice((record,))
        for listener in self._step_listeners:
            listener(notice)

    def _close_step_receiver(self) -> None:
        if self._step_receiver is not None:
            self._step_receiver.close()
            self._step_receiver = None

    def _build(self, kwargs: dict[str, Any]) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(
            AsyncEngineArgs(**kwargs), stat_loggers=[stat_logger_factory(self._stats)]
        )

    async def stop(self) -> None:
        self._stopping = True
        if self._llm is not None:
            ids = list(self._live)
            for live in self._live.values():
                live.abort_requested = True
            if ids:
                # vLLM's output processor ends each open stream with its last ("abort")
                # output before the engine goes; a dead engine has nothing to abort.
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._llm.abort(ids), timeout=5.0)
            await asyncio.to_thread(self._llm.shutdown)
            destroy_client_context(self._llm)
        await cancel_quietly(self._step_task)
        self._step_task = None
        self._close_step_receiver()

    def load(self) -> LoadSnapshot:
        """vLLM's own KV usage, step rates and request counts; the class split is ours.

        NOTE: vLLM reports running and waiting totals, not per class; a request counts as
        running here once it has its first token (a prefill still in progress counts as
        waiting). The KV usage is vLLM's block pool's.
        """
        running = dict.fromkeys(RequestClass, 0)
        waiting = dict.fromkeys(RequestClass, 0)
        for live in self._live.values():
            side = running if live.num_output_tokens else waiting
            side[live.request.request_class] += 1
        stats = self._stats
        return LoadSnapshot(
            running_by_class=running,
            waiting_by_class=waiting,
            kv_usage=stats.kv_usage,
            num_free_blocks=round((1.0 - stats.kv_usage) * self._num_blocks()),
            recent_step_s=stats.history.recent_step_s(),
            prefill_tokens_per_s=stats.history.rate_tokens_per_s("prefill"),
            decode_tokens_per_s=stats.history.rate_tokens_per_s("decode"),
            step_cost=stats.history.step_cost(),
            bulk_prefill=stats.history.bulk_prefill_pace(),
            total_preemptions=stats.total_preemptions,
            steps=stats.history.total_steps,
        )

    def vllm_request_counts(self) -> tuple[int, int]:
        """(running, waiting) as vLLM's scheduler last reported them."""
        return self._stats.num_running, self._stats.num_waiting

    def _num_blocks(self) -> int:
        return self.engine.kv_capacity_tokens // self.config.block_size_tokens

    def abort(self, request_id: str) -> None:
        live = self._live.get(request_id)
        if live is not None and not live.abort_requested:
            live.abort_requested = True
            self._abort_in_vllm(request_id)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[RequestOutput]:
        """Yield the request's deltas; the last one has `finished` set."""
        if not self.is_running:
            raise EngineDeadError("the engine is not running")
        self.engine.validate(request)
        if request.request_id in self._live:
            raise RequestValidationError(
                f"request id {request.request_id!r} is already running", code="duplicate_id"
            )
        now_s = self._clock()
        live = _Live(
            request=request,
            metrics=RequestMetrics(
                arrival_s=request.arrival_s if request.arrival_s else now_s,
                handed_s=request.handed_s,
            ),
            detokenizer=(
                IncrementalDetokenizer(
                    self.engine.tokenizer, request.prompt_token_ids, request.sampling.stop
                )
                if request.sampling.detokenize
                else None
            ),
        )
        self._live[request.request_id] = live
        try:
            # aclosing: a consumer that leaves early closes _run now (its finally aborts the
            # request in vLLM), not whenever the generator is collected.
            async with contextlib.aclosing(self._run(live)) as outputs:
                async for output in outputs:
                    yield output
        finally:
            self._live.pop(request.request_id, None)

    async def _run(self, live: _Live) -> AsyncGenerator[RequestOutput, None]:
        """Read the request's deltas straight from vLLM's per-request output collector.

        NOTE: one wake-up per delta on the consumer's own task. This used to pump vLLM's
        generate() through an asyncio.Queue with a getter task and an asyncio.wait per delta
        (so that an abort could end it between deltas): three extra event-loop hops and two
        tasks per token of every running sequence, on the loop that also serves HTTP. Under
        a 400-job burst that loop work slowed intake and kept both cores from vLLM's step.
        An abort now goes to vLLM itself, whose output processor answers it with the
        request's last output (finish_reason "abort") on this same collector.
        """
        from vllm.exceptions import VLLMClientError

        params, prompt = self._vllm_inputs(live.request)
        request_id = live.request.request_id
        try:
            collector = await self._llm.add_request(
                request_id, prompt, params, priority=_PRIORITY[live.request.request_class]
            )
        except (ValueError, VLLMClientError) as error:
            # vLLM's own request checks: a 400, not a dead engine.
            raise RequestValidationError(f"vLLM refused the request: {error}") from error
        except Exception as error:
            raise EngineDeadError(f"vLLM failed the request: {error!r}") from error
        finished = False
        try:
            if live.abort_requested:
                # abort() came while add_request was under way, before vLLM knew the id.
                self._abort_in_vllm(request_id)
            while not finished:
                try:
                    out = collector.get_nowait() or await collector.get()
                except Exception as error:
                    # The output handler puts the engine's failure on every collector.
                    raise EngineDeadError(f"vLLM failed the request: {error!r}") from error
                output = self._delta(live, out)
                finished = output.finished
                yield output
        finally:
            collector.close()
            if not finished:
                # The consumer left early (closed or cancelled): free the request in vLLM
                # (its KV blocks and its slot).
                self._abort_in_vllm(request_id)

    def _abort_in_vllm(self, request_id: str) -> None:
        try:
            task = asyncio.get_running_loop().create_task(self._llm.abort(request_id))
        except RuntimeError:
            return  # no loop: the engine is being torn down with its requests
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    def _vllm_inputs(self, request: GenerationRequest) -> tuple[Any, Any]:
        from vllm import SamplingParams, TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        sampling = request.sampling
        stop_ids = list(sampling.stop_token_ids)
        if not sampling.ignore_eos:
            stop_ids += [t for t in self.engine.eos_token_ids if t not in stop_ids]
        params = SamplingParams(
            n=1,
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=max(0, sampling.top_k),
            min_p=sampling.min_p,
            repetition_penalty=sampling.repetition_penalty,
            # vLLM holds back every stop token id (EOS included, above) until min_tokens.
            min_tokens=sampling.min_tokens,
            seed=sampling.seed,
            stop_token_ids=stop_ids,
            # EOS reaches vLLM as a stop token id (above); vLLM knows no tokenizer here.
            ignore_eos=True,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )
        return params, TokensPrompt(prompt_token_ids=list(request.prompt_token_ids))

    def _delta(self, live: _Live, out: Any) -> RequestOutput:
        completion = out.outputs[0]
        tokens = list(completion.token_ids)
        now_s = self._clock()
        metrics = live.metrics
        if tokens and metrics.first_token_s is None:
            metrics.first_token_s = now_s
            scheduled = getattr(out.metrics, "scheduled_ts", 0.0) if out.metrics else 0.0
            # vLLM stamps scheduled_ts on the same monotonic clock (another process, one host).
            metrics.first_scheduled_s = scheduled if 0 < scheduled <= now_s else now_s
            # Queued in vLLM's engine core: when it took the request in.
            queued = getattr(out.metrics, "queued_ts", 0.0) if out.metrics else 0.0
            if 0 < queued <= metrics.first_scheduled_s:
                metrics.accepted_s = queued
        metrics.token_times_s.extend([now_s] * len(tokens))
        live.num_output_tokens += len(tokens)
        reason = completion.finish_reason if out.finished else None
        text = ""
        if live.detokenizer is not None and tokens:
            delta = live.detokenizer.add_tokens(tokens)
            text = delta.text
            if delta.stop_matched is not None:
                reason = "stop"
        finishing = reason is not None
        if finishing and live.detokenizer is not None and live.detokenizer.stop_matched is None:
            text += live.detokenizer.flush()
        # After the flush: a request whose only text is the held-back tail shows it here.
        if text and metrics.first_text_s is None:
            metrics.first_text_s = now_s
        if reason is None:
            return RequestOutput(
                live.request.request_id,
                tokens,
                text,
                False,
                None,
                len(live.request.prompt_token_ids),
                live.num_output_tokens,
            )
        return self._final(live, tokens, text, reason)

    def _final(self, live: _Live, tokens: list[int], text: str, reason: str) -> RequestOutput:
        live.metrics.finished_s = self._clock()
        return RequestOutput(
            live.request.request_id,
            tokens,
            text,
            True,
            reason,
            len(live.request.prompt_token_ids),
            live.num_output_tokens,
            live.metrics,
        )
