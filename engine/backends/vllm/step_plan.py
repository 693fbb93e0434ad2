"""mixgate's step composition, phrased as what vLLM's scheduler can be told before a step.

vLLM's `Scheduler.schedule()` is one long method: it walks `running` in list order, each
request taking `min(remaining, long_prefill_token_threshold, budget left)` tokens, then admits
from `waiting` in priority order. It cannot be told "interactive decodes first, at most N bulk
prefill tokens per step". What it can be told, per step, without touching its internals:

- the order of `running` (so interactive decodes, then bulk decodes, then prefill chunks),
- which running prefills take part in this step at all (the others sit the step out, as
  vLLM's own scheduler lets them when the budget runs out),
- the step's token budget (`max_num_scheduled_tokens`).

This module turns a view of the queues into those three, with `policies.step_budget`'s split:
bulk prefill only from what interactive work left and at most the bulk chunk cap, except that
aged bulk work is owed its minimum share (below); with no interactive request in the engine
(nor one recently: the caller's `policies.interactive_presence`), bulk prefill takes the whole
budget (work-conserving, as plain vLLM). A step that runs a chat's prefill takes no bulk
prefill (`bulk_prefill_cap_after_interactive`) beyond what aged bulk is due
(`policies.bulk_guarantee`: a debt the caller passes back as `bulk_owed_tokens`), and none at
all if it defers bulk (`defers_bulk`). While a chat's sampled tokens have made no text yet
(`interactive_awaits_first_text`), up to `FIRST_TEXT_DEFERRALS_IN_A_ROW` steps in a row take
no bulk at all, its decodes held back too, and then one takes bulk again. Unlike the native
engine, a chat's prefill step keeps the bulk decodes (docs/ARCHITECTURE.md, "Scheduling
model"). Pure: no vLLM, no clock (ages are passed in).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policies.bulk_guarantee import bulk_owed_after_step
from policies.interactive_presence import DEFAULT_LINGER_S
from policies.request_class import RequestClass
from policies.step_budget import (
    bulk_prefill_cap_after_interactive,
    defers_bulk,
    owes_bulk_share,
    plan_step_budget,
)

__all__ = [
    "FIRST_TEXT_DEFERRALS_IN_A_ROW",
    "StepComposition",
    "StepKnobs",
    "WorkItem",
    "admission_limit",
    "compose_step",
    "interactive_in_engine",
    "knobs_from_config",
]


# The most steps in a row (the chat's prefill step included) that take no bulk prefill while a
# chat's sampled tokens make no text yet. A byte-level tokenizer spends up to 4 tokens on one
# UTF-8 character, one a step: with deferral every other step, such a chat's first text waited
# 26-30 ms behind bulk-chunk steps after its first token (`mixed`, `small`, 2-vCPU AMD EPYC,
# the run's slowest chat in every repeat). Such steps hold the bulk decodes back too
# (`compose_step`); a stop string held back longer than that still lets bulk in every fifth step.
FIRST_TEXT_DEFERRALS_IN_A_ROW = 4


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One request as the scheduler sees it before a step."""

    key: int
    request_class: RequestClass
    # Tokens it still has to compute (1 for a decode; the prompt rest for a prefill).
    remaining_tokens: int
    # Seconds since it arrived.
    age_s: float

    @property
    def is_decode(self) -> bool:
        return self.remaining_tokens <= 1


@dataclass(frozen=True, slots=True)
class StepKnobs:
    step_token_budget: int
    # vLLM's long_prefill_token_threshold: the most one request's chunk can take in a step.
    prefill_chunk_tokens: int
    bulk_prefill_chunk_tokens: int
    bulk_min_share: float
    bulk_aging_s: float
    # How long after the last interactive request the bulk cap lifts; None: never
    # (EngineConfig's interactive_linger_s).
    interactive_linger_s: float | None = DEFAULT_LINGER_S

    def __post_init__(self) -> None:
        if self.step_token_budget < 1 or self.prefill_chunk_tokens < 1:
            raise ValueError("step_token_budget and prefill_chunk_tokens must be >= 1")


def knobs_from_config(additional_config: Any) -> StepKnobs:
    mixgate = dict(additional_config or {}).get("mixgate")
    if not isinstance(mixgate, dict):
        raise ValueError("ClassAwareScheduler needs additional_config['mixgate'] (the envelope)")
    return StepKnobs(
        step_token_budget=int(mixgate["step_token_budget"]),
        prefill_chunk_tokens=int(mixgate["prefill_chunk_tokens"]),
        bulk_prefill_chunk_tokens=int(mixgate["bulk_prefill_chunk_tokens"]),
        bulk_min_share=float(mixgate["bulk_min_share"]),
        bulk_aging_s=float(mixgate["bulk_aging_s"]),
        interactive_linger_s=_linger_s(mixgate),
    )


def _linger_s(mixgate: dict[str, Any]) -> float | None:
    """The knob as given (None: the cap never lifts), or the default when it is absent."""
    if "interactive_linger_s" not in mixgate:
        return DEFAULT_LINGER_S
    value = mixgate["interactive_linger_s"]
    return None if value is None else float(value)


