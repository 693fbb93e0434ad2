"""The console's live view: one JSON document a second, computed from what the gateway already
records (the Prometheus histograms and counters, the engine's load snapshot and step records,
the queue depths the Redis watcher keeps), never from a request.

A sampler task keeps one snapshot of the cumulative values a second (about two minutes of
them, in memory) and publishes this replica's load to Redis, so a console on any replica lists
every replica that shares the Redis. A live read takes a fresh snapshot and subtracts the one
from a window ago: latency quantiles and refusals over the last minute, rates over the last
few seconds. Before the replica has run a minute the window is what it has (``window_s``).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

import orjson
import structlog

from gateway.console.windows import (
    Snapshot,
    StepTotals,
    class_names,
    counter_values,
    histogram_counts,
    histogram_quantile,
)
from gateway.http.metrics import engine_step_records
from gateway.http.state import GatewayState
from policies.request_class import RequestClass

__all__ = ["LATENCY_WINDOW_S", "RATE_WINDOW_S", "ConsoleLive"]

log = structlog.get_logger("mixgate.console")

# Latency quantiles, refusals and expiries over this window; rates over the shorter one.
LATENCY_WINDOW_S: Final = 60.0
RATE_WINDOW_S: Final = 5.0
SAMPLE_INTERVAL_S: Final = 1.0
_SNAPSHOTS_KEPT: Final = 128
# A replica's published load expires after this long without a refresh (it stopped or died),
# or after three of its publish intervals when those are longer.
REPLICA_TTL_MS: Final = 5000


class ConsoleLive:
    def __init__(self, state: GatewayState, clock: Callable[[], float] = time.monotonic) -> None:
        self._state = state
        self._clock = clock
        self._steps = StepTotals()
        self._snapshots: deque[Snapshot] = deque(maxlen=_SNAPSHOTS_KEPT)
        # NOTE: the load goes to Redis at the Redis watcher's cadence (at most once a second),
        # so a replica told to keep quiet there (long check intervals) stays quiet here too.
        self._publish_interval_s = max(SAMPLE_INTERVAL_S, state.settings.redis_check_interval_s)
        self._ttl_ms = max(REPLICA_TTL_MS, int(3000 * self._publish_interval_s))
        self._published_s: float | None = None

    # -- sampling ----------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        metrics = self._state.metrics
        self._steps.catch_up(engine_step_records(self._state.engine))
        load = self._state.engine_load()
        return Snapshot(
            at_s=self._clock(),
            ttft=histogram_counts(metrics.ttft_s),
            itl=histogram_counts(metrics.itl_s),
            rejections=counter_values(metrics.rejections),
            finished=counter_values(metrics.jobs_finished),
            steps=self._steps.frozen(),
            preemptions=load.total_preemptions if load is not None else 0,
        )

    def sample(self) -> Snapshot:
        current = self.snapshot()
        self._snapshots.append(current)
        return current

    def _baseline(self, now_s: float, window_s: float) -> Snapshot | None:
        """The newest snapshot at least `window_s` old, else the oldest there is."""
        chosen = None
        for snap in self._snapshots:
            if snap.at_s <= now_s - window_s:
                chosen = snap
            else:
                break
        if chosen is None and self._snapshots and self._snapshots[0].at_s < now_s:
            chosen = self._snapshots[0]
        return chosen

    async def run(self, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        """Forever: a snapshot and this replica's load in Redis, once per interval."""
        while True:
            try:
                self.sample()
                now_s, last_s = self._clock(), self._published_s
                if (last_s is None or now_s - last_s >= self._publish_interval_s) and (
                    await self._publish_replica()
                ):
                    self._published_s = now_s
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the console must never take the replica down
                log.debug("console_sample_failed", exc_info=True)
            await asyncio.sleep(interval_s)

    # -- replicas ----------------------------------------------------------------------------

    def _replica_keys(self) -> tuple[str, str]:
        prefix = self._state.settings.key_prefix
        return f"{prefix}console:replicas", f"{prefix}console:replica:"

    async def _publish_replica(self) -> bool:
        """This replica's load under the console's keys; False when Redis is not up."""
        state = self._state
        if state.redis is None or not state.redis_ok:
            return False
        index, item = self._replica_keys()
        replica_id = state.settings.replica_id
        now_ms = int(time.time() * 1000)
        body = orjson.dumps(self.replica_load())
        pipe = state.redis.pipeline(transaction=False)
        pipe.set(item + replica_id, body, px=self._ttl_ms)
        pipe.zadd(index, {replica_id: now_ms})
        pipe.zremrangebyscore(index, "-inf", now_ms - self._ttl_ms)
        await pipe.execute()
        return True

    async def replicas(self) -> list[dict[str, Any]]:
        """Every replica that published its load within the TTL (this one included)."""
        state = self._state
        if state.redis is None or not state.redis_ok:
            return [self.replica_load()]
        index, item = self._replica_keys()
        now_ms = int(time.time() * 1000)
        ids = await state.redis.zrangebyscore(index, now_ms - self._ttl_ms, "+inf")
        if not ids:
            return [self.replica_load()]
        raws = await state.redis.mget([item + str(i) for i in ids])
        loads = [orjson.loads(r) for r in raws if r]
        return sorted(loads, key=lambda r: str(r.get("replica_id", "")))

    def replica_load(self) -> dict[str, Any]:
        state = self._state
        load = state.engine_load()
        current = self.snapshot()
        rates = self._rates(current)
        names = list(class_names())
        return {
            "replica_id": state.settings.replica_id,
            "ready": not state.not_ready_reasons(),
            "draining": state.draining,
            "claims": sorted(state.settings.claimed_classes),
            "running": {c: _by_class(load.running_by_class, c) if load else 0 for c in names},
            "waiting": {c: _by_class(load.waiting_by_class, c) if load else 0 for c in names},
            "kv_usage": load.kv_usage if load else None,
            "step_s": load.recent_step_s if load else None,
            "output_tokens_per_s": rates["output_tokens_per_s"],
            "updated_at": time.time(),
        }

    # -- the live document -------------------------------------------------------------------

    def _rates(self, current: Snapshot) -> dict[str, Any]:
        base = self._baseline(current.at_s, RATE_WINDOW_S)
        span_s = current.at_s - base.at_s if base is not None else 0.0
        steps_now, steps_then = current.steps, base.steps if base is not None else StepTotals()
        steps = steps_now.steps - steps_then.steps

        def delta(cls: str, kind: str) -> float:
            key = (cls, kind)
            return steps_now.tokens.get(key, 0.0) - steps_then.tokens.get(key, 0.0)

        per_s = {c: (delta(c, "decode") / span_s if span_s > 0 else 0.0) for c in class_names()}
        per_step = {
            f"{c}_{kind}": (delta(c, kind) / steps if steps > 0 else 0.0)
            for c in class_names()
            for kind in ("decode", "prefill")
        }
        return {
            "span_s": span_s,
            "output_tokens_per_s": per_s,
            "tokens_per_step": per_step,
            "steps_per_s": steps / span_s if span_s > 0 else 0.0,
        }

    async def body(self) -> dict[str, Any]:
        state = self._state
        current = self.snapshot()
        base = self._baseline(current.at_s, LATENCY_WINDOW_S)
        window_s = current.at_s - base.at_s if base is not None else 0.0
        rates = self._rates(current)
        depths = state.admission.last_depths if state.admission is not None else {}
        load = state.engine_load()
        classes: dict[str, Any] = {}
        for request_class in RequestClass:
            c = request_class.value
            depth = depths.get(request_class)
            classes[c] = {
                "queue_depth": depth.jobs if depth is not None else 0,
                "queued_tokens": depth.queued_tokens if depth is not None else 0,
                "running": _by_class(load.running_by_class, c) if load else 0,
                "engine_waiting": _by_class(load.waiting_by_class, c) if load else 0,
                "ttft_s": _quantiles(current, base, "ttft", c),
                "itl_s": _quantiles(current, base, "itl", c),
                "output_tokens_per_s": rates["output_tokens_per_s"][c],
                "refusals": _deltas(current.rejections, base and base.rejections, c),
                "finished": _deltas(current.finished, base and base.finished, c),
            }
            classes[c]["expired"] = classes[c]["finished"].get("expired", 0)
        return {
            "object": "console.live",
            "replica_id": state.settings.replica_id,
            "now": time.time(),
            "window_s": window_s,
            "rate_window_s": rates["span_s"],
            "ready": not state.not_ready_reasons(),
            "not_ready_reasons": state.not_ready_reasons(),
            "classes": classes,
            "engine": {
                "kv_usage": load.kv_usage if load else None,
                "step_s": load.recent_step_s if load else None,
                "steps": load.steps if load else 0,
                "steps_per_s": rates["steps_per_s"],
                "tokens_per_step": rates["tokens_per_step"],
                "preemptions_total": current.preemptions,
                "preemptions": current.preemptions - (base.preemptions if base else 0),
                "free_blocks": load.num_free_blocks if load else None,
            },
            "replicas": await self.replicas(),
        }


def _by_class(values: dict[RequestClass, int], name: str) -> int:
    return values.get(RequestClass(name), 0)


def _quantiles(current: Snapshot, base: Snapshot | None, which: str, cls: str) -> dict[str, Any]:
    now = (current.ttft if which == "ttft" else current.itl).get(cls)
    if now is None:
        return {"p50": None, "p99": None, "count": 0}
    then = None if base is None else (base.ttft if which == "ttft" else base.itl).get(cls)
    window = now.minus(then)
    return {
        "p50": histogram_quantile(0.5, window),
        "p99": histogram_quantile(0.99, window),
        "count": int(window.count),
    }


def _deltas(now: Any, then: Any, cls: str) -> dict[str, int]:
    """Per second label (a code or a status) of one class: the increase over the window."""
    result: dict[str, int] = {}
    for labels, value in now.items():
        if len(labels) == 2 and labels[0] == cls:
            before = then.get(labels, 0.0) if then else 0.0
            result[labels[1]] = int(value - before)
    return result
