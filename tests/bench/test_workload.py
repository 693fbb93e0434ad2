"""Workload specs, their TOML form, and the request plans they make."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from bench.load.workload import (
    BUILTIN_WORKLOADS,
    Arrival,
    ClassLoad,
    ClosedLoopSource,
    LengthDist,
    Workload,
    dump_workload,
    load_workload,
    parse_workload,
    plan_open_loop,
    prompt_messages,
)
from policies.request_class import RequestClass

CHAT, BULK = RequestClass.INTERACTIVE, RequestClass.BULK

BASE = """
name = "t"
description = "test"
duration_s = 10.0
seed = 3

[interactive]
arrival = {kind = "poisson", rate_per_s = 2.0}
prompt_tokens = {kind = "uniform", min = 10, max = 20}
output_tokens = {kind = "fixed", value = 8}
"""


def _load(cls: RequestClass, arrival: Arrival) -> ClassLoad:
    return ClassLoad(cls, arrival, LengthDist("fixed", value=100), LengthDist("fixed", value=10))


def _workload(duration_s: float = 10.0, seed: int = 0, **classes: Arrival) -> Workload:
    loads = {RequestClass(k): _load(RequestClass(k), a) for k, a in classes.items()}
    return Workload("w", "", duration_s, seed, loads)


@pytest.mark.parametrize("name", BUILTIN_WORKLOADS)
def test_every_builtin_loads_plans_and_round_trips(name: str) -> None:
    workload = load_workload(name)
    assert workload.name == name
    plan = plan_open_loop(workload)
    assert plan and all(0 <= req.at_s < workload.duration_s for req in plan)
    assert all(req.prompt_tokens <= 4096 for req in plan)
    assert parse_workload(dump_workload(workload)) == workload


def test_load_workload_from_a_path_and_unknown_name(tmp_path: Path) -> None:
    path = tmp_path / "w.toml"
    path.write_text(BASE)
    assert load_workload(path).name == "t"
    with pytest.raises(ValueError, match="neither a file nor one of chat-only"):
        load_workload("no-such-workload")


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("seed = 3", "seed = 3\nsped = 1", r"workload\.sped: unknown key"),
        ("rate_per_s = 2.0", "rate_per_s = -2.0", r"interactive\.arrival\.rate_per_s: must be"),
        ("min = 10, max = 20", "min = 30, max = 20", r"interactive\.prompt_tokens\.max: must be"),
        ('kind = "poisson"', 'kind = "gaussian"', r"interactive\.arrival\.kind: unknown kind"),
        (
            'kind = "fixed", value = 8',
            'kind = "fixed", value = 8, sigma = 1.0',
            r"interactive\.output_tokens\.sigma: unknown key",
        ),  # fmt: skip
        ("rate_per_s = 2.0", "rate_per_s = true", r"interactive\.arrival\.rate_per_s: must be a"),
        ("duration_s = 10.0", "duration_s = 0", r"workload\.duration_s: must be > 0"),
        ("value = 8", "value = 8.5", r"interactive\.output_tokens\.value: must be an integer"),
    ],
)
def test_bad_specs_name_the_key(old: str, new: str, message: str) -> None:
    assert old in BASE
    with pytest.raises(ValueError, match=message):
        parse_workload(BASE.replace(old, new))


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('cancel = {probability = 1.5, when = "mid_stream"}', r"cancel\.probability: must be a"),
        ('cancel = {probability = 0.1, when = "never"}', r"cancel\.when: unknown"),
        ("long_context = {probability = 0.2}", r"long_context\.prompt_tokens: required"),
        ("deadline_s = -1", r"interactive\.deadline_s: must be > 0"),
    ],
)
def test_bad_class_options_name_the_key(table: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_workload(BASE + table + "\n")


def test_invalid_toml_and_missing_tables() -> None:
    with pytest.raises(ValueError, match="not valid TOML"):
        parse_workload("name = ")
    with pytest.raises(ValueError, match=r"workload\.classes: a workload needs"):
        parse_workload(BASE.split("[interactive]")[0])


def test_length_distributions_stay_in_bounds() -> None:
    rng = random.Random(0)
    lognormal = LengthDist("lognormal", median=100.0, sigma=2.0, min=10, max=500)
    draws = [lognormal.sample(rng) for _ in range(2000)]
    assert min(draws) == 10 and max(draws) == 500  # the clamp is hit on both sides
    choice = LengthDist("choice", choices=(1, 7), weights=(0.0, 1.0))
    assert {choice.sample(rng) for _ in range(50)} == {7}
    with pytest.raises(ValueError, match="weights: must be as many"):
        LengthDist("choice", choices=(1, 2), weights=(1.0,))


def test_plans_are_deterministic_per_seed_and_class() -> None:
    mixed = load_workload("mixed")
    assert plan_open_loop(mixed) == plan_open_loop(load_workload("mixed"))
    assert plan_open_loop(replace(mixed, seed=2)) != plan_open_loop(mixed)
    # Removing the bulk class leaves the chat plan exactly as it was in the mix.
    chat_in_mix = [req for req in plan_open_loop(mixed) if req.request_class is CHAT]
    assert plan_open_loop(mixed.only(CHAT)) == chat_in_mix
    assert [req.at_s for req in chat_in_mix] == sorted(req.at_s for req in chat_in_mix)


def test_poisson_count_is_near_rate_times_duration() -> None:
    plan = plan_open_loop(_workload(duration_s=2000.0, interactive=Arrival("poisson", 5.0)))
    # Expected 10000, sd 100: a 5-sigma bound with a fixed seed never flakes.
    assert abs(len(plan) - 10_000) < 500


def test_burst_adds_its_rate_only_inside_its_window() -> None:
    arrival = Arrival("burst", rate_per_s=2.0, burst_rate_per_s=20.0, burst_start_s=400.0,
                      burst_duration_s=200.0)  # fmt: skip
    plan = plan_open_loop(_workload(duration_s=1000.0, seed=4, interactive=arrival))
    inside = sum(1 for req in plan if 400.0 <= req.at_s < 600.0)
    outside = len(plan) - inside
    assert abs(inside / 200.0 - 22.0) < 2.0
    assert abs(outside / 800.0 - 2.0) < 0.5


def test_backlog_is_all_at_zero_and_cancellations_only_when_drawn() -> None:
    workload = load_workload("bulk-only")
    plan = plan_open_loop(workload)
    assert len(plan) == 400 and {req.at_s for req in plan} == {0.0}
    assert all(512 <= req.prompt_tokens <= 1024 and 32 <= req.max_tokens <= 128 for req in plan)
    assert all(req.cancel is None for req in plan)
    chat = plan_open_loop(load_workload("chat-only"))
    cancelled = [req for req in chat if req.cancel is not None]
    assert 0 < len(cancelled) < len(chat) // 4


def test_long_context_tail() -> None:
    chat = [r for r in plan_open_loop(load_workload("long-context")) if r.request_class is CHAT]
    long = [r for r in chat if r.prompt_tokens >= 2000]
    assert 0.08 < len(long) / len(chat) < 0.35


def test_only_and_scaled() -> None:
    mixed = load_workload("mixed")
    bulk = mixed.only(BULK)
    assert set(bulk.classes) == {BULK} and bulk.seed == mixed.seed and bulk.name != mixed.name
    double = mixed.scaled(2.0)
    assert double.name == "mixed@x2"
    assert double.classes[CHAT].arrival.rate_per_s == 8.0
    assert double.classes[BULK].arrival.count == 800
    closed = _workload(interactive=Arrival("closed", concurrency=3)).scaled(0.1)
    assert closed.classes[CHAT].arrival.concurrency == 1
    with pytest.raises(ValueError, match="load_factor"):
        mixed.scaled(0.0)
    with pytest.raises(ValueError, match="bulk: not in workload"):
        load_workload("chat-only").only(BULK)


def test_closed_loop_source_is_deterministic_and_not_in_the_open_plan() -> None:
    workload = _workload(seed=5, interactive=Arrival("closed", concurrency=2))
    assert plan_open_loop(workload) == []
    first = [ClosedLoopSource(workload, CHAT).next_request(float(t)) for t in range(3)]
    source = ClosedLoopSource(workload, CHAT)
    again = [source.next_request(float(t)) for t in range(3)]
    assert first[0] == again[0] and [r.index for r in again] == [0, 1, 2]
    assert again[2].at_s == 2.0
    with pytest.raises(ValueError, match="not a closed-loop class"):
        ClosedLoopSource(load_workload("chat-only"), CHAT)


@pytest.mark.parametrize("num_tokens", [30, 150, 1000, 4000])
def test_prompt_messages_token_count(tiny_model_dir: Path, num_tokens: int) -> None:
    from engine.text.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_pretrained(tiny_model_dir)
    messages = prompt_messages(random.Random(num_tokens), num_tokens)
    assert abs(len(tokenizer.encode_chat(messages)) - num_tokens) <= 0.15 * num_tokens
    assert messages[0]["content"].isascii()
