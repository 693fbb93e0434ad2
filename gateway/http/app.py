"""The Starlette app factory; its lifespan brings up Redis, the engine and the dispatcher.

The server accepts connections at once: the engine loads and warms up in the background and
/readyz says so until it is ready (requests meanwhile get 503).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
import structlog
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route

from engine.process.startup_heap import freeze_startup_heap
from gateway.admission.service import AdmissionService
from gateway.batch.runtime import BatchRuntime
from gateway.console import ConsoleLive, console_routes
from gateway.dispatch.dispatcher import Dispatcher, DispatcherConfig
from gateway.dispatch.token_stream import TokenStreams
from gateway.http import (
    routes_batches,
    routes_chat,
    routes_chat_resume,
    routes_completions,
    routes_engine_steps,
    routes_jobs,
    routes_ops,
)
from gateway.http.auth import OPEN_MODE_WARNING, ApiKeyStore, TokenBucketLimiter
from gateway.http.errors import EXCEPTION_HANDLERS
from gateway.http.logging_setup import RequestIdMiddleware
from gateway.http.metrics import LocalJobsView, Metrics, engine_step_records
from gateway.http.state import GatewayState
from gateway.queue import Keys, QueueStore
from gateway.runtime import redis_health
from gateway.runtime.bounded_cancel import cancel_and_wait
from gateway.runtime.embedded_redis import EmbeddedRedis
from gateway.runtime.engine_setup import engine_config, resolve_model_dir, start_engine
from gateway.runtime.settings import Settings
from gateway.runtime.warm_paths import warm_chat_path
from policies.admission import AdmissionConfig
from policies.aging import ClassOffsets
from policies.envelope import Envelope, load_envelope
from policies.in_flight_work import NO_WORK_IN_FLIGHT, InFlightWork
from policies.request_class import RequestClass
from policies.scheduling_policy import NO_DEADLINE_S, SchedulingPolicy, gateway_envelope

log = structlog.get_logger("mixgate.app")


def load_auth(settings: Settings) -> ApiKeyStore:
    if settings.api_keys_path is not None:
        return ApiKeyStore.from_file(settings.api_keys_path)
    if settings.api_keys_json:
        return ApiKeyStore.from_json(settings.api_keys_json)
    return ApiKeyStore.open()


def load_settings_envelope(settings: Settings) -> Envelope:
    if settings.envelope_path is None:
        return Envelope.default(settings.engine)
    return load_envelope(Path(settings.envelope_path).read_text())


def create_app(settings: Settings, *, redis_client: aioredis.Redis | None = None) -> Starlette:
    policy = SchedulingPolicy(settings.policy)
    envelope = gateway_envelope(load_settings_envelope(settings), policy)
    model_name = settings.model_name or (
        settings.model_dir.name if settings.model_dir is not None else "small"
    )
    state = GatewayState(
        settings=settings,
        envelope=envelope,
        metrics=Metrics(),
        auth=load_auth(settings),
        limiter=TokenBucketLimiter(),
        model_name=model_name,
    )
    routes = [
        Route("/v1/chat/completions", routes_chat.chat_completions, methods=["POST"]),
        Route(
            "/v1/chat/completions/{completion_id}/stream",
            routes_chat_resume.resume_chat_stream,
            methods=["GET"],
        ),
        Route("/v1/completions", routes_completions.completions, methods=["POST"]),
        Route("/v1/jobs", routes_jobs.create_job, methods=["POST"]),
        Route("/v1/jobs", routes_jobs.list_jobs, methods=["GET"]),
        Route("/v1/jobs/{job_id}", routes_jobs.get_job, methods=["GET"]),
        Route("/v1/jobs/{job_id}", routes_jobs.cancel_job, methods=["DELETE"]),
        Route("/v1/models", routes_ops.models, methods=["GET"]),
        Route("/v1/envelope", routes_ops.envelope, methods=["GET"]),
        Route("/v1/engine/steps", routes_engine_steps.engine_steps, methods=["GET"]),
        Route("/health", routes_ops.health, methods=["GET"]),
        Route("/healthz", routes_ops.healthz, methods=["GET"]),
        Route("/readyz", routes_ops.readyz, methods=["GET"]),
        Route("/metrics", routes_ops.metrics, methods=["GET"]),
        Route("/openapi.json", routes_ops.openapi, methods=["GET"]),
        *routes_batches.batch_routes(),
        *console_routes(),
    ]
    console = ConsoleLive(state)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        embedded = None
        if redis_client is not None:
            client = redis_client
        elif settings.redis_url:
            client = aioredis.Redis(connection_pool=_pool(settings, url=settings.redis_url))
        else:
            embedded = EmbeddedRedis(settings.data_dir)
            client = await embedded.start(lambda socket: _pool(settings, unix_socket_path=socket))
        state.redis = client
        keys = Keys(settings.key_prefix)
        state.store = QueueStore(client, keys)
        state.streams = TokenStreams(client, keys.out, settings.stream_ttl_s)
        state.admission = AdmissionService(
            state.store,
            envelope,
            AdmissionConfig(
                interactive_ttft_target_s=envelope.interactive_ttft_target_s,
                bulk_default_deadline_s=(
                    AdmissionConfig().bulk_default_deadline_s
                    if policy.admits_by_deadline
                    else NO_DEADLINE_S
                ),
            ),
            state.engine_load,
            lambda: _bulk_in_flight(state),
        )
        state.batch = BatchRuntime.create(
            client, state.store, settings, envelope.queue_limit(RequestClass.BULK)
        )
        state.metrics.watch(
            state.engine_load,
            lambda: _depths(state),
            lambda: engine_step_records(state.engine),
            lambda: _dispatch_events(state),
        )
        state.metrics.watch_intake(state.intake_lane)
        state.metrics.watch_local_jobs(lambda: _local_jobs(state))
        if state.auth.is_open:
            log.warning("auth_open", message=OPEN_MODE_WARNING)
        tasks = [
            asyncio.create_task(_bring_up(state), name="bring-up"),
            asyncio.create_task(_watch_redis(state), name="watch-redis"),
            asyncio.create_task(state.batch.supervisor.run(), name="batch-supervisor"),
            asyncio.create_task(state.metrics.probe_loop_lag(), name="loop-lag-probe"),
            asyncio.create_task(console.run(), name="console-sampler"),
        ]
        try:
            yield
        finally:
            await begin_drain(state)
            await cancel_and_wait(tasks)

            async def stop_engine() -> None:
                if state.engine is not None:
                    await state.engine.stop()

            async def stop_redis() -> None:
                if redis_client is None:
                    await client.aclose()
                if embedded is not None:
                    await embedded.stop()

            # Side by side: once the dispatcher has stopped, the engine no longer needs Redis,
            # and each waits on a child's exit (the engine's frees its whole KV cache).
            await asyncio.gather(stop_engine(), stop_redis())

    app = Starlette(
        routes=routes,
        middleware=[Middleware(RequestIdMiddleware)],
        exception_handlers=dict(EXCEPTION_HANDLERS),
        lifespan=lifespan,
    )
    app.state.gw = state
    app.state.console = console
    return app


def begin_drain(state: GatewayState) -> asyncio.Task[None]:
    """Start the drain once: not ready, stop claiming, local jobs get drain_timeout_s.

    NOTE: `mixgate serve` calls this on SIGTERM itself, before uvicorn waits for open
    connections (SSE streams) to close; waiting for the lifespan's shutdown would let the
    dispatcher claim new work all that while, and the drain could take twice its time.
    """
    if state.drain_task is None:
        state.draining = True
        state.drain_task = asyncio.get_running_loop().create_task(_drain(state), name="drain")
    return state.drain_task


async def _drain(state: GatewayState) -> None:
    if state.dispatcher is not None:
        await state.dispatcher.stop(state.settings.drain_timeout_s)


def _pool(settings: Settings, **where: str) -> aioredis.BlockingConnectionPool:
    """A bounded pool that waits for a free connection instead of failing at once."""
    timeouts: dict[str, Any] = {
        "socket_connect_timeout": settings.redis_connect_timeout_s,
        "socket_timeout": settings.redis_socket_timeout_s,
    }
    if "url" in where:
        return aioredis.BlockingConnectionPool.from_url(
            where["url"],
            max_connections=settings.redis_max_connections,
            timeout=settings.redis_pool_timeout_s,
            decode_responses=True,
            **timeouts,
        )
    return aioredis.BlockingConnectionPool(
        max_connections=settings.redis_max_connections,
        timeout=settings.redis_pool_timeout_s,
        connection_class=aioredis.UnixDomainSocketConnection,
        path=where["unix_socket_path"],
        decode_responses=True,
        **timeouts,
    )


def _dispatch_events(state: GatewayState) -> dict[tuple[str, RequestClass], int]:
    if state.dispatcher is None:
        return {}
    return {(kind.value, c): n for (kind, c), n in state.dispatcher.counters.snapshot().items()}


def _local_jobs(state: GatewayState) -> LocalJobsView | None:
    dispatcher = state.dispatcher
    if dispatcher is None:
        return None
    work = {c: dispatcher.work.of(c) for c in RequestClass}
    return dispatcher.in_flight(), dispatcher.unstarted_bulk(), work


def _bulk_in_flight(state: GatewayState) -> InFlightWork:
    if state.dispatcher is None:
        return NO_WORK_IN_FLIGHT
    return state.dispatcher.work.of(RequestClass.BULK)


def _depths(state: GatewayState) -> dict[RequestClass, tuple[int, int]]:
    if state.admission is None:
        return {}
    return {c: (d.jobs, d.queued_tokens) for c, d in state.admission.last_depths.items()}


async def _bring_up(state: GatewayState) -> None:
    settings = state.settings
    try:
        model_dir = await asyncio.to_thread(resolve_model_dir, settings)
        if settings.model_name is None:
            state.model_name = model_dir.name
        state.engine = await start_engine(
            model_dir,
            engine_config(state.envelope, settings),
            backend=settings.engine,
            in_process=not settings.engine_process,
        )
        state.tokenizer = state.engine.engine.tokenizer
    except Exception as error:  # noqa: BLE001 - reported by /readyz and the log
        state.startup_error = repr(error)
        log.exception("engine_start_failed")
        return
    assert state.store is not None and state.streams is not None and state.redis is not None
    envelope = state.envelope
    offsets = ClassOffsets(bulk_ms=envelope.bulk_class_offset_ms).by_class_ms()
    state.dispatcher = Dispatcher(
        state.store,
        state.streams,
        state.engine,
        DispatcherConfig(
            replica_id=settings.replica_id,
            lease_ms=int(settings.lease_s * 1000),
            renew_interval_ms=int(settings.lease_s * 1000) // 3,
            reclaim_interval_ms=int(settings.lease_s * 1000) // 2,
            max_active_by_class=_claim_slots(envelope, settings),
            class_offsets_ms=offsets,
            max_unstarted_bulk_jobs=settings.bulk_claim_pacing,
        ),
        redis=state.redis,
        on_finished=lambda cls, status, timings: _on_finished(state, cls, status, timings),
    )
    await state.dispatcher.start()
    # Before the heap is frozen, so that what it loads is frozen with the rest.
    await warm_chat_path(state.tokenizer)
    frozen = freeze_startup_heap()
    state.engine_ready = True
    log.info("ready", model=state.model_name, replica=settings.replica_id, gc_frozen=frozen)
    wait_dead = getattr(state.engine, "wait_dead", None)
    if wait_dead is not None:
        await _on_engine_death(state, wait_dead)


async def _on_engine_death(state: GatewayState, wait_dead: Callable[[], Awaitable[None]]) -> None:
    """When the engine process dies: not ready at once, local jobs back to the lease path.

    NOTE: /readyz turns 503 by itself (the engine's is_running is False the moment the child
    exits); here the dispatcher stops claiming and hands its leases back, and a reclaim sweep
    requeues them at once (a chat that already streamed tokens ends with an error event, by
    reclaim's rule), so every job completes exactly once, after a restart or elsewhere.
    """
    await wait_dead()
    if state.draining or state.engine is None:
        return  # stopped on purpose
    state.engine_death = getattr(state.engine, "death_reason", None)
    log.error("engine_died_replica_not_ready", reason=state.engine_death)
    dispatcher, state.dispatcher = state.dispatcher, None
    if dispatcher is None:
        return
    try:
        await dispatcher.stop(0.0)
        await dispatcher.reclaim_lapsed()
    except Exception:  # noqa: BLE001 - leases left behind lapse; any replica reclaims them
        log.warning("engine_death_hand_back_failed", exc_info=True)


def _claim_slots(envelope: Envelope, settings: Settings) -> dict[RequestClass, int]:
    """Local slots per class; a class this replica does not claim gets none."""
    slots = envelope.slots_by_class()
    return {c: n if c.value in settings.claimed_classes else 0 for c, n in slots.items()}


def _on_finished(
    state: GatewayState, cls: RequestClass, status: str, timings: dict[str, object] | None
) -> None:
    state.metrics.jobs_finished.labels(cls.value, status).inc()
    if timings:
        state.metrics.observe_timings(cls, timings)


async def _watch_redis(state: GatewayState) -> None:
    assert state.redis is not None and state.admission is not None
    redis, admission = state.redis, state.admission

    async def check() -> None:
        await redis.ping()
        admission.last_depths = await admission.store.depths()

    interval_s = state.settings.redis_check_interval_s
    await redis_health.watch(state, check, interval_s, timeout_s=max(interval_s, 2.0))
