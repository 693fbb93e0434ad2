"""One scrape of the server's /metrics as a MetricSample."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from bench.load.records import MetricSample

__all__ = ["parse_metrics"]

# Sample name -> MetricSample field, for the per-class gauges.
_PER_CLASS = {
    "mixgate_queue_depth": "queue_depth",
    "mixgate_queued_tokens": "queued_tokens",
    "mixgate_engine_running": "running",
}
_SCALARS = {
    "mixgate_kv_cache_usage": "kv_usage",
    "mixgate_preemptions_total": "preemptions",
    "mixgate_engine_steps_total": "steps",
}


def parse_metrics(text: str, t_s: float) -> MetricSample:
    """The gauges and counters a load run tracks; series the server does not expose (yet)
    stay at their defaults rather than failing the run."""
    sample = MetricSample(t_s=t_s)
    for family in text_string_to_metric_families(text):
        for series in family.samples:
            per_class = _PER_CLASS.get(series.name)
            if per_class is not None and "class" in series.labels:
                getattr(sample, per_class)[series.labels["class"]] = float(series.value)
            elif series.name in _SCALARS:
                setattr(sample, _SCALARS[series.name], float(series.value))
    return sample
