"""The vLLM backend in-process, against real vLLM on CPU: run inside the vLLM environment.

    .venv-vllm/bin/python -m pytest tests/vllm_inside -q

(tests/engine/test_vllm_backend.py runs this from the main suite.) One engine per module: vLLM takes
tens of seconds to start on 2 cores. The model is the `small` preset: vLLM's CPU attention
needs a head size of at least 32, and `tiny`'s is 16.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tests.dependencies import require_module

require_module("vllm", "run with the vLLM environment's python (.venv-vllm)")

from engine.backends.vllm.backend import VllmAsyncEngine  # noqa: E402
from engine.core.config import EngineConfig  # noqa: E402
from engine.core.llm_engine import LLMEngine  # noqa: E402
from engine.core.request import GenerationRequest, RequestOutput  # noqa: E402
from engine.core.sampling_params import SamplingParams  # noqa: E402
from engine.core.step_record import StepRecord  # noqa: E402
from engine.model.make_model import make_model  # noqa: E402
from engine.process.omp_wait import ENGINE_GOMP_SPINCOUNT  # noqa: E402
from gateway.http.metrics import engine_step_records  # noqa: E402
from policies.request_class import RequestClass  # noqa: E402

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    # vLLM's own imports warn (deprecations in its dependencies); they are not ours.
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning"),
    pytest.mark.timeout(400),
]

BULK_CHUNK_TOKENS = 16
STEP_BUDGET_TOKENS = 64
CONFIG = EngineConfig(
    max_active_seqs=4,
    step_token_budget=STEP_BUDGET_TOKENS,
    bulk_prefill_chunk_tokens=BULK_CHUNK_TOKENS,
    # Never aged in these tests: the bulk cap alone decides bulk prefill per step.
    bulk_aging_s=1000.0,
    # The cap lifts as soon as no chat is in the engine (the default, said here because the
    # tests below see both sides of that rule).
    interactive_linger_s=0.0,
    kv_cache_bytes=32 << 20,
    max_model_len=1024,
    dtype="float32",
    device="cpu",
    num_threads=2,
    scheduling_policy="mixgate",
)
PROMPTS = [
    tuple(range(1, 6)),
    tuple((i * 7) % 250 + 1 for i in range(40)),
    tuple((i * 13) % 250 + 1 for i in range(150)),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("vllm-model") / "small", "small", seed=0)


@pytest.fixture(scope="module")
async def engine(model_dir: Path) -> AsyncIterator[VllmAsyncEngine]:
    vllm_engine = VllmAsyncEngine(model_dir, CONFIG)
    await vllm_engine.start()
    try:
        yield vllm_engine
    finally:
        await vllm_engine.stop()


def request(
    request_id: str, prompt: tuple[int, ...], max_tokens: int, cls: RequestClass
) -> GenerationRequest:
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return GenerationRequest(request_id, prompt, sampling, cls)


async def collect(engine: VllmAsyncEngine, req: GenerationRequest) -> list[RequestOutput]:
    return [out async for out in engine.generate(req)]


async def test_greedy_token_ids_equal_the_native_engines(
    engine: VllmAsyncEngine, model_dir: Path
) -> None:
    native = LLMEngine(model_dir, EngineConfig(device="cpu", max_model_len=1024))
    expected: dict[str, list[int]] = {}
    for i, prompt in enumerate(PROMPTS):
        native.add_request(request(f"p{i}", prompt, 16, RequestClass.INTERACTIVE))
    while native.has_unfinished_requests():
        for out in native.step():
            expected.setdefault(out.request_id, []).extend(out.new_token_ids)
    results = await asyncio.gather(
        *(
            collect(engine, request(f"p{i}", prompt, 16, RequestClass.INTERACTIVE))
            for i, prompt in enumerate(PROMPTS)
        )
    )
    for i, outputs in enumerate(results):
        tokens = [t for out in outputs for t in out.new_token_ids]
        assert tokens == expected[f"p{i}"], f"prompt {i}"
        assert outputs[-1].finished and outputs[-1].finish_reason == "length"
        assert "".join(out.new_text for out in outputs) == native.tokenizer.decode(tokens)


def _bulk_prompts(offset: int) -> list[tuple[int, ...]]:
    # NOTE: each test its own prompts: the prefix cache would serve a repeated one.
    return [tuple((i * k + offset) % 250 + 1 for i in range(200)) for k in (3, 5, 11)]


async def _records_until(
    engine: VllmAsyncEngine, first_step: int, enough: Callable[[list[StepRecord]], bool]
) -> list[StepRecord]:
    """The step records from `first_step` on, once `enough` of them have come in.

    NOTE: the scheduler sends a step's record before that step's outputs, but on a socket of
    its own: the gateway may read the outputs first, so a test waits for the records it needs.
    """
    arrived = asyncio.Event()
    engine.add_step_listener(lambda _notice: arrived.set())
    while True:
        records = [r for r in engine._stats.history.records if r.step_index >= first_step]
        if enough(records):
            return records
        arrived.clear()
        await asyncio.wait_for(arrived.wait(), timeout=60)


def _tokens(records: list[StepRecord], request_class: RequestClass, kind: str) -> int:
    return sum(r.tokens_by_kind.get((request_class, kind), 0) for r in records)


async def _bulk_prefill_per_step(engine: VllmAsyncEngine, tag: str, offset: int) -> list[int]:
    """Prefill tokens of each step while three 200-token bulk prompts run."""
    first_step = engine.load().steps
    results = await asyncio.gather(
        *(
            collect(engine, request(f"{tag}{k}", p, 2, RequestClass.BULK))
            for k, p in enumerate(_bulk_prompts(offset))
        )
    )
    assert all(outputs[-1].finished for outputs in results)
    # Each request's second token is a decode: the records are in once all three are.
    records = await _records_until(
        engine, first_step, lambda got: _tokens(got, RequestClass.BULK, "decode") >= 3
    )
    return [r.tokens_of("prefill") for r in records]


async def test_class_aware_scheduler_caps_bulk_prefill_per_step_while_a_chat_runs(
    engine: VllmAsyncEngine,
) -> None:
    chat = engine.generate(request("chat", tuple(range(1, 6)), 400, RequestClass.INTERACTIVE))
    # The chat is decoding (its 5-token prefill is done) before the bulk prompts arrive.
    assert not (await chat.__anext__()).finished
    try:
        prefill = await _bulk_prefill_per_step(engine, "b", offset=0)
    finally:
        engine.abort("chat")
        rest = [out async for out in chat]
    assert rest[-1].finish_reason in ("abort", "length")
    # 600 prompt tokens went through; plain vLLM would take up to 3 x 16 per step.
    assert sum(prefill) >= 3 * 200 - 3
    assert max(prefill) <= BULK_CHUNK_TOKENS


async def test_bulk_prefill_is_not_capped_with_no_interactive_request_once_the_cap_lifts(
    engine: VllmAsyncEngine,
) -> None:
    prefill = await _bulk_prefill_per_step(engine, "w", offset=7)
    assert sum(prefill) >= 3 * 200 - 3
    # Work-conserving: with nobody to protect, the three prompts share the step budget
    # (vLLM's per-request chunk of 16 each), as plain vLLM runs them.
    assert max(prefill) > BULK_CHUNK_TOKENS


async def test_each_steps_tokens_are_recorded_by_class_and_kind(engine: VllmAsyncEngine) -> None:
    """The class-aware scheduler's records reach the gateway with the class split that vLLM's
    own step counts lack: every prompt token as its class's prefill, every later token as a
    decode (the first output token is sampled by the prompt's last chunk)."""
    chat_prompt, bulk_prompt = tuple(range(3, 60)), _bulk_prompts(offset=29)[0]
    engine_step_records(engine)  # /metrics' first read: it listens from here on
    first_step = engine.load().steps
    chat, bulk = await asyncio.gather(
        collect(engine, request("split-chat", chat_prompt, 6, RequestClass.INTERACTIVE)),
        collect(engine, request("split-bulk", bulk_prompt, 9, RequestClass.BULK)),
    )
    assert chat[-1].finish_reason == bulk[-1].finish_reason == "length"

    def all_in(records: list[StepRecord]) -> bool:
        return (
            _tokens(records, RequestClass.INTERACTIVE, "decode") >= 5
            and _tokens(records, RequestClass.BULK, "decode") >= 8
        )

    records = await _records_until(engine, first_step, all_in)
    assert _tokens(records, RequestClass.INTERACTIVE, "prefill") == len(chat_prompt)
    assert _tokens(records, RequestClass.BULK, "prefill") == len(bulk_prompt)
    assert _tokens(records, RequestClass.INTERACTIVE, "decode") == 5
    assert _tokens(records, RequestClass.BULK, "decode") == 8
    # In order, none lost, each timed, and /metrics reads the same records.
    assert [r.step_index for r in records] == list(range(first_step, first_step + len(records)))
    assert all(r.duration_s > 0 for r in records)
    assert records[-1] in engine_step_records(engine)


def _child_environments() -> list[list[bytes]]:
    """The environments of this process's children (vLLM's engine core among them)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            # The parent pid is the 2nd field after the parenthesized command name.
            if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
                found.append((entry / "environ").read_bytes().split(b"\0"))
        except (OSError, ValueError, IndexError):
            continue
    return found


async def test_the_engine_core_process_spins_as_briefly_as_the_native_one(
    engine: VllmAsyncEngine,
) -> None:
    setting = f"GOMP_SPINCOUNT={ENGINE_GOMP_SPINCOUNT}".encode()
    assert any(setting in environ for environ in _child_environments())


async def test_abort_frees_the_request_in_vllm(engine: VllmAsyncEngine) -> None:
    long_prompt = tuple(range(1, 60))
    stream = engine.generate(request("long", long_prompt, 500, RequestClass.BULK))
    first = await stream.__anext__()
    assert not first.finished
    engine.abort("long")
    rest = [out async for out in stream]
    assert rest and rest[-1].finished and rest[-1].finish_reason == "abort"
    # A request after the abort runs to its end; vLLM's own counts then show nothing left.
    outputs = await collect(engine, request("after", tuple(range(1, 9)), 4, RequestClass.BULK))
    assert outputs[-1].finish_reason == "length"
    # Bounded polling (30 s, for a hang, not a speed): vLLM frees the request on its side.
    deadline = asyncio.get_running_loop().time() + 30.0
    while engine.vllm_request_counts() != (0, 0) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    assert engine.vllm_request_counts() == (0, 0)
    assert engine.load().kv_usage == 0.0
    assert sum(engine.load().running_by_class.values()) == 0


async def test_vllm_extensions_give_the_native_engines_tokens(
    engine: VllmAsyncEngine, model_dir: Path
) -> None:
    """repetition_penalty (over prompt and output) and min_tokens (a stop id held back) mean
    the same in mixgate's sampler as in vLLM's: greedy token ids are equal."""
    native = LLMEngine(model_dir, EngineConfig(device="cpu", max_model_len=1024))
    prompt = PROMPTS[1]
    native.add_request(request("first", prompt, 1, RequestClass.INTERACTIVE))
    first = next(out.new_token_ids[0] for out in native.step())
    cases = {
        "penalty": SamplingParams(
            max_tokens=16, temperature=0.0, ignore_eos=True, repetition_penalty=1.5
        ),
        "min_tokens": SamplingParams(
            max_tokens=16, temperature=0.0, stop_token_ids=(first,), min_tokens=4
        ),
    }
    expected: dict[str, list[int]] = {}
    for name, sampling in cases.items():
        native.add_request(GenerationRequest(name, prompt, sampling, RequestClass.INTERACTIVE))
    while native.has_unfinished_requests():
        for out in native.step():
            expected.setdefault(out.request_id, []).extend(out.new_token_ids)
    for name, sampling in cases.items():
        outputs = await collect(
            engine, GenerationRequest(name, prompt, sampling, RequestClass.INTERACTIVE)
        )
        assert [t for out in outputs for t in out.new_token_ids] == expected[name], name
    assert len(expected["min_tokens"]) >= 4
    assert first not in expected["min_tokens"][:4]


async def test_a_chat_gets_in_while_bulk_holds_every_slot(engine: VllmAsyncEngine) -> None:
    """vLLM never preempts to admit, so with bulk in every slot a chat used to wait for one to
    finish. Bulk runs long outputs here; the chat's first token must come while all of them
    still run (each then ends as aborted, none by its length)."""
    long_tokens = 900
    bulk = [
        engine.generate(request(f"slot{k}", (k + 3, k + 9, 17), long_tokens, RequestClass.BULK))
        for k in range(CONFIG.max_active_seqs)
    ]
    try:
        # Every bulk request is decoding: it holds its slot.
        for gen in bulk:
            assert not (await gen.__anext__()).finished
        chat = engine.generate(request("over", tuple(range(1, 9)), 4, RequestClass.INTERACTIVE))
        first = await chat.__anext__()
        assert first.new_token_ids
        for k in range(CONFIG.max_active_seqs):
            engine.abort(f"slot{k}")
        reasons = []
        for gen in bulk:
            outputs = [out async for out in gen]
            reasons.append(outputs[-1].finish_reason if outputs else "abort")
        assert reasons == ["abort"] * CONFIG.max_active_seqs
        rest = [out async for out in chat]
        assert rest[-1].finished and rest[-1].finish_reason == "length"
    finally:
        for k in range(CONFIG.max_active_seqs):
            engine.abort(f"slot{k}")
        for gen in bulk:
            await gen.aclose()
