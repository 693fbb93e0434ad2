"""Aged bulk's guaranteed share of the engine, kept as a debt over steps (pure).

Once bulk work has waited `bulk_aging_s`, it is owed `bulk_min_share` of the step budget in
every step in which interactive work holds it back: a step for which an interactive prompt
competes, or one that defers bulk for a chat's first token (`policies/step_budget.py`,
`defers_bulk`). What a step owes accrues; every bulk token a step runs (decodes included, in
any step) pays it off. A step for which a chat prompt competes must pay only what is owed
beyond `BULK_GUARANTEE_SLACK_STEPS` steps' guarantee, so over any run of steps

    bulk tokens >= guarantee x (steps that held bulk back) - the slack - two steps' guarantee

(one for the step that tipped the debt over the slack, one for a deferring step after it).

Why a debt and not a per-step rule: the rule it replaces guaranteed the share in every such
step, and a step that deferred bulk passed its share to the next one, which paid both. When two
or three chats arrived together (common at 4 chats a second), the second chat's prefill step
carried ~200 bulk prefill tokens beside it: 34-55 ms instead of ~20-30, and those steps sat
under 4 of the 10 slowest chats of two `bench breakdown --workload mixed --engine native` runs
(`small`, 2-vCPU AMD EPYC). Bulk was not starved by such a pair: the decode-only steps around
it run a bulk chunk and every bulk decode. With the slack, a pair or a triple of chats pays
nothing and the steps after them pay it back; a sustained flood of chat prompts, in which
every step holds bulk back, still pays the share every step on average, in the same lumps as
before (two steps' guarantee every other step).
"""

from __future__ import annotations

import math
from typing import Final

__all__ = [
    "BULK_GUARANTEE_SLACK_STEPS",
    "bulk_due_tokens",
    "bulk_guarantee_tokens",
    "bulk_owed_after_step",
]

# How many steps' guarantee aged bulk may fall behind before a chat's prefill step must pay
# (see the module docstring): two covers a chat's deferring prefill step and the next chat's.
BULK_GUARANTEE_SLACK_STEPS: Final = 2


def bulk_guarantee_tokens(step_token_budget: int, bulk_min_share: float) -> int:
    """Tokens aged bulk is owed for one step that holds it back."""
    return math.ceil(bulk_min_share * step_token_budget)


def _slack_tokens(step_token_budget: int, bulk_min_share: float) -> int:
    return BULK_GUARANTEE_SLACK_STEPS * bulk_guarantee_tokens(step_token_budget, bulk_min_share)


def bulk_due_tokens(
    *, owed_tokens: int, step_token_budget: int, bulk_min_share: float, accrues: bool
) -> int:
    """Bulk tokens (decodes included) a step for which a chat prompt competes must run: what is
    owed, this step's own share included if `accrues`, beyond the slack; at most the budget."""
    own = bulk_guarantee_tokens(step_token_budget, bulk_min_share) if accrues else 0
    beyond = owed_tokens + own - _slack_tokens(step_token_budget, bulk_min_share)
    return min(step_token_budget, max(0, beyond))


def bulk_owed_after_step(
    *,
    owed_tokens: int,
    step_token_budget: int,
    bulk_min_share: float,
    accrues: bool,
    bulk_tokens_run: int,
) -> int:
    """What is owed after a step that ran `bulk_tokens_run` bulk tokens; `accrues`: bulk is aged
    and the step held it back (a chat prompt competed, or the step deferred bulk).

    Bounded by the slack and one budget: with no bulk prompt left to prefill (aged bulk all in
    its decodes, or its prompts blocked on KV blocks) nothing can be paid, and a debt run up
    meanwhile must not come due as one long step later."""
    own = bulk_guarantee_tokens(step_token_budget, bulk_min_share) if accrues else 0
    owed = max(0, owed_tokens + own - bulk_tokens_run)
    return min(owed, _slack_tokens(step_token_budget, bulk_min_share) + step_token_budget)
