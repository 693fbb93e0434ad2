"""Timed engine steps for calibration: pure decode steps of B sequences, and mixed steps that
carry one fresh prompt chunk of a given size next to B decodes.

Decoders are added incrementally (1, then 1 more, then 2 more, ...), so one round prefills
each sequence once rather than once per batch size; their contexts grow a little as they
decode, and each timed step records the decodes' mean context so the estimate uses the same.
Every timed step is checked against the engine's step record: a step that was not what it was
meant to be (a stray prefill, a missing decode) raises instead of skewing the fit.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass

from engine.core.llm_engine import LLMEngine
from engine.core.request import GenerationRequest
from engine.core.sampling_params import SamplingParams

__all__ = ["StepTimer", "TimedSteps"]

WARMUP_STEPS = 2
# Decoders never finish during a calibration round (aborted at its end).
_DECODER_MAX_TOKENS = 4096


@dataclass(frozen=True, slots=True)
class TimedSteps:
    prefill_tokens: int
    decode_seqs: int
    context_tokens: int  # the decodes' mean cached length over the timed steps (0: none)
    samples_s: tuple[float, ...]

    @property
    def key(self) -> tuple[int, int]:
        return (self.prefill_tokens, self.decode_seqs)

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples_s)


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)


class StepTimer:
    def __init__(self, engine: LLMEngine, seed: int, steps: int, prompt_tokens: int):
        if steps < 1 or prompt_tokens < 1:
            raise ValueError("steps and prompt_tokens must be at least 1")
        self.engine = engine
        self.steps = steps
        self.prompt_tokens = prompt_tokens
        self._rng = random.Random(seed)
        self._next_id = 0
        self._context_by_id: dict[str, int] = {}  # decoders' tokens so far (prompt + output)

    def _prompt(self, length: int) -> tuple[int, ...]:
        vocab = self.engine.model_config.vocab_size
        return tuple(self._rng.randrange(vocab) for _ in range(length))

    def _request_id(self) -> str:
        self._next_id += 1
        return f"calibrate-{self._next_id}"

    def _step(self) -> float:
        started_s = time.perf_counter()
        outputs = self.engine.step()
        elapsed_s = time.perf_counter() - started_s
        for out in outputs:
            if out.request_id in self._context_by_id:
                self._context_by_id[out.request_id] += len(out.new_token_ids)
        return elapsed_s

    @property
    def decoders(self) -> int:
        return len(self._context_by_id)

    def grow_decoders(self, total: int) -> None:
        """Add decoders until ``total`` run, prefilled (untimed) until each has a token."""
        new_ids = []
        while self.decoders < total:
            request_id = self._request_id()
            prompt = self._prompt(self.prompt_tokens)
            room = self.engine.max_model_len - self.prompt_tokens
            max_tokens = min(_DECODER_MAX_TOKENS, room)
            self.engine.add_request(GenerationRequest(request_id, prompt, _greedy(max_tokens)))
            self._context_by_id[request_id] = self.prompt_tokens
            new_ids.append(request_id)
        while any(self._context_by_id[i] == self.prompt_tokens for i in new_ids):
            self._step()
        for _ in range(WARMUP_STEPS):
            self._step()

    def _mean_context(self) -> int:
        if not self._context_by_id:
            return 0
        return round(statistics.fmean(self._context_by_id.values()))

    def _check(self, prefill_tokens: int) -> None:
        record = self.engine.history.records[-1]
        if record.tokens_of("prefill") != prefill_tokens or record.tokens_of("decode") != (
            self.decoders
        ):
            raise RuntimeError(
                f"a timed step was not {prefill_tokens} prefill + {self.decoders} decode tokens"
            )

    def time_decode(self) -> TimedSteps:
        """``steps`` pure decode steps of the running decoders."""
        samples, contexts = [], []
        for _ in range(self.steps):
            contexts.append(self._mean_context())
            samples.append(self._step())
            self._check(0)
        return TimedSteps(0, self.decoders, round(statistics.fmean(contexts)), tuple(samples))

    def time_mixed(self, prefill_tokens: int) -> TimedSteps:
        """``steps`` steps each carrying a fresh ``prefill_tokens`` prompt (one chunk: the
        engine's step budget must hold it) next to the running decoders."""
        samples, contexts = [], []
        for _ in range(self.steps):
            request = GenerationRequest(
                self._request_id(), self._prompt(prefill_tokens), _greedy(1)
            )
            self.engine.add_request(request)
            contexts.append(self._mean_context())
            samples.append(self._step())
            self._check(prefill_tokens)  # max_tokens=1: the request ends with this step
        context = round(statistics.fmean(contexts))
        return TimedSteps(prefill_tokens, self.decoders, context, tuple(samples))

    def clear(self) -> None:
        """Abort every decoder (the end of a round)."""
        for request_id in list(self._context_by_id):
            self.engine.abort_request(request_id)
        self._context_by_id.clear()
