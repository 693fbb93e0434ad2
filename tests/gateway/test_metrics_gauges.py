"""Scrape-time gauges rendered from what the gateway reads: the engine's step-cost fit, the
dispatcher's local jobs and their work in flight (real prometheus_client rendering and
parsing, no server)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from engine.core.step_record import LoadSnapshot
from gateway.http.metrics import Metrics
from policies.bulk_prefill_pace import BulkPrefillPace
from policies.in_flight_work import InFlightWork
from policies.request_class import RequestClass
from policies.step_cost import StepCost


def samples(metrics: Metrics) -> dict[tuple[str, str], float]:
    text = metrics.render().decode()
    return {
        (sample.name, sample.labels.get("class", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def snapshot(
    step_cost: StepCost | None, bulk_prefill: BulkPrefillPace | None = None
) -> LoadSnapshot:
    return LoadSnapshot(
        running_by_class={RequestClass.BULK: 2},
        waiting_by_class={},
        kv_usage=0.5,
        num_free_blocks=4,
        recent_step_s=0.02,
        prefill_tokens_per_s=None,
        decode_tokens_per_s=None,
        total_preemptions=0,
        steps=10,
        step_cost=step_cost,
        bulk_prefill=bulk_prefill,
    )


def test_the_step_cost_fit_and_bulk_pace_are_shown_when_the_engine_has_them() -> None:
    fitted, unfitted = Metrics(), Metrics()
    fitted.watch(lambda: snapshot(StepCost(0.0075, 0.00006), BulkPrefillPace(81.3, 0.0113)), dict)
    unfitted.watch(lambda: snapshot(None), dict)
    shown = samples(fitted)
    assert shown[("mixgate_step_cost_fixed_seconds", "")] == 0.0075
    assert shown[("mixgate_step_cost_token_seconds", "")] == 0.00006
    assert shown[("mixgate_bulk_prefill_tokens_per_step", "")] == 81.3
    assert shown[("mixgate_bulk_prefill_step_seconds", "")] == 0.0113
    unshown = samples(unfitted)
    assert ("mixgate_step_cost_fixed_seconds", "") not in unshown
    assert ("mixgate_bulk_prefill_tokens_per_step", "") not in unshown


def test_local_jobs_and_unstarted_bulk_are_shown_once_the_dispatcher_runs() -> None:
    running, starting = Metrics(), Metrics()
    by_class = {RequestClass.INTERACTIVE: 3, RequestClass.BULK: 5}
    work = {RequestClass.BULK: InFlightWork(jobs=5, prompt_tokens=3_000, output_tokens=400)}
    running.watch_local_jobs(lambda: (by_class, 4, work))
    starting.watch_local_jobs(lambda: None)
    shown = samples(running)
    assert shown[("mixgate_dispatch_local_jobs", "interactive")] == 3
    assert shown[("mixgate_dispatch_local_jobs", "bulk")] == 5
    assert shown[("mixgate_dispatch_unstarted_bulk_jobs", "")] == 4
    assert ("mixgate_dispatch_unstarted_bulk_jobs", "") not in samples(starting)
    tokens = work_tokens(running)
    assert tokens[("bulk", "prompt")] == 3_000
    assert tokens[("bulk", "output")] == 400
    # A class with nothing held shows zeros, not gaps.
    assert tokens[("interactive", "prompt")] == tokens[("interactive", "output")] == 0
    assert not work_tokens(starting)


def work_tokens(metrics: Metrics) -> dict[tuple[str, str], float]:
    text = metrics.render().decode()
    return {
        (sample.labels["class"], sample.labels["kind"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "mixgate_dispatch_work_in_flight_tokens"
    }
