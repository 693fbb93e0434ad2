"""Everything a request handler needs, built by the app's lifespan and kept on `app.state.gw`."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import redis.asyncio as aioredis

from engine.core.step_record import LoadSnapshot
from engine.process.async_engine import AsyncEngine
from engine.text.tokenizer import Tokenizer
from gateway.admission.intake_lane import IntakeLane
from gateway.admission.service import AdmissionService
from gateway.dispatch.dispatcher import Dispatcher
from gateway.dispatch.token_stream import TokenStreams
from gateway.http.auth import ApiKeyStore, TokenBucketLimiter
from gateway.http.metrics import Metrics
from gateway.queue import QueueStore
from gateway.runtime.settings import Settings
from policies.envelope import Envelope

if TYPE_CHECKING:  # the batch package imports gateway modules that import this one
    from gateway.batch.runtime import BatchRuntime


@dataclass(slots=True)
class GatewayState:
    settings: Settings
    envelope: Envelope
    metrics: Metrics
    auth: ApiKeyStore
    limiter: TokenBucketLimiter
    model_name: str
    started_s: float = field(default_factory=time.time)
    redis: aioredis.Redis | None = None
    store: QueueStore | None = None
    streams: TokenStreams | None = None
    admission: AdmissionService | None = None
    engine: AsyncEngine | None = None
    tokenizer: Tokenizer | None = None
    dispatcher: Dispatcher | None = None
    # The Files and Batch APIs (stores and the batch supervisor).
    batch: BatchRuntime | None = None
    engine_ready: bool = False
    redis_ok: bool = False
    draining: bool = False
    # The drain under way (gateway.http.app.begin_drain), awaited by the lifespan's shutdown.
    drain_task: asyncio.Task[None] | None = None
    # Why the engine could not start (the service then stays unready and says so).
    startup_error: str | None = None
    # Why a started engine stopped running (its process died), for /readyz.
    engine_death: str | None = None
    # Bounds the job submissions in intake at once, fewer while a chat waits for its first
    # token (settings.job_intake_concurrency and ..._while_chats_wait).
    intake_lane: IntakeLane = field(init=False)

    def __post_init__(self) -> None:
        self.intake_lane = IntakeLane(
            self.settings.job_intake_concurrency,
            self.settings.job_intake_concurrency_while_chats_wait,
            self.settings.chat_intake_hold_max_s,
            self.settings.job_intake_trickle_s,
        )

    def not_ready_reasons(self) -> list[str]:
        reasons = []
        if self.startup_error is not None:
            reasons.append(f"engine failed to start: {self.startup_error}")
        elif not self.engine_ready:
            reasons.append("engine warming up")
        elif self.engine is not None and not self.engine.is_running:
            # The engine (process) died: nothing here can run work until a restart.
            reasons.append(f"engine stopped: {self.engine_death or 'not running'}")
        if not self.redis_ok:
            reasons.append("redis unreachable")
        if self.draining:
            reasons.append("draining")
        return reasons

    def engine_load(self) -> LoadSnapshot | None:
        return self.engine.load() if self.engine is not None else None
