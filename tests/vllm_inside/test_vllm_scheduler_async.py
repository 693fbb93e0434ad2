"""The class-aware scheduler under vLLM's async scheduling, driven step by step on CPU.

On GPUs vLLM schedules step N+1 while step N runs (async scheduling, its default with the
multiproc executor); vLLM's CPU platform turns that off, so a CPU engine never shows it. Here the
scheduler is built the way vLLM's engine core builds it (its config from the same engine
arguments `VllmAsyncEngine` passes, `get_scheduler_cls()`, the same constructor arguments), with
async scheduling set on or off, and driven as the engine core drives it: with async scheduling
the next step is scheduled before the last one's output is in (a batch queue of two), without
it each output comes back before the next step. The model runner's part (a sampled token per
request whose prompt is done) is scripted: what is under test is the scheduling, not the model.
"""

from __future__ import annotations

import time
import warnings
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from tests.dependencies import require_module

require_module("vllm", "run with the vLLM environment's python (.venv-vllm)")

# vLLM's imports warn (deprecations in its dependencies), and collection turns warnings into
# errors; they are not ours.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    warnings.simplefilter("ignore", FutureWarning)
    import torch  # noqa: E402
    from vllm.engine.arg_utils import EngineArgs  # noqa: E402
    from vllm.sampling_params import SamplingParams  # noqa: E402
    from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
    from vllm.v1.kv_cache_interface import (  # noqa: E402
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
    )
    from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
    from vllm.v1.request import Request  # noqa: E402
    from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from engine.backends.vllm.args import engine_kwargs  # noqa: E402
from engine.backends.vllm.scheduler import (  # noqa: E402
    ClassAwareAsyncScheduler,
    ClassAwareScheduler,
)
from engine.core.step_record import StepRecord  # noqa: E402
from engine.model.make_model import make_model  # noqa: E402
from engine.text.tokenizer import Tokenizer  # noqa: E402
from policies.request_class import RequestClass  # noqa: E402

# The engine tests' envelope: a 64-token step budget, 16-token bulk chunks, never aged, and a cap
# that lifts as soon as no chat is in the engine (so both sides of it show).
from tests.vllm_inside.test_vllm_engine_inside import BULK_CHUNK_TOKENS, CONFIG  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning"),
    pytest.mark.timeout(300),
]

BLOCK_TOKENS = 16
NUM_BLOCKS = 256
BULK_PROMPT_TOKENS = 200
CHAT_PROMPT_TOKENS = 40
OUTPUT_TOKENS = 8
# The scheduler's step at which the chat arrives: the bulk prompts are mid-prefill by then.
CHAT_ARRIVES_AT_STEP = 3
# vLLM's batch queue under async scheduling (the executor's max_concurrent_batches).
ASYNC_BATCH_QUEUE = 2


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("vllm-sched-model") / "small", "small", seed=0)


@dataclass
class Step:
    """What one `schedule()` gave: tokens per request id, and which requests sample a token."""

    tokens: dict[str, int]
    samples: set[str]
    interactive: set[str]
    prefill_tokens: dict[RequestClass, int] = field(default_factory=dict)


def _prompt(seed: int, length: int) -> list[int]:
    # Distinct per request: a shared prefix would hit vLLM's prefix cache and skip prefill.
    return [(seed * 131 + i * 7) % 250 + 1 for i in range(length)]


