"""Aged bulk's share as a debt (policies/bulk_guarantee.py): hand-worked arithmetic, and the
documented bound over random runs of steps."""

from __future__ import annotations

import random

import pytest

from policies.bulk_guarantee import (
    BULK_GUARANTEE_SLACK_STEPS,
    bulk_due_tokens,
    bulk_guarantee_tokens,
    bulk_owed_after_step,
)

BUDGET, SHARE = 512, 0.25  # a share of 128 tokens; the slack is two of them
SHARE_TOKENS = bulk_guarantee_tokens(BUDGET, SHARE)


def _due(owed: int, accrues: bool = True) -> int:
    return bulk_due_tokens(
        owed_tokens=owed, step_token_budget=BUDGET, bulk_min_share=SHARE, accrues=accrues
    )


def _after(owed: int, accrues: bool, ran: int) -> int:
    return bulk_owed_after_step(
        owed_tokens=owed,
        step_token_budget=BUDGET,
        bulk_min_share=SHARE,
        accrues=accrues,
        bulk_tokens_run=ran,
    )


def test_a_step_is_due_only_what_is_owed_past_the_slack() -> None:
    assert SHARE_TOKENS == 128 and BULK_GUARANTEE_SLACK_STEPS == 2
    assert _due(0) == 0  # one share owed, within the slack
    assert _due(128) == 0  # two: a pair of chats pays nothing
    assert _due(256) == 128  # a third share tips it over by one
    assert _due(256, accrues=False) == 0  # a step that does not hold bulk back owes nothing new
    assert _due(2000) == BUDGET  # never more than a step's budget


def test_what_a_step_runs_for_bulk_pays_its_debt_down() -> None:
    assert _after(0, accrues=True, ran=0) == 128
    assert _after(128, accrues=True, ran=8) == 248  # a chat's step with 8 bulk decodes
    assert _after(200, accrues=False, ran=92) == 108  # a decode step: a chunk and decodes
    assert _after(50, accrues=False, ran=92) == 0  # never below nothing
    # Bounded by the slack and a budget: a debt that could not be paid (no bulk prompt left)
    # must not come due later as one long step.
    assert _after(5000, accrues=True, ran=0) == 256 + BUDGET


def _paying_step(owed: int, rng: random.Random) -> int:
    """What a step for which a chat prompt competes runs for bulk: what it is due, and now and
    then a few decodes more."""
    return _due(owed) + rng.choice((0, 0, 3, 17))


@pytest.mark.parametrize("seed", range(20))
def test_the_debt_keeps_every_unpaid_share_and_a_chat_step_brings_it_back_to_the_slack(
    seed: int,
) -> None:
    """The engines' rule, stepped at random: a step may defer bulk (never two in a row), a
    chat prompt may compete, and a step runs what it is due plus whatever bulk it runs besides
    (a decode step: its chunk and decodes, or nothing when bulk has no prompt)."""
    rng = random.Random(seed)
    slack = BULK_GUARANTEE_SLACK_STEPS * SHARE_TOKENS
    owed, deferred_last, held_steps, bulk_run = 0, False, 0, 0
    for _ in range(2000):
        competes = rng.random() < 0.7
        deferred = competes and not deferred_last and rng.random() < 0.6
        if deferred:
            ran = 0
        elif competes:
            ran = _paying_step(owed, rng)
        else:
            ran = rng.choice((0, 20, 92, 150))
        owed_before, owed = owed, _after(owed, accrues=deferred or competes, ran=ran)
        held_steps += deferred or competes
        bulk_run += ran
        # Every share not yet paid is owed (what ran beyond it is not banked)...
        assert SHARE_TOKENS * held_steps - bulk_run <= owed <= slack + BUDGET
        # ...and a chat's step that does not defer leaves at most the slack owed, or pays a
        # whole budget toward it.
        if competes and not deferred:
            assert owed <= max(slack, owed_before + SHARE_TOKENS - BUDGET)
        deferred_last = deferred


def test_under_a_flood_of_chat_prompts_bulk_gets_its_share_every_step_on_average() -> None:
    # Every step has a chat prompt, every other one defers bulk (the native engine's rule).
    rng = random.Random(1)
    owed, held_steps, bulk_run, worst_behind = 0, 0, 0, 0
    for step in range(1000):
        deferred = step % 2 == 0
        ran = 0 if deferred else _paying_step(owed, rng)
        owed = _after(owed, accrues=True, ran=ran)
        held_steps, bulk_run = held_steps + 1, bulk_run + ran
        worst_behind = max(worst_behind, SHARE_TOKENS * held_steps - bulk_run)
    assert worst_behind <= (BULK_GUARANTEE_SLACK_STEPS + 1) * SHARE_TOKENS
    # In lumps of at most two shares a paying step, as the per-step rule paid before.
    assert bulk_run >= SHARE_TOKENS * 1000 - (BULK_GUARANTEE_SLACK_STEPS + 1) * SHARE_TOKENS
