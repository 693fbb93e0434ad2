"""API keys (file, JSON, open mode), the 401s, and the token bucket driven by an explicit clock."""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

import gateway.http.auth as auth_module
from gateway.http.auth import (
    OPEN_TENANT,
    ApiKeyStore,
    Principal,
    TokenBucketLimiter,
    enforce_rate_limit,
)
from gateway.http.errors import EXCEPTION_HANDLERS, APIError
from policies.request_class import RequestClass

ACME_KEY = "sk-acme-0123456789abcdef"
BULKCO_KEY = "sk-bulkco-fedcba9876543210"
KEYS_DOC: dict[str, Any] = {
    "keys": [
        {"key": ACME_KEY, "tenant": "acme", "rate_limit_per_s": 10},
        {"key": BULKCO_KEY, "tenant": "bulkco", "classes": ["bulk"]},
    ]
}
KEYS_TOML = f"""
[[keys]]
key = "{ACME_KEY}"
tenant = "acme"
rate_limit_per_s = 10

[[keys]]
key = "{BULKCO_KEY}"
tenant = "bulkco"
classes = ["bulk"]
"""


def _store() -> ApiKeyStore:
    return ApiKeyStore.from_json(json.dumps(KEYS_DOC))


def _principal(rate_limit_per_s: float | None, key_id: str = "k1") -> Principal:
    return Principal("acme", frozenset(RequestClass), rate_limit_per_s, key_id)


def _assert_both_tenants(store: ApiKeyStore) -> None:
    acme = store.authenticate(f"Bearer {ACME_KEY}")
    assert acme.tenant == "acme"
    assert acme.allowed_classes == frozenset({RequestClass.INTERACTIVE, RequestClass.BULK})
    assert acme.rate_limit_per_s == 10.0
    bulkco = store.authenticate(f"Bearer {BULKCO_KEY}")
    assert bulkco.tenant == "bulkco"
    assert bulkco.allowed_classes == frozenset({RequestClass.BULK})
    assert bulkco.rate_limit_per_s is None
    assert acme.key_id != bulkco.key_id
    assert len(acme.key_id) == 8


def test_all_names_exist() -> None:
    for name in auth_module.__all__:
        assert hasattr(auth_module, name), name


def test_from_json() -> None:
    store = _store()
    assert not store.is_open
    _assert_both_tenants(store)


def test_from_json_file(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(KEYS_DOC), encoding="utf-8")
    _assert_both_tenants(ApiKeyStore.from_file(path))


def test_from_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(KEYS_TOML, encoding="utf-8")
    _assert_both_tenants(ApiKeyStore.from_file(str(path)))


def test_open_mode_lets_everyone_in_as_default() -> None:
    store = ApiKeyStore.open()
    assert store.is_open
    for header in (None, "", "Bearer whatever"):
        principal = store.authenticate(header)
        assert principal.tenant == OPEN_TENANT
        assert principal.allowed_classes == frozenset(RequestClass)
        assert principal.rate_limit_per_s is None


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "  Bearer"])
def test_bearer_scheme_is_case_insensitive(scheme: str) -> None:
    assert _store().authenticate(f"{scheme}  {ACME_KEY} ").tenant == "acme"


@pytest.mark.parametrize("header", [None, "", "   ", "Bearer", "Bearer   ", f"Basic {ACME_KEY}"])
def test_missing_key_is_401(header: str | None) -> None:
    with pytest.raises(APIError) as caught:
        _store().authenticate(header)
    error = caught.value
    assert (error.status, error.type, error.code) == (
        401,
        "authentication_error",
        "missing_api_key",
    )
    assert error.headers["WWW-Authenticate"] == "Bearer"
    assert ACME_KEY not in error.message


@pytest.mark.parametrize("presented", ["sk-wrong", ACME_KEY + "x", ACME_KEY[:-1], ACME_KEY.upper()])
def test_invalid_key_is_401_without_echoing_it(presented: str) -> None:
    with pytest.raises(APIError) as caught:
        _store().authenticate(f"Bearer {presented}")
    assert (caught.value.status, caught.value.code) == (401, "invalid_api_key")
    assert presented not in caught.value.message


def test_every_key_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real_compare: Callable[[bytes, bytes], bool] = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real_compare(a, b)

    # auth calls hmac.compare_digest through the module, so patching the module sees every call.
    monkeypatch.setattr(hmac, "compare_digest", spy)
    store = _store()
    store.authenticate(f"Bearer {ACME_KEY}")  # matches the first entry...
    assert len(calls) == 2  # ...and still compares the second: no early exit
    # Digests are compared, never the keys themselves.
    assert all(len(a) == len(b) == 32 for a, b in calls)
    assert all(ACME_KEY.encode() not in (a, b) for a, b in calls)
    calls.clear()
    with pytest.raises(APIError):
        store.authenticate("Bearer sk-nobody")
    assert len(calls) == 2


def test_keys_never_appear_in_repr_or_str() -> None:
    store = _store()
    principal = store.authenticate(f"Bearer {ACME_KEY}")
    for text in (repr(store), str(store), repr(principal), str(principal), repr(store.key_ids)):
        assert ACME_KEY not in text
        assert BULKCO_KEY not in text
    assert "2 keys" in repr(store)
    assert repr(ApiKeyStore.open()) == "ApiKeyStore(open)"


