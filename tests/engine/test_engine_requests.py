"""The synchronous engine's request contract: validation, finishing, metrics, no leaked blocks."""

from __future__ import annotations

import dataclasses
import itertools
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from engine.core.config import EngineConfig
from engine.core.errors import RequestValidationError
from engine.core.llm_engine import LLMEngine
from engine.core.request import GenerationRequest, RequestOutput
from engine.core.sampling_params import SamplingParams
from policies.request_class import RequestClass

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
PROMPT = tuple(b"The quick brown fox jumps over the lazy dog.")


def _config(**overrides: object) -> EngineConfig:
    # NOTE: one torch thread: the tiny model gains nothing from more, and on a shared 2-core
    # runner intra-op threads spin against each other (40x slower steps were measured).
    settings: dict[str, object] = {"device": "cpu", "num_kv_blocks": 64, "num_threads": 1}
    settings.update(overrides)
    return EngineConfig(**settings)  # type: ignore[arg-type]


def _engine(
    model_dir: Path, clock: Callable[[], float] | None = None, **overrides: object
) -> LLMEngine:
    if clock is None:
        return LLMEngine(model_dir, _config(**overrides))
    return LLMEngine(model_dir, _config(**overrides), clock=clock)


@dataclass
class Result:
    outputs: list[RequestOutput] = field(default_factory=list)

    @property
    def tokens(self) -> list[int]:
        return [t for o in self.outputs for t in o.new_token_ids]

    @property
    def text(self) -> str:
        return "".join(o.new_text for o in self.outputs)

    @property
    def final(self) -> RequestOutput:
        assert self.outputs and self.outputs[-1].finished
        return self.outputs[-1]


def _drain(engine: LLMEngine, max_steps: int = 2_000) -> dict[str, Result]:
    """Step until nothing is left; check the block manager after every step."""
    results: dict[str, Result] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return results
        for output in engine.step():
            results.setdefault(output.request_id, Result()).outputs.append(output)
        engine.block_manager.check_invariants()
    raise AssertionError(f"requests still unfinished after {max_steps} steps")


def _run(engine: LLMEngine, request: GenerationRequest) -> Result:
    engine.add_request(request)
    return _drain(engine)[request.request_id]


def _assert_no_leaks(engine: LLMEngine) -> None:
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    engine.block_manager.check_invariants()


@pytest.fixture
def engine(tiny_model_dir: Path) -> LLMEngine:
    return _engine(tiny_model_dir)