class ScriptedEngineCore:
    """Drives a scheduler as vLLM's engine core does (`EngineCore.step` without async
    scheduling, `step_with_batch_queue` with it), with a scripted model runner."""

    def __init__(self, scheduler: Any, batch_queue: int, sampled_token: int, hasher: Any):
        self.scheduler = scheduler
        self.batch_queue = batch_queue
        self.sampled_token = sampled_token
        self.hasher = hasher
        self.in_flight: deque[tuple[Any, Step]] = deque()
        self.steps: list[Step] = []
        # Steps scheduled while an earlier step's output was still out.
        self.overlapped_steps = 0
        self.outputs: dict[str, list[int]] = {}
        self.finish_reasons: dict[str, str] = {}

    def add(self, request_id: str, prompt: list[int], request_class: RequestClass) -> None:
        self.scheduler.add_request(
            Request(
                request_id,
                prompt,
                SamplingParams(max_tokens=OUTPUT_TOKENS, ignore_eos=True, temperature=0.0),
                None,
                arrival_time=time.time(),
                priority=0 if request_class is RequestClass.INTERACTIVE else 1,
                block_hasher=self.hasher,
            )
        )

    def schedule(self) -> Step:
        output = self.scheduler.schedule()
        requests = self.scheduler.requests
        step = Step(
            tokens=dict(output.num_scheduled_tokens),
            # Read now: by the time its output is in, a later step has moved the request on.
            samples={r for r in output.num_scheduled_tokens if not requests[r].is_prefill_chunk},
            interactive={r for r in output.num_scheduled_tokens if requests[r].priority == 0},
        )
        for request_id, tokens in step.tokens.items():
            request = requests[request_id]
            computed_before = request.num_computed_tokens - tokens
            prefill = max(0, min(tokens, request.num_prompt_tokens - computed_before))
            cls = RequestClass.INTERACTIVE if request_id in step.interactive else RequestClass.BULK
            step.prefill_tokens[cls] = step.prefill_tokens.get(cls, 0) + prefill
        if output.total_num_scheduled_tokens:
            self.overlapped_steps += bool(self.in_flight)
            self.in_flight.append((output, step))
            self.steps.append(step)
        while self.in_flight and (
            len(self.in_flight) >= self.batch_queue or not output.total_num_scheduled_tokens
        ):
            self._model_output_in()
        return step

    def _model_output_in(self) -> None:
        output, step = self.in_flight.popleft()
        ids = list(step.tokens)
        runner_output = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=[[self.sampled_token] if r in step.samples else [] for r in ids],
        )
        for engine_outputs in self.scheduler.update_from_output(output, runner_output).values():
            for out in engine_outputs.outputs:
                self.outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
                if out.finish_reason is not None:
                    self.finish_reasons[out.request_id] = str(out.finish_reason)

    def run(self, max_steps: int = 500) -> Iterator[Step]:
        for _ in range(max_steps):
            if not (self.scheduler.has_requests() or self.in_flight):
                return
            yield self.schedule()
        raise AssertionError(f"not done in {max_steps} steps")


@pytest.fixture(params=[False, True], ids=["sync", "async"])
def async_scheduling(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture
def step_socket(tmp_path: Path) -> Iterator[tuple[str, zmq.Socket[bytes]]]:
    """Where the scheduler pushes its step records (the gateway's end, bound first)."""
    context = zmq.Context()
    socket = context.socket(zmq.PULL)
    address = f"ipc://{tmp_path / 'steps'}"
    socket.bind(address)
    try:
        yield address, socket
    finally:
        socket.close(linger=0)
        context.term()


@pytest.fixture
def core(
    model_dir: Path, async_scheduling: bool, step_socket: tuple[str, zmq.Socket[bytes]]
) -> Iterator[ScriptedEngineCore]:
    kwargs = engine_kwargs(model_dir, CONFIG, CONFIG.max_model_len, step_sink=step_socket[0])
    vllm_config = EngineArgs(**kwargs).create_engine_config()
    # What vLLM settles on a GPU; its CPU platform has just set it off.
    vllm_config.scheduler_config.async_scheduling = async_scheduling
    vllm_config.cache_config.num_gpu_blocks = NUM_BLOCKS
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["model.layers.0.self_attn.attn"],
                FullAttentionSpec(
                    block_size=BLOCK_TOKENS, num_kv_heads=2, head_size=32, dtype=torch.float32
                ),
            )
        ],
    )
    scheduler_cls = vllm_config.scheduler_config.get_scheduler_cls()
    scheduler = scheduler_cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK_TOKENS,
    )
    hash_fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    # A token that is text on its own, so no chat waits for its first text.
    (sampled_token,) = Tokenizer.from_pretrained(model_dir).encode("a")
    try:
        yield ScriptedEngineCore(
            scheduler,
            ASYNC_BATCH_QUEUE if async_scheduling else 1,
            sampled_token,
            get_request_block_hasher(BLOCK_TOKENS, hash_fn),
        )
    finally:
        scheduler.shutdown()


