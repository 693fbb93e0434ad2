"""The operator console's server side, without a browser: window arithmetic over the
gateway's own histograms and counters, the merged newest-first paging over tenants (real
Redis), who may see what, the admin flag in the key file, and the static files shipped in the
package."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

import pytest
import redis.asyncio as aioredis
from starlette.applications import Starlette
from starlette.testclient import TestClient

from gateway.console import ConsoleLive, console_routes
from gateway.console.listing import Cursor, merged_page, parse_cursor
from gateway.console.windows import HistogramCounts, histogram_quantile
from gateway.http.auth import OPEN_MODE_WARNING, ApiKeyStore, TokenBucketLimiter
from gateway.http.errors import EXCEPTION_HANDLERS, APIError
from gateway.http.metrics import Metrics
from gateway.http.state import GatewayState
from gateway.runtime.settings import Settings
from policies.envelope import Envelope


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def make_state(auth: ApiKeyStore) -> GatewayState:
    return GatewayState(
        settings=Settings(replica_id="r1"),
        envelope=Envelope.default(),
        metrics=Metrics(),
        auth=auth,
        limiter=TokenBucketLimiter(),
        model_name="tiny",
    )


KEYS = {
    "keys": [
        {"key": "admin-k", "tenant": "ops", "admin": True},
        {"key": "alpha-k", "tenant": "alpha"},
    ]
}


# ---- quantiles -------------------------------------------------------------------------------


def test_quantile_interpolates_inside_the_bucket_as_prometheus_does() -> None:
    # 10 observations: 4 in (0, 0.1], 6 in (0.1, 0.5]; none above.
    counts = HistogramCounts((0.1, 0.5, float("inf")), (4.0, 10.0, 10.0))
    assert histogram_quantile(0.5, counts) == pytest.approx(0.1 + 0.4 * (5 - 4) / 6)
    assert histogram_quantile(0.2, counts) == pytest.approx(0.1 * 2 / 4)
    assert histogram_quantile(0.99, counts) == pytest.approx(0.1 + 0.4 * (9.9 - 4) / 6)


def test_quantile_in_the_inf_bucket_is_the_highest_finite_bound_and_empty_is_none() -> None:
    assert histogram_quantile(0.99, HistogramCounts((0.1, float("inf")), (1.0, 5.0))) == 0.1
    assert histogram_quantile(0.5, HistogramCounts((0.1, float("inf")), (0.0, 0.0))) is None


def test_a_window_is_the_difference_of_two_snapshots() -> None:
    later = HistogramCounts((0.1, float("inf")), (5.0, 7.0))
    earlier = HistogramCounts((0.1, float("inf")), (5.0, 5.0))
    assert later.minus(earlier).cumulative == (0.0, 2.0)
    assert later.minus(None) is later


# ---- the live document -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_latency_and_refusals_cover_the_last_minute_only() -> None:
    clock = FakeClock()
    state = make_state(ApiKeyStore.open())
    live = ConsoleLive(state, clock=clock)
    metrics = state.metrics
    for _ in range(3):
        metrics.ttft_s.labels("interactive").observe(4.0)  # long before the window
    metrics.rejections.labels("bulk", "queue_full").inc(2)
    live.sample()
    clock.now_s += 30
    live.sample()
    clock.now_s += 31  # the first snapshot is now 61 s old: the window starts there
    metrics.ttft_s.labels("interactive").observe(0.02)
    metrics.ttft_s.labels("interactive").observe(0.02)
    metrics.rejections.labels("bulk", "deadline_unmeetable").inc()
    body = await live.body()
    assert body["window_s"] == pytest.approx(61.0)
    ttft = body["classes"]["interactive"]["ttft_s"]
    assert ttft["count"] == 2
    # Both in (0.01, 0.025]: p50 at rank 1 of 2, linear in that bucket.
    assert ttft["p50"] == pytest.approx(0.01 + 0.015 * 1 / 2)
    assert body["classes"]["bulk"]["refusals"] == {"queue_full": 0, "deadline_unmeetable": 1}
    assert body["classes"]["interactive"]["itl_s"] == {"p50": None, "p99": None, "count": 0}
    assert [r["replica_id"] for r in body["replicas"]] == ["r1"]


@pytest.mark.anyio
async def test_a_young_replica_reports_the_window_it_has() -> None:
    clock = FakeClock()
    state = make_state(ApiKeyStore.open())
    live = ConsoleLive(state, clock=clock)
    live.sample()
    state.metrics.ttft_s.labels("bulk").observe(1.0)
    clock.now_s += 7
    body = await live.body()
    assert body["window_s"] == pytest.approx(7.0)
    assert body["classes"]["bulk"]["ttft_s"]["count"] == 1


# ---- paging over tenants -----------------------------------------------------------------------


@pytest.fixture
async def redis(redis_server: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_server, decode_responses=True)
    yield client
    await client.aclose()


@pytest.mark.anyio
@pytest.mark.redis
async def test_merged_pages_are_newest_first_without_repeats_or_gaps(
    redis: aioredis.Redis,
) -> None:
    prefix = f"{{t-{uuid.uuid4().hex[:8]}}}:"
    a, b = prefix + "a", prefix + "b"
    # Ties at 200 across and within tenants, to exercise the (score, id) order.
    await redis.zadd(a, {"a1": 100, "a2": 200, "a3": 200, "a4": 400})
    await redis.zadd(b, {"b1": 150, "b2": 200, "b3": 500})
    expected = ["b3", "a4", "b2", "a3", "a2", "b1", "a1"]
    seen: list[str] = []
    cursor: Cursor | None = None
    pages = 0
    while True:
        items, has_more = await merged_page(redis, [(a, "a"), (b, "b")], 2, cursor)
        seen += [i.item_id for i in items]
        pages += 1
        if not has_more:
            break
        cursor = parse_cursor(items[-1].cursor.encode())
    assert seen == expected
    assert pages == 4
    await redis.delete(a, b)


@pytest.mark.anyio
@pytest.mark.redis
async def test_every_replica_on_one_redis_is_listed_and_one_whose_entry_lapsed_is_not(
    redis: aioredis.Redis,
) -> None:
    prefix = f"{{t-{uuid.uuid4().hex[:8]}}}:"
    lives = []
    for replica_id in ("r-a", "r-b"):
        state = make_state(ApiKeyStore.open())
        state.settings = Settings(replica_id=replica_id, key_prefix=prefix)
        state.redis, state.redis_ok = redis, True
        live = ConsoleLive(state)
        assert await live._publish_replica()
        lives.append(live)
    listed = await lives[0].replicas()
    assert [r["replica_id"] for r in listed] == ["r-a", "r-b"]
    assert listed[1]["running"] == {"interactive": 0, "bulk": 0}
    # r-b stopped publishing and its entry lapsed (its TTL, here at once): not listed.
    await redis.delete(f"{prefix}console:replica:r-b")
    assert [r["replica_id"] for r in await lives[0].replicas()] == ["r-a"]


def test_a_malformed_cursor_is_a_400() -> None:
    with pytest.raises(APIError) as caught:
        parse_cursor("not-a-cursor")
    assert caught.value.status == 400


# ---- access ------------------------------------------------------------------------------------


def client_for(auth: ApiKeyStore) -> TestClient:
    state = make_state(auth)
    app = Starlette(routes=console_routes(), exception_handlers=dict(EXCEPTION_HANDLERS))
    app.state.gw = state
    app.state.console = ConsoleLive(state)
    return TestClient(app)


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_open_mode_sees_everything_with_the_servers_warning() -> None:
    with client_for(ApiKeyStore.open()) as client:
        mode = client.get("/console/api/mode").json()
        assert mode == {"open_mode": True, "warning": OPEN_MODE_WARNING}
        session = client.get("/console/api/session").json()
        assert session["open_mode"] and session["live_view"] and session["sees_all_tenants"]
        assert session["warning"] == OPEN_MODE_WARNING
        assert client.get("/console/api/live").status_code == 200


def test_only_an_admin_key_gets_the_live_view_and_a_wrong_key_is_401() -> None:
    with client_for(ApiKeyStore.from_json(json.dumps(KEYS))) as client:
        assert client.get("/console/api/mode").json()["open_mode"] is False
        tenant = client.get("/console/api/session", headers=bearer("alpha-k")).json()
        assert (tenant["tenant"], tenant["admin"], tenant["live_view"]) == ("alpha", False, False)
        assert tenant["tenants"] == ["alpha"]
        denied = client.get("/console/api/live", headers=bearer("alpha-k"))
        assert denied.status_code == 403
        assert denied.json()["error"]["code"] == "admin_required"
        admin = client.get("/console/api/session", headers=bearer("admin-k")).json()
        assert admin["live_view"] and admin["tenants"] == ["alpha", "ops"]
        live: dict[str, Any] = client.get("/console/api/live", headers=bearer("admin-k")).json()
        assert set(live["classes"]) == {"interactive", "bulk"}
        wrong = client.get("/console/api/session", headers=bearer("nope"))
        assert wrong.status_code == 401
        assert wrong.json()["error"]["code"] == "invalid_api_key"
        assert client.get("/console/api/session").status_code == 401


def test_the_admin_flag_must_be_a_boolean() -> None:
    store = ApiKeyStore.from_json(json.dumps(KEYS))
    assert store.authenticate("Bearer admin-k").admin is True
    assert store.authenticate("Bearer alpha-k").admin is False
    bad = {"keys": [{"key": "k", "tenant": "t", "admin": "yes"}]}
    with pytest.raises(ValueError, match="admin must be true or false"):
        ApiKeyStore.from_json(json.dumps(bad))


# ---- the page ships in the package ---------------------------------------------------------------


def test_the_page_and_the_vendored_chart_library_are_package_data() -> None:
    static = resources.files("gateway.console").joinpath("static")
    for name in ("index.html", "console.js", "console.css", "uPlot.iife.min.js", "uPlot.min.css"):
        assert static.joinpath(name).is_file(), name
    assert "MIT License" in static.joinpath("uPlot.LICENSE").read_text()
    with client_for(ApiKeyStore.open()) as client:
        page = client.get("/console/")
        assert page.status_code == 200 and "mixgate console" in page.text
        assert client.get("/console/static/console.js").status_code == 200
        assert client.get("/console", follow_redirects=False).status_code == 307