@pytest.mark.parametrize(
    "doc",
    [
        {"keys": []},  # NOTE: never open mode by accident
        {},
        {"keys": [{"key": ACME_KEY}]},
        {"keys": [{"key": ACME_KEY, "tenant": "acme corp"}]},
        {"keys": [{"key": ACME_KEY, "tenant": "acme", "classes": []}]},
        {"keys": [{"key": ACME_KEY, "tenant": "acme", "classes": ["batch"]}]},
        {"keys": [{"key": ACME_KEY, "tenant": "acme", "rate_limit_per_s": 0}]},
        {"keys": [{"key": ACME_KEY, "tenant": "acme", "rate_limit_per_s": "10"}]},
        {"keys": [{"key": ACME_KEY, "tenant": "acme", "rate_limit": 10}]},
        {"keys": [{"key": "has space", "tenant": "acme"}]},
        {"keys": [{"key": ACME_KEY, "tenant": "a"}, {"key": ACME_KEY, "tenant": "b"}]},
        {"keys": [{"key": ACME_KEY, "tenant": "acme"}], "extra": 1},
    ],
)
def test_bad_config_is_rejected_without_quoting_keys(doc: dict[str, Any]) -> None:
    with pytest.raises(ValueError) as caught:
        ApiKeyStore.from_json(json.dumps(doc))
    assert ACME_KEY not in str(caught.value)


def test_unparseable_config_does_not_quote_it() -> None:
    with pytest.raises(ValueError) as caught:
        ApiKeyStore.from_json('{"keys": [{"key": "' + ACME_KEY + '", }]}')
    assert ACME_KEY not in str(caught.value)
    with pytest.raises(ValueError) as caught:
        ApiKeyStore.from_toml(f'keys = "{ACME_KEY}')
    assert ACME_KEY not in str(caught.value)


def test_principal_validates() -> None:
    with pytest.raises(ValueError):
        Principal("", frozenset(RequestClass), None, "k")
    with pytest.raises(ValueError):
        Principal("acme", frozenset(RequestClass), -1.0, "k")


# ---- through HTTP ---------------------------------------------------------------------------


def test_401_through_a_starlette_app() -> None:
    store = _store()

    async def whoami(request: Request) -> JSONResponse:
        principal = store.authenticate(request.headers.get("authorization"))
        return JSONResponse({"tenant": principal.tenant})

    app = Starlette(routes=[Route("/whoami", whoami)], exception_handlers=dict(EXCEPTION_HANDLERS))
    client = TestClient(app)
    assert client.get("/whoami", headers={"Authorization": f"Bearer {ACME_KEY}"}).json() == {
        "tenant": "acme"
    }
    response = client.get("/whoami")
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"]["code"] == "missing_api_key"
    response = client.get("/whoami", headers={"Authorization": "Bearer sk-nope"})
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


# ---- token bucket ---------------------------------------------------------------------------


def test_bucket_allows_a_burst_of_rate_then_refills() -> None:
    limiter = TokenBucketLimiter()
    principal = _principal(rate_limit_per_s=2.0)
    assert limiter.check(principal, now_s=100.0) is None
    assert limiter.check(principal, now_s=100.0) is None
    assert limiter.check(principal, now_s=100.0) == pytest.approx(0.5)
    assert limiter.check(principal, now_s=100.25) == pytest.approx(0.25)
    assert limiter.check(principal, now_s=100.5) is None
    # A long idle period refills only up to the capacity (2), not beyond.
    assert limiter.check(principal, now_s=1000.0) is None
    assert limiter.check(principal, now_s=1000.0) is None
    assert limiter.check(principal, now_s=1000.0) is not None


def test_bucket_capacity_is_at_least_one() -> None:
    limiter = TokenBucketLimiter()
    principal = _principal(rate_limit_per_s=0.5)
    assert limiter.check(principal, now_s=0.0) is None
    assert limiter.check(principal, now_s=0.0) == pytest.approx(2.0)
    assert limiter.check(principal, now_s=2.0) is None


def test_bucket_uses_the_injected_clock() -> None:
    now_s = [10.0]
    limiter = TokenBucketLimiter(clock=lambda: now_s[0])
    principal = _principal(rate_limit_per_s=1.0)
    assert limiter.check(principal) is None
    assert limiter.check(principal) == pytest.approx(1.0)
    now_s[0] = 11.0
    assert limiter.check(principal) is None


def test_buckets_are_per_key_and_unlimited_keys_pass() -> None:
    limiter = TokenBucketLimiter()
    first, second = _principal(1.0, "k1"), _principal(1.0, "k2")
    assert limiter.check(first, now_s=0.0) is None
    assert limiter.check(second, now_s=0.0) is None
    assert limiter.check(first, now_s=0.0) is not None
    unlimited = _principal(None)
    assert all(limiter.check(unlimited, now_s=0.0) is None for _ in range(1000))


def test_clock_stepping_back_does_not_drain() -> None:
    limiter = TokenBucketLimiter()
    principal = _principal(rate_limit_per_s=1.0)
    assert limiter.check(principal, now_s=50.0) is None
    assert limiter.check(principal, now_s=10.0) == pytest.approx(1.0)
    assert limiter.check(principal, now_s=51.0) is None


def test_enforce_rate_limit_raises_429_with_retry_after() -> None:
    limiter = TokenBucketLimiter()
    principal = _principal(rate_limit_per_s=1.0)
    enforce_rate_limit(limiter, principal, now_s=0.0)
    with pytest.raises(APIError) as caught:
        enforce_rate_limit(limiter, principal, now_s=0.25)
    error = caught.value
    assert (error.status, error.type, error.code) == (
        429,
        "rate_limit_error",
        "rate_limit_exceeded",
    )
    assert error.headers["Retry-After"] == "1"
