"""Scrape-time gauges rendered from what the gateway reads: the engine's step-cost fit and the
dispatcher's local jobs (real prometheus_client rendering and parsing, no server)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from engine.core.step_record import LoadSnapshot
from gateway.http.metrics import Metrics
from policies.request_class import RequestClass
from policies.step_cost import StepCost


def samples(metrics: Metrics) -> dict[tuple[str, str], float]:
    text = metrics.render().decode()
    return {
        (sample.name, sample.labels.get("class", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def snapshot(step_cost: StepCost | None) -> LoadSnapshot:
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
    )


def test_the_step_cost_fit_is_shown_when_the_engine_has_one() -> None:
    fitted, unfitted = Metrics(), Metrics()
    fitted.watch(lambda: snapshot(StepCost(0.0075, 0.00006)), dict)
    unfitted.watch(lambda: snapshot(None), dict)
    shown = samples(fitted)
    assert shown[("mixgate_step_cost_fixed_seconds", "")] == 0.0075
    assert shown[("mixgate_step_cost_token_seconds", "")] == 0.00006
    assert ("mixgate_step_cost_fixed_seconds", "") not in samples(unfitted)


def test_local_jobs_and_unstarted_bulk_are_shown_once_the_dispatcher_runs() -> None:
    running, starting = Metrics(), Metrics()
    by_class = {RequestClass.INTERACTIVE: 3, RequestClass.BULK: 5}
    running.watch_local_jobs(lambda: (by_class, 4))
    starting.watch_local_jobs(lambda: None)
    shown = samples(running)
    assert shown[("mixgate_dispatch_local_jobs", "interactive")] == 3
    assert shown[("mixgate_dispatch_local_jobs", "bulk")] == 5
    assert shown[("mixgate_dispatch_unstarted_bulk_jobs", "")] == 4
    assert ("mixgate_dispatch_unstarted_bulk_jobs", "") not in samples(starting)