@dataclass(frozen=True, slots=True)
class StepComposition:
    # Keys of running requests in the order vLLM should walk them this step.
    running_order: tuple[int, ...]
    # Keys of running prefills that sit this step out.
    held_back: frozenset[int]
    # The step's token budget (vLLM's max_num_scheduled_tokens for this step).
    token_budget: int
    # What the split gave each class's prefill (for tests and step records).
    interactive_prefill_tokens: int
    bulk_prefill_tokens: int
    bulk_aged: bool
    # What aged bulk is owed after this step (the next step's `bulk_owed_tokens`).
    owed_bulk_tokens: int = 0
    # Steps in a row, this one included, that deferred bulk (0: this one did not): the next
    # step's `deferred_steps_in_a_row`.
    deferred_steps_in_a_row: int = 0
    # Whether a waiting bulk request may start this step: only when the running bulk prefills
    # shown leave some of bulk's allowance (`admission_limit(admit_bulk=...)`).
    admits_waiting_bulk: bool = True

    @property
    def deferred_bulk(self) -> bool:
        """Whether this step left bulk out for a chat's first token or text (`defers_bulk`)."""
        return self.deferred_steps_in_a_row > 0


def _chunk(item: WorkItem, knobs: StepKnobs) -> int:
    return min(item.remaining_tokens, knobs.prefill_chunk_tokens)


def _admit_within(items: list[WorkItem], allowance: int, knobs: StepKnobs) -> list[WorkItem]:
    """The prefix of `items` whose chunks start within `allowance` tokens (the last one may be
    cut short by the step budget, which vLLM does by itself)."""
    taken: list[WorkItem] = []
    used = 0
    for item in items:
        if used >= allowance:
            break
        taken.append(item)
        used += _chunk(item, knobs)
    return taken


def interactive_in_engine(running: list[WorkItem], waiting: list[WorkItem]) -> bool:
    return any(r.request_class is RequestClass.INTERACTIVE for r in running + waiting)


