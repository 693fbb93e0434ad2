"""The synchronous engine: validate, schedule, run, update; one `step()` at a time."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from engine.core.block_manager import BlockManager
from engine.core.config import EngineConfig
from engine.core.errors import RequestValidationError
from engine.core.request import GenerationRequest, RequestMetrics, RequestOutput
from engine.core.request_limits import check_request_limits
from engine.core.scheduler import Scheduler
from engine.core.scheduler_output import SchedulerOutput
from engine.core.sequence import Sequence
from engine.core.step_record import LoadSnapshot, StepHistory, StepRecord
from engine.model.config import ModelConfig
from engine.model.prepacked_linear import warm_row_buckets
from engine.model.runner import ModelRunner, kv_block_bytes
from engine.model.weights import DTYPES, load_model
from engine.text.detokenizer import IncrementalDetokenizer
from engine.text.tokenizer import Tokenizer
from policies.request_class import RequestClass


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class LLMEngine:
    def __init__(
        self,
        model_dir: str | Path,
        config: EngineConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.config = config or EngineConfig()
        self.clock = clock
        if self.config.num_threads is not None:
            torch.set_num_threads(self.config.num_threads)
        self.device = resolve_device(self.config.device)
        checkpoint_dtype = ModelConfig.from_pretrained(model_dir).torch_dtype
        dtype_name = checkpoint_dtype if self.config.dtype == "auto" else self.config.dtype
        self.dtype = DTYPES[dtype_name]
        model, model_config = load_model(model_dir, self.dtype, self.device)
        tokenizer = Tokenizer.from_pretrained(model_dir)
        block_size = self.config.block_size_tokens
        num_blocks = self.config.num_kv_blocks or max(
            1,
            self.config.kv_cache_bytes // kv_block_bytes(model_config, block_size, self.dtype),
        )
        runner = ModelRunner(
            model,
            num_blocks,
            block_size,
            self.dtype,
            self.device,
            self.config.seed,
            prepack=self.config.prepack_linears,
            paged_kernel=self.config.paged_attention_kernel,
            fused_elementwise=self.config.fused_elementwise_kernels,
            small_linear_kernel=self.config.small_linear_kernel,
            decode_graphs=self.config.decode_graphs,
            fused_step_forward=self.config.fused_step_forward,
            populate_kv_cache=self.config.prewarm,
        )
        if self.config.prewarm and runner.prepacked:
            # A step's rows are its tokens: at most the step budget.
            warm_row_buckets(model, self.config.step_token_budget)
        self.tokenizer = tokenizer
        self._init_core(model_config, runner, num_blocks, tokenizer.eos_token_ids)

    def _init_core(
        self,
        model_config: ModelConfig,
        runner: ModelRunner,
        num_blocks: int,
        extra_eos_ids: Iterable[int] = (),
    ) -> None:
        """Everything but the model: scheduler, blocks, bookkeeping around `runner`.

        NOTE: split out so the simulated engine (engine/sim/engine.py) runs this very step
        loop with a cost-model executor in virtual time; it has no tokenizer (no detokenizing).
        """
        self.model_config = model_config
        self.max_model_len = min(
            self.config.max_model_len or model_config.max_context_tokens,
            model_config.max_context_tokens,
        )
        block_size = self.config.block_size_tokens
        self.block_manager = BlockManager(num_blocks, block_size, self.config.enable_prefix_caching)
        self.scheduler = Scheduler(self.config, self.block_manager)
        self.runner = runner
        self.history = StepHistory()
        self._sequences: dict[str, Sequence] = {}
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}
        self._eos_ids = frozenset(extra_eos_ids) | frozenset(model_config.eos_token_ids)

    # -- requests ----------------------------------------------------------------------------

    def validate(self, request: GenerationRequest) -> None:
        """Raise RequestValidationError for a request the engine must not accept."""
        check_request_limits(
            request,
            max_model_len=self.max_model_len,
            kv_capacity_tokens=self.block_manager.num_blocks * self.block_manager.block_size,
            vocab_size=self.model_config.vocab_size,
        )

    def add_request(self, request: GenerationRequest) -> None:
        self.validate(request)
        if request.request_id in self._sequences:
            raise RequestValidationError(
                f"request id {request.request_id!r} is already running", code="duplicate_id"
            )
        arrival_s = request.arrival_s if request.arrival_s is not None else self.clock()
        seq = Sequence(
            seq_id=request.request_id,
            request_class=request.request_class,
            token_ids=list(request.prompt_token_ids),
            num_prompt_tokens=len(request.prompt_token_ids),
            sampling=request.sampling,
            metrics=RequestMetrics(
                arrival_s=arrival_s, handed_s=request.handed_s, accepted_s=self.clock()
            ),
        )
        self._sequences[seq.seq_id] = seq
        sampling = request.sampling
        if sampling.needs_history:
            # min_tokens holds back what would end the request: stop ids, and EOS unless ignored.
            eos = () if sampling.ignore_eos else tuple(sorted(self._eos_ids))
            stop_ids = tuple(dict.fromkeys(sampling.stop_token_ids + eos))
            self.runner.sampler.track(seq.seq_id, seq.token_ids, seq.num_prompt_tokens, stop_ids)
        if request.sampling.detokenize:
            self._detokenizers[seq.seq_id] = IncrementalDetokenizer(
                self.tokenizer, list(request.prompt_token_ids), request.sampling.stop
            )
            seq.awaits_first_text = True
        self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request wherever it is and free its blocks; None if it is unknown."""
        seq = self.scheduler.abort(request_id)
        if seq is None:
            return None
        return self._final_output(seq, [], "")

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the step ----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        started_s = self.clock()
        output = self.scheduler.schedule(started_s)
        sampled = self.runner.execute(output) if output.chunks else {}
        finished_s = self.clock()
        self.scheduler.update(output, sampled, finished_s)
        if output.chunks:
            self._record(started_s, finished_s - started_s, output)
        return [self._emit(self._sequences[seq_id], token) for seq_id, token in sampled.items()]

    def _emit(self, seq: Sequence, token: int) -> RequestOutput:
        reason = self._stop_reason(seq, token)
        text = ""
        detok = self._detokenizers.get(seq.seq_id)
        if detok is not None:
            delta = detok.add_tokens([token])
            text = delta.text
            if delta.stop_matched is not None:
                reason = "stop"
            elif reason is not None:
                text += detok.flush()
            # After the flush: a request whose only text is the held-back tail shows it here.
            if text and seq.awaits_first_text:
                seq.awaits_first_text = False
                seq.metrics.first_text_s = seq.metrics.token_times_s[-1]
        if reason is None:
            return RequestOutput(
                seq.seq_id, [token], text, False, None, seq.num_prompt_tokens, seq.num_output_tokens
            )
        self.scheduler.finish(seq, reason)
        return self._final_output(seq, [token], text)

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        """Why generation ends at this token, before stop strings are looked at."""
        if token in seq.sampling.stop_token_ids:
            return "stop"
        if token in self._eos_ids and not seq.sampling.ignore_eos:
            return "stop"
        if seq.num_output_tokens >= seq.sampling.max_tokens:
            return "length"
        return "length" if seq.num_tokens >= self.max_model_len else None

    def _final_output(self, seq: Sequence, tokens: list[int], text: str) -> RequestOutput:
        seq.metrics.finished_s = self.clock()
        self._sequences.pop(seq.seq_id, None)
        self._detokenizers.pop(seq.seq_id, None)
        self.runner.sampler.forget(seq.seq_id)
        return RequestOutput(
            seq.seq_id,
            tokens,
            text,
            True,
            seq.finish_reason,
            seq.num_prompt_tokens,
            seq.num_output_tokens,
            seq.metrics,
        )

    def _record(self, started_s: float, duration_s: float, output: SchedulerOutput) -> None:
        classes = (RequestClass.INTERACTIVE, RequestClass.BULK)
        self.history.add(
            StepRecord(
                step_index=output.step_index,
                started_s=started_s,
                duration_s=duration_s,
                tokens_by_kind=output.tokens_by_kind,
                running_by_class={c: self.scheduler.num_running(c) for c in classes},
                waiting_by_class={c: self.scheduler.num_waiting(c) for c in classes},
                kv_usage=self.block_manager.usage,
                num_preemptions=len(output.preemptions),
            )
        )

    def load(self) -> LoadSnapshot:
        classes = (RequestClass.INTERACTIVE, RequestClass.BULK)
        return LoadSnapshot(
            running_by_class={c: self.scheduler.num_running(c) for c in classes},
            waiting_by_class={c: self.scheduler.num_waiting(c) for c in classes},
            kv_usage=self.block_manager.usage,
            num_free_blocks=self.block_manager.num_free_blocks,
            recent_step_s=self.history.recent_step_s(),
            prefill_tokens_per_s=self.history.rate_tokens_per_s("prefill"),
            decode_tokens_per_s=self.history.rate_tokens_per_s("decode"),
            step_cost=self.history.step_cost(),
            bulk_prefill=self.history.bulk_prefill_pace(),
            total_preemptions=self.history.total_preemptions,
            steps=self.history.total_steps,
        )