def test_the_scheduler_vllm_builds_is_async_exactly_when_vllm_schedules_async(
    core: ScriptedEngineCore, async_scheduling: bool
) -> None:
    assert isinstance(core.scheduler, ClassAwareScheduler)
    assert isinstance(core.scheduler, AsyncScheduler) == async_scheduling
    assert isinstance(core.scheduler, ClassAwareAsyncScheduler) == async_scheduling


def test_a_chat_over_bulk_prefill_is_composed_alike_with_steps_in_flight(
    core: ScriptedEngineCore, async_scheduling: bool, step_socket: tuple[str, zmq.Socket[bytes]]
) -> None:
    bulk_ids = [f"bulk-{i}" for i in range(3)]
    for i, request_id in enumerate(bulk_ids):
        core.add(request_id, _prompt(i, BULK_PROMPT_TOKENS), RequestClass.BULK)
    steps: list[Step] = []
    chat_added_at = -1
    for step in core.run():
        steps.append(step)
        if len(steps) == CHAT_ARRIVES_AT_STEP:
            core.add("chat", _prompt(9, CHAT_PROMPT_TOKENS), RequestClass.INTERACTIVE)
            chat_added_at = len(steps)

    # Every request ran to its length, each token once: no placeholder leaked or doubled.
    assert core.finish_reasons == dict.fromkeys([*bulk_ids, "chat"], "length")
    assert {r: len(t) for r, t in core.outputs.items()} == dict.fromkeys(
        [*bulk_ids, "chat"], OUTPUT_TOKENS
    )
    assert all(r.num_output_placeholders == 0 for r in core.scheduler.requests.values())
    assert core.scheduler.kv_cache_manager.usage == 0.0
    # Async scheduling really overlapped steps; without it none did.
    assert (core.overlapped_steps > 0) == async_scheduling

    # The chat's whole prompt in the very next step, with no bulk prefill beside it.
    chat_prefill_step = steps[chat_added_at]
    assert chat_prefill_step.tokens.get("chat") == CHAT_PROMPT_TOKENS
    assert chat_prefill_step.prefill_tokens.get(RequestClass.BULK, 0) == 0
    # The chat decodes in every step until it ends: with steps in flight a decode is
    # scheduled again before its token is back (a Scheduler under a batch queue runs it every
    # other step instead, doubling its inter-token time).
    chat_step_indices = [i for i, s in enumerate(steps) if "chat" in s.tokens]
    assert chat_step_indices == list(range(chat_added_at, chat_added_at + OUTPUT_TOKENS))
    # While the chat runs, bulk prefill stays within its chunk; once it has left (the cap
    # lifts at once here) bulk takes the whole budget again.
    chat_steps = [s for s in steps if "chat" in s.tokens]
    assert all(s.prefill_tokens.get(RequestClass.BULK, 0) <= BULK_CHUNK_TOKENS for s in chat_steps)
    last_chat_step = chat_step_indices[-1]
    after = [s.prefill_tokens.get(RequestClass.BULK, 0) for s in steps[last_chat_step + 1 :]]
    assert max(after) > BULK_CHUNK_TOKENS

    # One step record per step that ran tokens, in order, with the tokens that step ran: the
    # records pair each step with its own output even when the next was scheduled first.
    address, socket = step_socket
    decoder = msgspec.msgpack.Decoder(StepRecord)
    records = []
    while socket.poll(timeout=2000):
        records.append(decoder.decode(socket.recv()))
        if len(records) == len(core.steps):
            break
    assert [r.step_index for r in records] == list(range(len(core.steps)))
    assert [sum(r.tokens_by_kind.values()) for r in records] == [
        sum(s.tokens.values()) for s in core.steps
    ]
    chat_prefill = (RequestClass.INTERACTIVE, "prefill")
    assert [r.tokens_by_kind.get(chat_prefill, 0) for r in records] == [
        s.prefill_tokens.get(RequestClass.INTERACTIVE, 0) for s in core.steps
    ]