def compose_step(
    running: list[WorkItem],
    waiting: list[WorkItem],
    knobs: StepKnobs,
    *,
    interactive_present: bool | None = None,
    deferred_steps_in_a_row: int = 0,
    bulk_owed_tokens: int = 0,
    interactive_awaits_first_text: bool = False,
) -> StepComposition:
    """Order, hold back and budget one step (see the module docstring).

    `interactive_present`: whether the bulk cap treats interactive work as present (the
    caller's `policies.interactive_presence`, which counts a recent request too); None: only
    what is in the engine now. `deferred_steps_in_a_row`, `bulk_owed_tokens`: the previous
    step's `deferred_steps_in_a_row` and `owed_bulk_tokens`. `interactive_awaits_first_text`: a
    running chat has sampled tokens that made no text yet (`first_text.FirstTextWatch`)."""
    inter, bulk = RequestClass.INTERACTIVE, RequestClass.BULK
    decodes = {
        c: [r for r in running if r.request_class is c and r.is_decode] for c in (inter, bulk)
    }
    prefills = {
        c: [r for r in running if r.request_class is c and not r.is_decode] for c in (inter, bulk)
    }
    waiting_by = {c: [r for r in waiting if r.request_class is c] for c in (inter, bulk)}
    demand = {c: sum(_chunk(r, knobs) for r in prefills[c] + waiting_by[c]) for c in (inter, bulk)}
    bulk_aged = any(r.age_s >= knobs.bulk_aging_s for r in prefills[bulk] + waiting_by[bulk])
    if interactive_present is None:
        interactive_present = interactive_in_engine(running, waiting)
    if demand[inter] > 0:
        defer = defers_bulk(
            first_token_pending=True, deferred_last_step=deferred_steps_in_a_row > 0
        )
    else:
        defer = (
            interactive_awaits_first_text
            and deferred_steps_in_a_row < FIRST_TEXT_DEFERRALS_IN_A_ROW
        )
    # A step that only waits for a chat's first text holds the bulk decodes back too: it is a
    # few chat decodes long instead of every bulk decode's. Held-back requests leave vLLM's
    # persistent batch for the step (re-added after it), a cost paid per chat on every chat's
    # prefill step (bulk 10-15% lower end to end), but here only by the few chats whose first
    # token made no text.
    held_decodes = decodes[bulk] if defer and demand[inter] == 0 else []
    if held_decodes:
        decodes[bulk] = []
    decode_tokens = len(decodes[inter]) + len(decodes[bulk])
    plan = plan_step_budget(
        step_token_budget=knobs.step_token_budget,
        interactive_decode_tokens=len(decodes[inter]),
        bulk_decode_tokens=len(decodes[bulk]),
        bulk_prefill_demand_tokens=demand[bulk],
        interactive_prefill_demand_tokens=demand[inter],
        bulk_aged=bulk_aged,
        bulk_prefill_chunk_tokens=knobs.bulk_prefill_chunk_tokens,
        bulk_min_share=knobs.bulk_min_share,
        interactive_present=interactive_present,
        bulk_owed_tokens=bulk_owed_tokens,
        deferred=defer,
    )
    left = max(0, knobs.step_token_budget - decode_tokens)
    inter_tokens = min(demand[inter], plan.interactive_prefill_limit_tokens)
    # With no interactive request in the engine the plan's cap is off (policies/step_budget.py).
    # NOTE: vLLM admits waiting bulk after the waiting chat with whatever budget is left, so
    # the budget itself must leave none: a bulk chunk admitted beside a chat's prefill made
    # that step 35-55 ms instead of ~25 (`small`, 2-vCPU AMD EPYC, a step trace of
    # chat-over-backlog: ~128 bulk prefill tokens in every chat's prefill step).
    bulk_cap = bulk_prefill_cap_after_interactive(
        plan, interactive_prefill_tokens=inter_tokens, deferred=defer
    )
    bulk_tokens = min(demand[bulk], bulk_cap, left - inter_tokens)
    # Running interactive prefills come first: only as many as their share covers.
    shown_inter = _admit_within(prefills[inter], inter_tokens, knobs)
    # NOTE: vLLM admits waiting requests only after it has walked `running`, so a running
    # bulk prefill would eat the budget meant for a waiting interactive prompt. While one
    # waits, bulk prefills may start only within whole chunks of their allowance.
    if waiting_by[inter]:
        whole_chunks = bulk_tokens // knobs.prefill_chunk_tokens
        shown_bulk = prefills[bulk][:whole_chunks]
    else:
        shown_bulk = _admit_within(prefills[bulk], bulk_tokens, knobs)
    # NOTE: the budget alone does not keep waiting bulk out: a chat whose prompt hits vLLM's
    # prefix cache computes fewer tokens than planned, and vLLM admits waiting bulk into what
    # is left (a shared system prompt makes that every chat's prefill step).
    admits_waiting_bulk = sum(_chunk(r, knobs) for r in shown_bulk) < bulk_tokens
    shown = {r.key for r in shown_inter + shown_bulk}
    held = frozenset(
        [r.key for r in prefills[inter] + prefills[bulk] if r.key not in shown]
        + [r.key for r in held_decodes]
    )
    order = decodes[inter] + decodes[bulk] + shown_inter + shown_bulk
    return StepComposition(
        running_order=tuple(r.key for r in order),
        held_back=held,
        # At least 1: vLLM treats a zero budget as "schedule nothing", a stalled step.
        token_budget=max(
            1, min(knobs.step_token_budget, decode_tokens + inter_tokens + bulk_tokens)
        ),
        interactive_prefill_tokens=inter_tokens,
        bulk_prefill_tokens=bulk_tokens,
        bulk_aged=bulk_aged,
        owed_bulk_tokens=bulk_owed_after_step(
            owed_tokens=bulk_owed_tokens,
            step_token_budget=knobs.step_token_budget,
            bulk_min_share=knobs.bulk_min_share,
            accrues=owes_bulk_share(
                bulk_aged=bulk_aged, interactive_prefill_demand_tokens=demand[inter], deferred=defer
            ),
            # What the step plans for bulk; vLLM may run less (a prefix-cache hit), not more.
            bulk_tokens_run=len(decodes[bulk]) + bulk_tokens,
        ),
        deferred_steps_in_a_row=deferred_steps_in_a_row + 1 if defer else 0,
        admits_waiting_bulk=admits_waiting_bulk,
    )


def admission_limit(
    *,
    slots_in_use: int,
    running_interactive: int,
    waiting_interactive: int,
    max_active_seqs: int,
    runner_slots: int,
    admit_bulk: bool = True,
) -> int:
    """The step's cap on requests in RUNNING (vLLM's `max_num_active_reqs`).

    vLLM admits waiting requests in priority order (interactive first) only while RUNNING
    holds fewer than the cap, and never preempts to admit. With bulk in every slot, a chat
    waited in vLLM's queue until a bulk request finished (measured under `mixed`: 0.3-0.85 s
    from vLLM's queue to its first step, with the step plan giving it its chunk at once). The
    native scheduler preempts bulk for an interactive admission; here interactive requests
    overcommit instead: the cap rises by as many as wait (up to the runner's slots), so they
    all get in, and bulk is admitted only while fewer than `max_active_seqs` bulk requests run
    (the running chats sit on top of bulk's slots: with the cap at `max_active_seqs` a chat
    that took a finished bulk request's slot kept it from bulk until the chat ended). No bulk
    work is thrown away, and the overcommit ends as the chats finish.

    `admit_bulk` False (`StepComposition.admits_waiting_bulk`): room for the waiting chats
    only, which vLLM admits first, so no bulk request starts this step.
    """
    chats_on_top = max_active_seqs + running_interactive + waiting_interactive
    wanted = max(slots_in_use + waiting_interactive, chats_on_top)
    limit = max(max_active_seqs, min(runner_slots, wanted))
    if not admit_bulk:
        limit = min(limit, slots_in_use + waiting_interactive)
    return limit
