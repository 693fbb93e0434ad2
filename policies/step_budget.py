"""How one step's token budget is split between the classes (pure: the scheduler applies it).

Order of claim on the budget (docs/ARCHITECTURE.md, "Scheduling model"):
1. decode tokens of running interactive sequences, 2. decode tokens of running bulk
sequences, 3. interactive prefill chunks, 4. bulk prefill chunks, at most
`bulk_prefill_chunk_tokens` and only from what is left, except that bulk work that has
waited past its aging threshold is owed `bulk_min_share` of the budget for each step that holds
it back, a debt that a step for which an interactive prompt competes (`_competes_for_prefill`)
pays once it runs past a slack (policies/bulk_guarantee.py). With no interactive work present
(`interactive_present=False`: what counts as present is the caller's,
policies/interactive_presence.py) the cap is off: bulk prefill takes what the decodes leave.

A step that runs an interactive prefill carries no bulk prefill beyond what aged bulk is due
(`bulk_prefill_cap_after_interactive`): the chat's first token waits on exactly that step, and
a bulk chunk beside it adds its whole cost to the chat's TTFT for a few tokens of bulk work
(chats are short and few next to the backlog, so bulk loses a step's chunk now and then).
In the native engine such a step carries no bulk decodes either and pays nothing
(`defers_bulk`), and never two steps in a row, so a flood of chats slows bulk decodes to every
other step at worst (the vLLM backend keeps its decodes in a chat's prefill step, and holds
them only while a chat's first token made no text, up to four steps in a row:
docs/ARCHITECTURE.md, "Scheduling model"). A deferring step's share is owed like any other.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.bulk_guarantee import bulk_due_tokens


@dataclass(frozen=True, slots=True)
class StepBudgetPlan:
    # Prefill tokens interactive sequences may take this step.
    interactive_prefill_limit_tokens: int
    # Prefill tokens bulk sequences may take this step, if the budget still has them.
    bulk_prefill_cap_tokens: int
    # Tokens bulk is guaranteed this step (decodes included); 0 unless bulk is aged.
    bulk_guaranteed_tokens: int
    # Of the guarantee, the prefill tokens set aside for bulk before interactive prefill.
    bulk_reserved_prefill_tokens: int = 0


def plan_step_budget(
    *,
    step_token_budget: int,
    interactive_decode_tokens: int,
    bulk_decode_tokens: int,
    bulk_prefill_demand_tokens: int,
    interactive_prefill_demand_tokens: int,
    bulk_aged: bool,
    bulk_prefill_chunk_tokens: int,
    bulk_min_share: float,
    interactive_present: bool = True,
    bulk_owed_tokens: int = 0,
    deferred: bool = False,
) -> StepBudgetPlan:
    """Split what the decodes leave between interactive and bulk prefill.

    `interactive_present`: whether any interactive sequence runs or waits in the engine.
    `bulk_owed_tokens`: what aged bulk is owed from earlier steps (policies/bulk_guarantee.py).
    `deferred`: this step defers bulk (`defers_bulk`) and so pays nothing.
    `interactive_prefill_demand_tokens`: interactive prompt tokens waiting or in their prefill;
    with none, aged bulk is guaranteed nothing this step (see `_competes_for_prefill`)."""
    if step_token_budget < 1:
        raise ValueError("step_token_budget must be at least 1")
    left_tokens = max(0, step_token_budget - interactive_decode_tokens - bulk_decode_tokens)
    guaranteed = 0
    if not deferred and _competes_for_prefill(interactive_prefill_demand_tokens):
        guaranteed = bulk_due_tokens(
            owed_tokens=bulk_owed_tokens,
            step_token_budget=step_token_budget,
            bulk_min_share=bulk_min_share,
            accrues=bulk_aged,
        )
    # Bulk decodes already count toward the guarantee; reserve only the prefill it can use.
    reserved_prefill = min(
        bulk_prefill_demand_tokens, max(0, guaranteed - bulk_decode_tokens), left_tokens
    )
    # NOTE: an aged bulk backlog may exceed the normal chunk cap by its guarantee.
    cap_tokens = max(bulk_prefill_chunk_tokens, reserved_prefill)
    if not interactive_present:
        # The cap bounds step time for interactive sequences' ITL and TTFT; with none in the
        # engine there is nobody to protect, and capping anyway ran bulk alone in 128-token
        # prefill steps where vLLM runs 512 (the step's fixed cost paid four times per prompt;
        # measured: bulk alone 364 vs vLLM's 553 tokens per busy second). A chat that arrives
        # meanwhile waits at most for the step under way, as behind any other step.
        cap_tokens = max(cap_tokens, left_tokens)
    return StepBudgetPlan(
        interactive_prefill_limit_tokens=left_tokens - reserved_prefill,
        bulk_prefill_cap_tokens=cap_tokens,
        bulk_guaranteed_tokens=guaranteed,
        bulk_reserved_prefill_tokens=reserved_prefill,
    )


def _competes_for_prefill(interactive_prefill_demand_tokens: int) -> bool:
    """Whether interactive prefill competes with bulk for this step's budget, the one case in
    which aged bulk's guarantee does something.

    The guarantee exists so that a stream of chat prompts cannot take every step's budget and
    starve bulk. In a step with no interactive prompt to prefill, bulk already takes all the
    budget the decodes leave up to its chunk cap, so the guarantee could only lift that cap;
    and a backlog counts as aged merely by being long (its oldest request waited
    `bulk_aging_s`), which under any real backlog is always. It lifted the cap in nearly every
    step of one: the native engine's 64-token chunk ran at 95 bulk prefill tokens a step on
    average (0.2 x 512 less the bulk decodes), and the step after each chat's prefill at ~196
    (the guarantee the chat's step deferred, carried, and its own): 33 ms, which the chats
    arriving during it waited out (`small`, 2-vCPU AMD EPYC, `bench breakdown --workload
    mixed --engine native`). Such a step now keeps the cap (72 tokens a step on average, mean
    step 11.0 -> 8.3 ms in the same breakdown); what is owed waits for a step it competes in,
    and the bulk such a step runs pays it off meanwhile. Measured end to end:
    docs/ARCHITECTURE.md, "Scheduling model"."""
    return interactive_prefill_demand_tokens > 0


def owes_bulk_share(
    *, bulk_aged: bool, interactive_prefill_demand_tokens: int, deferred: bool
) -> bool:
    """Whether a step owes aged bulk its share (policies/bulk_guarantee.py): bulk is aged, and
    the step defers it or an interactive prompt competes for its budget."""
    return bulk_aged and (deferred or _competes_for_prefill(interactive_prefill_demand_tokens))


def bulk_prefill_cap_after_interactive(
    plan: StepBudgetPlan, *, interactive_prefill_tokens: int, deferred: bool = False
) -> int:
    """The bulk prefill cap once the step's interactive prefill is known: none in a step that
    defers bulk (`defers_bulk`), only what aged bulk is due when an interactive prefill runs
    in this step, the plan's cap otherwise."""
    if deferred:
        return 0
    if interactive_prefill_tokens > 0:
        return plan.bulk_reserved_prefill_tokens
    return plan.bulk_prefill_cap_tokens


def defers_bulk(*, first_token_pending: bool, deferred_last_step: bool) -> bool:
    """Whether the next step leaves bulk out entirely, its decodes too, for a chat's first token.

    `first_token_pending`: an interactive prompt waits or is in its prefill, or a chat's sampled
    tokens have made no text yet (the client's first token is its first text). Measured on the
    `small` preset's random weights (2-vCPU AMD EPYC): the chat that set the TTFT p99 under the
    backlog in every repeat showed its first text 42-62 ms after its first token was sampled,
    the steps between being bulk-chunk steps of 22-37 ms (2-4 ms alone).

    A chat's first token comes out of the step that runs its prefill, so every bulk decode in
    that step is paid by the chat's TTFT. Measured on the `small` preset (2 threads, the Xeon):
    a 250-token chat prefill alone 10.5 ms; beside 32 bulk decodes at ~1,100 tokens of context
    21 ms; those decodes alone 10.2 ms. Deferring them costs bulk one chat prefill of wall time
    per chat, not its decode batch. A step after a deferring one never defers, so bulk decodes
    run at least every other step however many chats arrive.

    Aged bulk is deferred too, and the step's share is owed (policies/bulk_guarantee.py): a
    backlog stays aged for most of a chat phase, and keeping the guarantee in the chat's own
    step made it 27-49 ms instead of 15-25 (2-vCPU AMD EPYC, `small`: bench breakdown
    --workload chat-over-backlog, a step trace).
    """
    return first_token_pending and not deferred_last_step
