"""`ClassAwareScheduler`: mixgate's step composition inside vLLM, through `scheduler_cls`.

vLLM (0.32) runs this class in its engine-core process. Its `schedule()` is one long method with no
hooks for per-class budgets, so this subclass does not re-implement it: before each step it reorders
`running`, sets aside the running prefills that sit the step out, and lowers the step's token
budget, all as `engine.backends.vllm.step_plan.compose_step` says; then it calls the real
`schedule()` and puts everything back. Preemption, prefix caching, KV allocation and the priority
queue of waiting requests are vLLM's own (the class is the request's priority: interactive 0, bulk
1). vLLM runs with twice the envelope's slots (`max_num_seqs`) and the envelope's own as its
admission cap (`max_num_active_seqs`); each step the cap rises by the interactive requests waiting
(`engine.backends.vllm.step_plan.admission_limit`), so a chat never waits for a bulk request to
finish.

Each step's record (tokens by class and kind, its time: `engine.backends.vllm.step_records`) goes
to the gateway over `engine.backends.vllm.step_channel` when `additional_config["mixgate"]` names
a `step_sink`. The knobs come from `additional_config["mixgate"]` (see
`engine.backends.vllm.args`). Import this only where vLLM is installed.

Async scheduling (vLLM schedules step N+1 while step N runs on the device, the default on GPUs
with the multiproc executor): vLLM picks `AsyncScheduler` over `Scheduler` by itself only when no
`scheduler_cls` is given, so `ClassAwareScheduler` picks for itself when vLLM builds it: with
`scheduler_config.async_scheduling` on, the instance is a `ClassAwareAsyncScheduler` (the same
composition over `AsyncScheduler`, as vLLM's own `DiffusionAsyncScheduler` pairs with its
`DiffusionScheduler`). Subclassing `Scheduler` alone would keep the class-aware steps but lose the
host/device overlap that plain vLLM keeps. vLLM's start-up warning about custom scheduler classes
("if you have subclassed Scheduler instead of AsyncScheduler...") is printed for any custom class;
with async scheduling on, this one is an `AsyncScheduler`. The composition reads each request's
`num_output_placeholders` (tokens of steps still in flight), so a request whose output has not
come back yet counts as the decode it is. vLLM's CPU platform turns async scheduling off, so on
CPU the class is the plain one (`tests/vllm_inside/test_vllm_scheduler_async.py` drives both).
"""

from __future__ import annotations

import time
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from engine.backends.vllm.first_text import load_watch
from engine.backends.vllm.reader_spin import bound_reader_spin
from engine.backends.vllm.step_channel import StepSender
from engine.backends.vllm.step_plan import (
    WorkItem,
    admission_limit,
    compose_step,
    interactive_in_engine,
    knobs_from_config,
)
from engine.backends.vllm.step_records import StepRecorder
from policies.interactive_presence import InteractivePresence
from policies.request_class import RequestClass

__all__ = ["ClassAwareAsyncScheduler", "ClassAwareScheduler"]

# The vLLM priority of each class (lower runs first).
INTERACTIVE_PRIORITY = 0


def _work_item(key: int, request: Any, now_s: float) -> WorkItem:
    remaining = (
        request.num_tokens_with_spec + request.num_output_placeholders - request.num_computed_tokens
    )
    return WorkItem(
        key=key,
        request_class=(
            RequestClass.INTERACTIVE
            if request.priority <= INTERACTIVE_PRIORITY
            else RequestClass.BULK
        ),
        remaining_tokens=max(1, remaining),
        # vLLM stamps arrival_time with time.time() when the request enters the engine.
        age_s=max(0.0, now_s - request.arrival_time),
    )


