"""The class-aware step composition handed to vLLM's scheduler (pure: runs without vLLM)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.backends.vllm.args import engine_kwargs
from engine.backends.vllm.step_plan import (
    StepComposition,
    StepKnobs,
    WorkItem,
    admission_limit,
    compose_step,
    knobs_from_config,
)
from engine.core.config import EngineConfig
from policies.request_class import RequestClass

INTER, BULK = RequestClass.INTERACTIVE, RequestClass.BULK
KNOBS = StepKnobs(
    step_token_budget=256,
    prefill_chunk_tokens=32,
    bulk_prefill_chunk_tokens=32,
    bulk_min_share=0.25,
    bulk_aging_s=5.0,
)


def item(key: int, cls: RequestClass, remaining: int, age_s: float = 0.0) -> WorkItem:
    return WorkItem(key, cls, remaining, age_s)


def test_interactive_decodes_are_walked_first_and_never_held_back() -> None:
    running = [
        item(0, BULK, 500),
        item(1, BULK, 1),
        item(2, INTER, 1),
        item(3, INTER, 200),
        item(4, INTER, 1),
    ]
    plan = compose_step(running, [], KNOBS)
    assert plan.running_order[:2] == (2, 4)
    assert plan.running_order[2] == 1
    assert {2, 4, 1} <= set(plan.running_order)
    assert not plan.held_back & {1, 2, 4}


def test_bulk_prefill_is_capped_per_step_while_a_chat_decodes() -> None:
    running = [item(k, BULK, 600) for k in range(5)] + [item(9, INTER, 1)]
    plan = compose_step(running, [], KNOBS)
    # One bulk chunk of 32 tokens beside the chat's decode: the others sit the step out.
    assert plan.bulk_prefill_tokens == 32
    assert plan.token_budget == 1 + 32
    assert len(plan.held_back) == 4
    assert plan.running_order == (9, 0)


def test_bulk_prefill_takes_the_whole_budget_with_no_interactive_request_in_the_engine() -> None:
    # 10 running bulk prefills and 3 bulk decodes; 50 more bulk requests wait.
    running = [item(k, BULK, 600) for k in range(10)] + [item(10 + k, BULK, 1) for k in range(3)]
    waiting = [item(100 + k, BULK, 900) for k in range(50)]
    plan = compose_step(running, waiting, KNOBS)
    # Work-conserving, as plain vLLM: the budget's 256 tokens all go to work (3 decodes and
    # 253 prefill tokens), in whole 32-token chunks but the last, not one chunk per step.
    assert plan.token_budget == KNOBS.step_token_budget
    assert plan.bulk_prefill_tokens == KNOBS.step_token_budget - 3
    assert plan.running_order[:3] == (10, 11, 12)
    assert len(plan.running_order) == 3 + 8
    assert len(plan.held_back) == 2


def test_a_lingering_chat_keeps_the_bulk_cap_on_with_none_in_the_engine() -> None:
    running = [item(k, BULK, 600) for k in range(10)]
    plan = compose_step(running, [], KNOBS, interactive_present=True)
    assert plan.bulk_prefill_tokens == KNOBS.bulk_prefill_chunk_tokens
    assert plan.token_budget == KNOBS.bulk_prefill_chunk_tokens


@pytest.mark.parametrize("waiting_bulk", [0, 1, 50, 400])
def test_a_chat_arriving_behind_many_bulk_requests_is_prefilled_in_the_next_step(
    waiting_bulk: int,
) -> None:
    # The engine is full of bulk work: 20 decodes, 8 running prefills, more waiting.
    running = [item(k, BULK, 1) for k in range(20)] + [item(20 + k, BULK, 700) for k in range(8)]
    waiting = [item(100 + k, BULK, 900, age_s=1.0) for k in range(waiting_bulk)]
    chat = item(999, INTER, 150)
    plan = compose_step(running, [*waiting, chat], KNOBS)
    # vLLM walks `running` first, then admits the waiting queue by priority (the chat first):
    # what running requests can take this step must leave the chat its whole first chunk.
    running_tokens = 20 + KNOBS.prefill_chunk_tokens * sum(
        1 for key in plan.running_order if key >= 20
    )
    assert plan.interactive_prefill_tokens == KNOBS.prefill_chunk_tokens
    assert plan.token_budget - running_tokens >= KNOBS.prefill_chunk_tokens
    # And the bulk cap holds while the chat is there.
    assert plan.bulk_prefill_tokens <= KNOBS.bulk_prefill_chunk_tokens


def test_under_mixgate_a_chat_prompt_takes_the_budget_left_in_one_step() -> None:
    # As engine_kwargs sets them for the mixgate policy: one request's chunk is the whole budget.
    knobs = knobs_from_config(
        engine_kwargs(
            Path("m"),
            EngineConfig(step_token_budget=512, bulk_prefill_chunk_tokens=128),
            max_model_len=4096,
        )["additional_config"]
    )
    assert knobs.prefill_chunk_tokens == 512
    running = [item(k, BULK, 1) for k in range(32)] + [item(40 + k, BULK, 900) for k in range(4)]
    chat = item(999, INTER, 706)
    waiting_plan = compose_step(running, [chat], knobs)
    # The waiting chat gets all that the 32 decodes leave (480 of its 706 tokens), not a
    # 128-token chunk; no running bulk prefill walks before it and eats that budget.
    assert waiting_plan.interactive_prefill_tokens == 512 - 32
    assert waiting_plan.bulk_prefill_tokens == 0
    assert waiting_plan.token_budget == 512
    assert set(waiting_plan.running_order) == set(range(32))
    # Once running, the chat's rest goes in the next step, still without bulk prefill (its
    # first token comes out of that step); once it decodes, bulk prefill has its cap again.
    rest = compose_step([*running, item(999, INTER, 226)], [], knobs)
    assert rest.interactive_prefill_tokens == 226
    assert rest.bulk_prefill_tokens == 0
    assert rest.running_order[:32] == tuple(range(32)) and 999 in rest.running_order
    decoding = compose_step([*running, item(999, INTER, 1)], [], knobs)
    assert decoding.bulk_prefill_tokens == 128


def test_interactive_prefill_takes_the_budget_before_fresh_bulk() -> None:
    running = [item(0, BULK, 600), item(1, INTER, 300)]
    plan = compose_step(running, [], KNOBS)
    assert plan.interactive_prefill_tokens == 32  # one interactive chunk (its whole demand)
    assert plan.running_order[0] == 1
    assert plan.token_budget <= KNOBS.step_token_budget


def test_a_waiting_interactive_prompt_holds_back_partial_bulk_chunks() -> None:
    # Aged bulk, owed its share past the slack (two shares of 48 tokens), is due 48 tokens in a
    # chat's step when the step before deferred it.
    knobs = StepKnobs(64, 32, 48, 0.75, 5.0)
    running = [item(0, BULK, 600, age_s=6.0), item(1, BULK, 600, age_s=6.0)]
    waiting = [item(2, INTER, 100)]
    plan = compose_step(running, waiting, knobs, deferred_steps_in_a_row=1, bulk_owed_tokens=96)
    # 48 tokens of bulk allowance = one whole 32-token chunk; the waiting prompt gets the rest.
    assert plan.running_order == (0,)
    assert plan.held_back == frozenset({1})
    assert plan.token_budget == 64


def test_a_chat_prefill_step_takes_no_bulk_prefill_though_vllm_would_admit_it_after_the_chat() -> (
    None
):
    # 16 bulk decodes, bulk prefills running and waiting, a chat waiting: vLLM walks the
    # decodes, admits the chat, then admits waiting bulk with whatever budget is left.
    running = [item(k, BULK, 1) for k in range(16)] + [item(20, BULK, 900)]
    waiting = [item(100 + k, BULK, 900) for k in range(10)] + [item(999, INTER, 150)]
    knobs = StepKnobs(512, 512, 128, 0.2, 5.0)
    plan = compose_step(running, waiting, knobs, interactive_present=True)
    assert plan.interactive_prefill_tokens == 150
    assert plan.bulk_prefill_tokens == 0
    # The budget is the decodes and the chat's prompt: nothing is left for a bulk chunk.
    assert plan.token_budget == 16 + 150
    assert plan.held_back == frozenset({20})
    # Nor may a waiting bulk request start: a chat prompt that hits the prefix cache computes
    # fewer tokens than the budget planned for it, and vLLM would admit bulk into the rest.
    assert not plan.admits_waiting_bulk
    # The step after (the chat decoding) takes its bulk chunk again.
    after = compose_step([*running, item(999, INTER, 1)], waiting[:-1], knobs)
    assert after.bulk_prefill_tokens == 128
    # The running bulk prefill takes that chunk whole (900 tokens left): none starts beside it.
    assert after.held_back == frozenset() and not after.admits_waiting_bulk
    # Once it is down to its last 28 tokens, a waiting one starts in what it leaves.
    ending = [*running[:16], item(20, BULK, 28), item(999, INTER, 1)]
    last = compose_step(ending, waiting[:-1], knobs)
    assert last.bulk_prefill_tokens == 128 and last.admits_waiting_bulk


def test_aged_bulk_is_owed_its_share_and_paid_beside_a_chat_once_past_the_slack() -> None:
    running = [item(0, BULK, 600, age_s=6.0)] + [item(k, INTER, 1) for k in range(1, 9)]
    waiting = [item(20 + k, INTER, 200) for k in range(8)]
    fresh = compose_step([item(0, BULK, 600, age_s=0.1)] + running[1:], waiting, KNOBS)
    assert not fresh.bulk_aged and fresh.bulk_prefill_tokens == 0
    assert fresh.deferred_bulk and fresh.owed_bulk_tokens == 0  # nothing aged is owed
    # A chat's prefill step defers aged bulk, and owes it its share (64 tokens)...
    first = compose_step(running, waiting, KNOBS)
    assert first.bulk_aged and first.deferred_bulk
    assert first.bulk_prefill_tokens == 0
    assert first.owed_bulk_tokens == 64

    # ...the next chat's step never defers, but within the slack (two shares) it pays nothing:
    # a pair of chats gets both steps to itself.
    def after(step: StepComposition) -> StepComposition:
        return compose_step(
            running,
            waiting,
            KNOBS,
            deferred_steps_in_a_row=step.deferred_steps_in_a_row,
            bulk_owed_tokens=step.owed_bulk_tokens,
        )

    second = after(first)
    assert not second.deferred_bulk and second.bulk_prefill_tokens == 0
    assert second.interactive_prefill_tokens == first.interactive_prefill_tokens
    assert second.owed_bulk_tokens == 128
    # The step after that may defer again (bulk runs at least every other step)...
    third = after(second)
    assert third.deferred_bulk and third.bulk_prefill_tokens == 0
    assert third.owed_bulk_tokens == 192
    # ...and the one after it pays what is past the slack (128 tokens), as far as the one bulk
    # prompt's chunk (32) goes, out of the chats' prefill.
    fourth = after(third)
    assert not fourth.deferred_bulk and fourth.bulk_prefill_tokens == 32
    assert fourth.interactive_prefill_tokens < first.interactive_prefill_tokens
    assert fourth.owed_bulk_tokens == 192 + 64 - 32


@pytest.mark.parametrize("policy", ["mixgate", "priority", "fcfs"])
def test_the_envelope_maps_onto_vllm_arguments(policy: str, tmp_path: object) -> None:
    config = EngineConfig(
        max_active_seqs=8,
        step_token_budget=96,
        bulk_prefill_chunk_tokens=24,
        kv_cache_bytes=1 << 24,
        scheduling_policy=policy,
    )
    kwargs = engine_kwargs(tmp_path, config, max_model_len=512)  # type: ignore[arg-type]
    if policy == "mixgate":
        # Admission capped at the envelope's slots; runner room for interactive overcommit.
        assert kwargs["max_num_active_seqs"] == 8
        assert kwargs["max_num_seqs"] == 16
    else:
        assert kwargs["max_num_seqs"] == 8
        assert "max_num_active_seqs" not in kwargs
    assert kwargs["max_num_batched_tokens"] == 96
    # One request's chunk: under mixgate the whole budget (the class-aware scheduler caps bulk
    # prefill itself, and a chat's prompt is not cut into bulk-sized chunks); else the bulk chunk.
    assert kwargs["long_prefill_token_threshold"] == (96 if policy == "mixgate" else 24)
    assert kwargs["kv_cache_memory_bytes"] == 1 << 24
    assert kwargs["scheduling_policy"] == ("fcfs" if policy == "fcfs" else "priority")
    assert ("scheduler_cls" in kwargs) is (policy == "mixgate")
    if policy == "mixgate":
        knobs = kwargs["additional_config"]["mixgate"]
        assert knobs["interactive_linger_s"] == config.interactive_linger_s
        assert knobs_from_config({"mixgate": knobs}).interactive_linger_s == 2.0
        for given, read in ((2, 2.0), (None, None)):
            changed = {**knobs, "interactive_linger_s": given}
            assert knobs_from_config({"mixgate": changed}).interactive_linger_s == read
        older = {k: v for k, v in knobs.items() if k != "interactive_linger_s"}
        assert knobs_from_config({"mixgate": older}).interactive_linger_s == 2.0


def test_waiting_chats_raise_the_admission_cap_and_bulk_never_does() -> None:
    def limit(in_use: int, waiting_interactive: int, running_interactive: int = 0) -> int:
        return admission_limit(
            slots_in_use=in_use,
            running_interactive=running_interactive,
            waiting_interactive=waiting_interactive,
            max_active_seqs=32,
            runner_slots=64,
        )

    # Nobody waits for a chat: the envelope's cap, as before.
    assert limit(10, 0) == 32
    assert limit(32, 0) == 32
    # Every slot taken by bulk: three waiting chats all get in (vLLM admits them first).
    assert limit(32, 3) == 35
    # Overcommitted (32 bulk, 3 chats): no room for bulk (the cap is what RUNNING holds) ...
    assert limit(35, 0, running_interactive=3) == 35
    # ... and under the cap, a chat takes a free slot, and bulk keeps all 32 of its own.
    assert limit(30, 2) == 34
    assert limit(30, 5) == 37
    # A running chat sits on top of bulk's slots: 31 bulk + 1 chat leaves bulk one more.
    assert limit(32, 0, running_interactive=1) == 33
    # Never past the runner's slots.
    assert limit(62, 5) == 64

    # A step that admits no bulk (`StepComposition.admits_waiting_bulk`): room for the waiting
    # chats alone, which vLLM admits first.
    def chats_only(in_use: int, waiting_interactive: int) -> int:
        return admission_limit(
            slots_in_use=in_use,
            running_interactive=0,
            waiting_interactive=waiting_interactive,
            max_active_seqs=32,
            runner_slots=64,
            admit_bulk=False,
        )

    assert chats_only(10, 2) == 12
    assert chats_only(10, 0) == 10
    assert chats_only(62, 5) == 64