# ---- bad requests --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "max_tokens must be at least 1"),
        ({"max_tokens": -3}, "max_tokens must be at least 1"),
        ({"temperature": 3.0}, "temperature must be in"),
        ({"top_p": 0.0}, "top_p must be in"),
        ({"top_k": -5}, "top_k must be -1"),
        ({"seed": -1}, "seed must be a non-negative"),
        ({"stop": tuple(f"s{i}" for i in range(10_000))}, "at most 16 stop strings"),
        ({"stop": ("",)}, "stop strings must be non-empty"),
        ({"stop_token_ids": (-1,)}, "stop_token_ids must be non-negative"),
    ],
)
def test_bad_sampling_params_raise_value_error(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_empty_prompt_is_rejected_by_the_request_itself() -> None:
    with pytest.raises(ValueError, match="the prompt is empty"):
        GenerationRequest("empty", ())
    with pytest.raises(ValueError, match="request_id must be non-empty"):
        GenerationRequest("", (1,))


def test_bad_requests_are_rejected_before_they_touch_the_engine(tiny_model_dir: Path) -> None:
    # A 128-token context and a 4-block (64-token) cache, so each limit is reachable.
    engine = _engine(tiny_model_dir, max_model_len=128, num_kv_blocks=4)
    engine.add_request(GenerationRequest("good", PROMPT[:20], GREEDY))
    first_outputs = engine.step()  # "good" now holds blocks: rejections must not disturb them
    free_before = engine.block_manager.num_free_blocks
    assert free_before < engine.block_manager.num_blocks

    def rejected(request: GenerationRequest, code: str, param: str | None) -> None:
        with pytest.raises(RequestValidationError) as caught:
            engine.add_request(request)
        assert (caught.value.code, caught.value.param) == (code, param)
        assert str(caught.value)  # a message a client can read
        assert engine.block_manager.num_free_blocks == free_before
        assert engine.load().waiting_by_class[RequestClass.INTERACTIVE] == 0

    rejected(GenerationRequest("long", (65,) * 128), "context_length_exceeded", "messages")
    rejected(
        GenerationRequest("over", (65,) * 100, SamplingParams(max_tokens=29)),
        "context_length_exceeded",
        "max_tokens",
    )
    # Fits the context (128) but not the whole KV cache (4 blocks x 16 tokens).
    rejected(
        GenerationRequest("cache", (65,) * 40, SamplingParams(max_tokens=40)),
        "context_length_exceeded",
        "max_tokens",
    )
    rejected(GenerationRequest("oov", (65, 259)), "invalid_request", "prompt")
    rejected(GenerationRequest("neg", (-1, 65)), "invalid_request", "prompt")
    rejected(GenerationRequest("good", (66,), GREEDY), "duplicate_id", None)
    # The limits are exact: the largest request that fits is accepted.
    engine.validate(GenerationRequest("edge", (65,) * 40, SamplingParams(max_tokens=24)))

    result = _drain(engine)["good"]
    result.outputs[:0] = first_outputs
    assert len(result.tokens) == GREEDY.max_tokens
    assert result.final.finish_reason == "length"
    _assert_no_leaks(engine)


# ---- no leaked blocks ----------------------------------------------------------------------


def test_all_blocks_return_after_a_mixed_batch_with_preemption(tiny_model_dir: Path) -> None:
    # 12 blocks (192 tokens) for six requests needing 5 blocks each: preemption must happen.
    engine = _engine(tiny_model_dir, num_kv_blocks=12, step_token_budget=48)
    for i in range(6):
        request_class = RequestClass.BULK if i % 2 else RequestClass.INTERACTIVE
        prompt = tuple((i * 31 + j) % 256 for j in range(40))
        params = SamplingParams(max_tokens=30, temperature=0.0 if i < 3 else 1.0, ignore_eos=True)
        engine.add_request(GenerationRequest(f"r{i}", prompt, params, request_class))
    results = _drain(engine)
    assert engine.history.total_preemptions > 0
    assert sorted(results) == [f"r{i}" for i in range(6)]
    for result in results.values():
        assert len(result.tokens) == 30
        assert result.final.finish_reason == "length"
        assert [o.finished for o in result.outputs] == [False] * 29 + [True]
    _assert_no_leaks(engine)


def test_abort_mid_prefill_frees_every_block(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir, step_token_budget=32, max_active_seqs=4)
    engine.add_request(GenerationRequest("long", tuple(range(200)), GREEDY))
    assert engine.step() == []  # a 32-token chunk of a 200-token prompt: nothing sampled
    assert engine.block_manager.num_free_blocks < engine.block_manager.num_blocks
    output = engine.abort_request("long")
    assert output is not None
    assert (output.finished, output.finish_reason, output.new_token_ids) == (True, "abort", [])
    assert output.num_output_tokens == 0
    assert output.metrics is not None and output.metrics.finished_s is not None
    _assert_no_leaks(engine)
    assert engine.step() == []
    assert engine.abort_request("long") is None  # already gone


def test_abort_mid_decode_and_while_waiting_frees_every_block(engine: LLMEngine) -> None:
    engine.add_request(GenerationRequest("decoding", PROMPT, GREEDY))
    for _ in range(4):
        engine.step()
    output = engine.abort_request("decoding")
    assert output is not None and output.finish_reason == "abort"
    assert output.num_output_tokens == 4
    _assert_no_leaks(engine)

    engine.add_request(GenerationRequest("waiting", PROMPT, GREEDY))
    output = engine.abort_request("waiting")  # never scheduled
    assert output is not None and output.finish_reason == "abort"
    _assert_no_leaks(engine)
    # The engine still works after aborts, and ids are free for reuse.
    assert len(_run(engine, GenerationRequest("decoding", PROMPT, GREEDY)).tokens) == 24
    _assert_no_leaks(engine)


# ---- how generation ends -------------------------------------------------------------------


def test_max_tokens_is_respected(engine: LLMEngine) -> None:
    result = _run(engine, GenerationRequest("five", PROMPT, SamplingParams(max_tokens=5)))
    assert len(result.tokens) == 5
    assert result.final.finish_reason == "length"
    assert result.final.num_output_tokens == 5
    assert result.final.num_prompt_tokens == len(PROMPT)
    assert all(not o.finished for o in result.outputs[:-1])
    _assert_no_leaks(engine)


def _first_new_token_index(tokens: list[int], start: int) -> int:
    """An index >= start whose token does not occur earlier, so it ends generation there."""
    for index in range(start, len(tokens)):
        if tokens[index] not in tokens[:index]:
            return index
    raise AssertionError(f"no fresh token after index {start} in {tokens}")


def test_stop_token_id_ends_with_stop(engine: LLMEngine) -> None:
    reference = _run(engine, GenerationRequest("ref", PROMPT, GREEDY)).tokens
    index = _first_new_token_index(reference, 2)
    params = SamplingParams(max_tokens=24, temperature=0.0, stop_token_ids=(reference[index],))
    result = _run(engine, GenerationRequest("stopped", PROMPT, params))
    assert result.tokens == reference[: index + 1]
    assert result.final.finish_reason == "stop"
    _assert_no_leaks(engine)


def _pick_stop_string(text: str) -> tuple[str, int]:
    """A 2-character stop string whose first occurrence is well inside the text."""
    for at in range(2, len(text) - 1):
        candidate = text[at : at + 2]
        if "\ufffd" not in candidate and text.find(candidate) == at:
            return candidate, at
    raise AssertionError(f"no usable stop string in {text!r}")


def test_stop_string_truncates_the_text_before_it(engine: LLMEngine) -> None:
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    reference = _run(engine, GenerationRequest("ref", PROMPT, params))
    stop, at = _pick_stop_string(reference.text)
    params = SamplingParams(max_tokens=48, temperature=0.0, stop=(stop,))
    result = _run(engine, GenerationRequest("stopped", PROMPT, params))
    assert result.final.finish_reason == "stop"
    assert result.text == reference.text[:at]
    assert stop not in result.text
    # Generation ended at the token that completed the match, not at max_tokens.
    assert len(result.tokens) < len(reference.tokens)
    assert result.tokens == reference.tokens[: len(result.tokens)]
    _assert_no_leaks(engine)


def test_eos_ends_generation_unless_ignore_eos(tiny_model_dir: Path, tmp_path: Path) -> None:
    reference = _run(_engine(tiny_model_dir), GenerationRequest("ref", PROMPT, GREEDY)).tokens
    index = _first_new_token_index(reference, 3)
    # The random model never picks <|im_end|>; declare a token it does pick an EOS id too
    # (real checkpoints list several, e.g. Llama 3's [128001, 128009]).
    folder = shutil.copytree(tiny_model_dir, tmp_path / "model")
    config = json.loads((folder / "config.json").read_text())
    config["eos_token_id"] = [258, reference[index]]
    (folder / "config.json").write_text(json.dumps(config))

    engine = _engine(folder)
    stopped = _run(
        engine, GenerationRequest("eos", PROMPT, SamplingParams(max_tokens=24, temperature=0.0))
    )
    assert stopped.tokens == reference[: index + 1]
    assert stopped.final.finish_reason == "stop"
    ignored = _run(engine, GenerationRequest("ignore", PROMPT, GREEDY))
    assert ignored.tokens == reference
    assert ignored.final.finish_reason == "length"
    _assert_no_leaks(engine)


# ---- metrics and the prefix cache ----------------------------------------------------------


def test_request_metrics_are_ordered_with_one_time_per_token(tiny_model_dir: Path) -> None:
    ticks = itertools.count()
    engine = _engine(tiny_model_dir, clock=lambda: float(next(ticks)))
    result = _run(engine, GenerationRequest("timed", PROMPT, SamplingParams(max_tokens=7)))
    metrics = result.final.metrics
    assert metrics is not None
    assert len(metrics.token_times_s) == len(result.tokens) == 7
    assert metrics.first_scheduled_s is not None and metrics.first_token_s is not None
    assert metrics.finished_s is not None
    assert metrics.arrival_s < metrics.first_scheduled_s < metrics.first_token_s
    assert metrics.first_token_s == metrics.token_times_s[0]
    times = metrics.token_times_s
    assert all(a < b for a, b in itertools.pairwise(times))
    assert times[-1] < metrics.finished_s
    assert metrics.ttft_s is not None and metrics.ttft_s > 0
    assert len(metrics.itls_s) == 6
    assert metrics.num_preemptions == 0
    # Only the final delta carries metrics.
    assert all(o.metrics is None for o in result.outputs[:-1])


def test_queue_delay_splits_into_dispatch_accept_and_the_schedulers_wait(
    tiny_model_dir: Path,
) -> None:
    # The gateway admitted at t=-5 and handed it over at t=-2; the engine took it in at its
    # next clock reading (0) and scheduled it after.
    ticks = itertools.count()
    engine = _engine(tiny_model_dir, clock=lambda: float(next(ticks)))
    request = GenerationRequest(
        "split", PROMPT, SamplingParams(max_tokens=2), arrival_s=-5.0, handed_s=-2.0
    )
    metrics = _run(engine, request).final.metrics
    assert metrics is not None and metrics.queue_delay_s is not None
    assert (metrics.dispatch_s, metrics.accept_s) == (3.0, 2.0)
    assert metrics.accepted_s is not None and metrics.first_scheduled_s is not None
    assert metrics.first_scheduled_s > metrics.accepted_s
    assert metrics.queue_delay_s == 3.0 + 2.0 + (metrics.first_scheduled_s - metrics.accepted_s)
    # Not handed by a gateway: no split, though the engine still knows when it took it in.
    plain = _run(engine, GenerationRequest("plain", PROMPT, SamplingParams(max_tokens=2)))
    assert plain.final.metrics is not None
    assert (plain.final.metrics.dispatch_s, plain.final.metrics.accept_s) == (None, None)


def test_prefix_cache_hit_leaves_the_output_unchanged(tiny_model_dir: Path) -> None:
    shared = tuple((i * 7) % 256 for i in range(70))
    first = GenerationRequest("first", (*shared, 1, 2, 3), GREEDY)
    second = GenerationRequest("second", (*shared, 9, 8, 7, 6), GREEDY)

    cached = _engine(tiny_model_dir)
    first_result = _run(cached, first)
    assert first_result.final.metrics is not None
    assert first_result.final.metrics.num_cached_prompt_tokens == 0
    second_result = _run(cached, second)
    assert second_result.final.metrics is not None
    # The 4 full blocks (64 tokens) inside the shared 70-token prefix come from the cache.
    assert second_result.final.metrics.num_cached_prompt_tokens == 64
    _assert_no_leaks(cached)

    uncached = _engine(tiny_model_dir, enable_prefix_caching=False)
    _run(uncached, first)
    baseline = _run(uncached, second)
    assert baseline.final.metrics is not None
    assert baseline.final.metrics.num_cached_prompt_tokens == 0
    assert second_result.tokens == baseline.tokens
    assert second_result.text == baseline.text


def test_a_sequence_awaits_its_first_text_until_a_delta_carries_some(engine: LLMEngine) -> None:
    # The scheduler keeps a chat's steps light until then (policies/step_budget.py, defers_bulk).
    engine.add_request(GenerationRequest("text", PROMPT, GREEDY))
    engine.add_request(
        GenerationRequest("ids", PROMPT, dataclasses.replace(GREEDY, detokenize=False))
    )
    text, ids = engine.scheduler.waiting[RequestClass.INTERACTIVE]
    assert (text.seq_id, ids.seq_id) == ("text", "ids")
    assert text.awaits_first_text and not ids.awaits_first_text
    seen, deltas = "", []
    while engine.has_unfinished_requests():
        deltas += [o for o in engine.step() if o.request_id == "text"]
        seen = "".join(o.new_text for o in deltas)
        if not text.is_finished:
            assert text.awaits_first_text == (seen == "")
        assert not ids.awaits_first_text
    assert seen  # the flag did go down
    # ... at the time of the first delta with text (one token per delta here)
    metrics = deltas[-1].metrics
    assert metrics is not None and metrics.first_text_s is not None
    first_with_text = next(i for i, o in enumerate(deltas) if o.new_text)
    assert metrics.first_text_s == metrics.token_times_s[first_with_text]


def test_first_text_time_is_set_exactly_when_a_request_showed_text(engine: LLMEngine) -> None:
    # One-token requests: a token that is a character's first bytes shows its text only in
    # the final flush, which must count as the first text too.
    one = dataclasses.replace(GREEDY, max_tokens=1)
    for i in range(12):
        engine.add_request(GenerationRequest(f"r{i}", PROMPT[i:], one))
    for request_id, result in _drain(engine).items():
        metrics = result.final.metrics
        assert metrics is not None
        assert (metrics.first_text_s is not None) == bool(result.text), request_id