def _uses_async_scheduling(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the vLLM config a scheduler is built with (vLLM passes it as `vllm_config`, the
    first parameter) has async scheduling on; vLLM has settled it (None: off) by then."""
    vllm_config = kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]
    return bool(vllm_config.scheduler_config.async_scheduling)


class ClassAwareScheduler(Scheduler):  # type: ignore[misc]
    # vLLM's attributes this class reads and sets around each step.
    running: list[Any]
    waiting: Any
    vllm_config: Any
    max_num_scheduled_tokens: int
    max_num_running_reqs: int
    max_num_active_reqs: int
    requests: dict[str, Any]
    kv_cache_manager: Any

    def __new__(cls, *args: Any, **kwargs: Any) -> ClassAwareScheduler:
        # The class vLLM was told (`scheduler_cls`) turns into its async twin when vLLM runs
        # async scheduling; Python then calls the twin's __init__ with the same arguments.
        if cls is ClassAwareScheduler and _uses_async_scheduling(args, kwargs):
            cls = ClassAwareAsyncScheduler
        instance: ClassAwareScheduler = super().__new__(cls)
        return instance

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # vLLM builds its scheduler in the engine-core process: from here on that process
        # sleeps while the worker computes a step instead of spinning on a core the worker
        # needs (engine/backends/vllm/reader_spin.py).
        bound_reader_spin()
        self.mixgate_knobs = knobs_from_config(self.vllm_config.additional_config)
        self.mixgate_presence = InteractivePresence(self.mixgate_knobs.interactive_linger_s)
        self.mixgate_first_text = load_watch(self.vllm_config.model_config.model)
        # The last step's composition: how many steps in a row deferred bulk, and what aged
        # bulk is owed after it (policies/bulk_guarantee.py).
        self.mixgate_deferred_steps_in_a_row = 0
        self.mixgate_owed_bulk_tokens = 0
        # Steps are recorded only for a gateway that reads them: no per-step work otherwise.
        sink = dict(self.vllm_config.additional_config or {})["mixgate"].get("step_sink")
        self.mixgate_step_sender = StepSender(sink) if sink else None
        self.mixgate_recorder = StepRecorder() if sink else None

    def _awaits_first_text(self, running: list[Any]) -> bool:
        """Whether a running chat has sampled tokens that made no text yet."""
        if self.mixgate_first_text is None:
            return False
        chats = [r for r in running if r.priority <= INTERACTIVE_PRIORITY]
        self.mixgate_first_text.keep_only({r.request_id for r in chats})
        # NOTE: no short cut with any(): each chat's detokenizer takes its new tokens every step.
        awaiting = [
            self.mixgate_first_text.awaits_first_text(
                r.request_id, r.prompt_token_ids or (), r.output_token_ids
            )
            for r in chats
        ]
        return any(awaiting)

    def update_from_output(self, *args: Any, **kwargs: Any) -> Any:
        # Sent before the step's outputs are made, so it is mostly in before them (on a socket
        # of its own: not guaranteed).
        if self.mixgate_recorder is not None and self.mixgate_step_sender is not None:
            record = self.mixgate_recorder.ended(time.monotonic())
            if record is not None:
                self.mixgate_step_sender.send(record)
        try:
            return super().update_from_output(*args, **kwargs)
        finally:
            self.mixgate_presence.step_ended(time.time())

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            if self.mixgate_step_sender is not None:
                self.mixgate_step_sender.close()

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        started_s = time.monotonic()
        output = self._composed_schedule(*args, **kwargs)
        if self.mixgate_recorder is None:
            return output
        self.mixgate_recorder.scheduled(
            started_s=started_s,
            scheduled_tokens=output.num_scheduled_tokens,
            requests=self.requests,
            running=self.running,
            waiting=self.waiting,
            kv_usage=float(self.kv_cache_manager.usage),
            num_preemptions=len(output.preempted_req_ids or ()),
        )
        return output

    def _composed_schedule(self, *args: Any, **kwargs: Any) -> Any:
        now_s = time.time()
        running = list(self.running)
        items = [_work_item(i, r, now_s) for i, r in enumerate(running)]
        waiting = [_work_item(len(running) + i, r, now_s) for i, r in enumerate(self.waiting)]
        present = self.mixgate_presence.observe(interactive_in_engine(items, waiting), now_s)
        plan = compose_step(
            items,
            waiting,
            self.mixgate_knobs,
            interactive_present=present,
            deferred_steps_in_a_row=self.mixgate_deferred_steps_in_a_row,
            bulk_owed_tokens=self.mixgate_owed_bulk_tokens,
            interactive_awaits_first_text=self._awaits_first_text(running),
        )
        self.mixgate_deferred_steps_in_a_row = plan.deferred_steps_in_a_row
        self.mixgate_owed_bulk_tokens = plan.owed_bulk_tokens
        held = [running[i] for i in sorted(plan.held_back)]
        saved = (self.max_num_scheduled_tokens, self.max_num_running_reqs, self.max_num_active_reqs)
        # NOTE: requests set aside still hold their slots; vLLM counts slots as len(running),
        # so its limits shrink by as many for this step.
        self.running = [running[i] for i in plan.running_order]
        self.max_num_scheduled_tokens = min(saved[0], plan.token_budget)
        self.max_num_running_reqs = saved[1] - len(held)
        limit = admission_limit(
            slots_in_use=len(running),
            running_interactive=sum(i.request_class is RequestClass.INTERACTIVE for i in items),
            waiting_interactive=sum(w.request_class is RequestClass.INTERACTIVE for w in waiting),
            max_active_seqs=saved[2],
            runner_slots=saved[1],
            admit_bulk=plan.admits_waiting_bulk,
        )
        self.max_num_active_reqs = limit - len(held)
        try:
            return super().schedule(*args, **kwargs)
        finally:
            self.max_num_scheduled_tokens, self.max_num_running_reqs = saved[0], saved[1]
            self.max_num_active_reqs = saved[2]
            self.running.extend(held)


class ClassAwareAsyncScheduler(ClassAwareScheduler, AsyncScheduler):  # type: ignore[misc]
    """`ClassAwareScheduler` over vLLM's `AsyncScheduler` (its placeholders for the tokens of
    steps in flight, its caching of blocks as their tokens come back). Not named in vLLM's
    config: `ClassAwareScheduler` becomes this when vLLM builds it with async scheduling on."""
