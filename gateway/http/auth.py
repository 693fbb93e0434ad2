"""API keys: who is calling, which classes they may use, and how fast they may call.

Keys come from a JSON or TOML document::

    {"keys": [{"key": "...", "tenant": "acme", "classes": ["interactive", "bulk"],
               "rate_limit_per_s": 10, "admin": false}]}

``classes`` defaults to every class, ``rate_limit_per_s`` to no limit and ``admin`` to false
(an admin key sees every tenant's jobs and batches and the live view in the operator console,
``/console``; it changes nothing on the API routes). Only sha256 digests
of the keys are kept, lookups compare every digest in constant time, and no key ever appears in
an error, a repr or a log line. With no keys configured (``ApiKeyStore.open()``) every request
is tenant ``default`` with every class: for development only, and ``is_open`` lets startup warn.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from gateway.http.errors import APIError
from policies.request_class import RequestClass

__all__ = [
    "OPEN_MODE_WARNING",
    "OPEN_TENANT",
    "ApiKeyStore",
    "Principal",
    "RateLimiter",
    "TokenBucketLimiter",
    "enforce_rate_limit",
]

OPEN_TENANT: Final = "default"
# What the server logs at start in open mode, and what the operator console shows.
OPEN_MODE_WARNING: Final = (
    "no API keys configured: open dev mode, every request is tenant 'default' with all classes"
)
ALL_CLASSES: Final = frozenset(RequestClass)
# Tenants name Redis keys, metric labels and log fields: a closed alphabet keeps them safe there.
_TENANT = re.compile(r"[A-Za-z0-9._-]{1,64}")
_ENTRY_FIELDS: Final = frozenset({"key", "tenant", "classes", "rate_limit_per_s", "admin"})
_KEY_ID_HEX_CHARS: Final = 8


@dataclass(frozen=True, slots=True)
class Principal:
    """The authenticated caller; holds nothing secret, so it may be logged."""

    tenant: str
    allowed_classes: frozenset[RequestClass]
    # Requests per second this key may make (per replica); None: unlimited.
    rate_limit_per_s: float | None
    # The first hex digits of the key's sha256: names the key in logs without revealing it.
    key_id: str
    # Marked admin in the key file: the operator console shows it every tenant and the live view.
    admin: bool = False

    def __post_init__(self) -> None:
        if not self.tenant:
            raise ValueError("tenant must be non-empty")
        if self.rate_limit_per_s is not None and not (
            math.isfinite(self.rate_limit_per_s) and self.rate_limit_per_s > 0
        ):
            raise ValueError(f"rate_limit_per_s must be > 0 or None, got {self.rate_limit_per_s}")


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def _parse_classes(raw: Any, where: str) -> frozenset[RequestClass]:
    if raw is None:
        return ALL_CLASSES
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"{where}.classes must be a non-empty list of class names")
    valid = {c.value for c in RequestClass}
    if any(not isinstance(name, str) or name not in valid for name in raw):
        raise ValueError(f"{where}.classes may only contain {sorted(valid)}")
    return frozenset(RequestClass(name) for name in raw)


def _parse_rate(raw: Any, where: str) -> float | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise ValueError(f"{where}.rate_limit_per_s must be a number")
    if not (math.isfinite(raw) and raw > 0):
        raise ValueError(f"{where}.rate_limit_per_s must be > 0")
    return float(raw)


def _parse_entry(raw: Any, index: int) -> tuple[bytes, Principal]:
    # NOTE: messages name the entry by position, never by key: config errors get logged.
    where = f"keys[{index}]"
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be a table/object")
    unknown = set(raw) - _ENTRY_FIELDS
    if unknown:
        # A typo such as "rate_limit" would otherwise silently mean "unlimited".
        raise ValueError(f"{where} has unknown fields: {sorted(unknown)}")
    key = raw.get("key")
    if not isinstance(key, str) or not key or any(ch.isspace() for ch in key):
        raise ValueError(f"{where}.key must be a non-empty string without whitespace")
    tenant = raw.get("tenant")
    if not isinstance(tenant, str) or not _TENANT.fullmatch(tenant):
        raise ValueError(f"{where}.tenant must be 1-64 characters of A-Z, a-z, 0-9, '.', '_', '-'")
    admin = raw.get("admin", False)
    if not isinstance(admin, bool):
        raise ValueError(f"{where}.admin must be true or false")
    digest = _digest(key)
    principal = Principal(
        tenant=tenant,
        allowed_classes=_parse_classes(raw.get("classes"), where),
        rate_limit_per_s=_parse_rate(raw.get("rate_limit_per_s"), where),
        key_id=digest.hex()[:_KEY_ID_HEX_CHARS],
        admin=admin,
    )
    return digest, principal


def _parse_bearer(authorization_header: str | None) -> str:
    if authorization_header is None or not authorization_header.strip():
        raise APIError.authentication(
            "You didn't provide an API key. Send it in the Authorization header: "
            "'Authorization: Bearer YOUR_KEY'.",
            code="missing_api_key",
        )
    scheme, _, token = authorization_header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise APIError.authentication(
            "The Authorization header must use the Bearer scheme: 'Authorization: Bearer "
            "YOUR_KEY'.",
            code="missing_api_key",
        )
    return token


@dataclass(frozen=True, slots=True)
class ApiKeyStore:
    """The configured keys, as (sha256 digest, principal) pairs; empty means open (dev) mode."""

    _entries: tuple[tuple[bytes, Principal], ...] = field(repr=False)

    def __post_init__(self) -> None:
        key_ids = [principal.key_id for _, principal in self._entries]
        if len({digest for digest, _ in self._entries}) != len(self._entries):
            raise ValueError("the same API key is configured more than once")
        if len(set(key_ids)) != len(key_ids):
            # Rate limits are kept per key_id; two keys sharing a prefix would share a bucket.
            raise ValueError("two API keys share a key_id prefix; generate a new one of them")

    def __repr__(self) -> str:
        if self.is_open:
            return "ApiKeyStore(open)"
        return f"ApiKeyStore({len(self._entries)} keys, key_ids={self.key_ids})"

    # ---- sources --------------------------------------------------------------------------

    @classmethod
    def open(cls) -> ApiKeyStore:
        """No keys: every request is tenant ``default`` with every class (development only)."""
        return cls(())

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> ApiKeyStore:
        raw_keys = data.get("keys")
        extra = set(data) - {"keys"}
        if extra:
            raise ValueError(f"unknown top-level fields in the key file: {sorted(extra)}")
        # NOTE: an empty list is an error, not open mode: a truncated key file must not turn
        # authentication off. Open mode is only ever asked for explicitly.
        if not isinstance(raw_keys, list) or not raw_keys:
            raise ValueError("'keys' must be a non-empty list (use ApiKeyStore.open() for none)")
        return cls(tuple(_parse_entry(raw, i) for i, raw in enumerate(raw_keys)))

    @classmethod
    def from_json(cls, text: str) -> ApiKeyStore:
        """From a JSON document, e.g. the value of an environment variable."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            # Only the position: the document holds secrets, so none of it is quoted.
            raise ValueError(
                f"API keys are not valid JSON (line {exc.lineno}, column {exc.colno})"
            ) from None
        if not isinstance(data, dict):
            raise ValueError("API keys must be a JSON object with a 'keys' list")
        return cls.from_mapping(data)

    @classmethod
    def from_toml(cls, text: str) -> ApiKeyStore:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            raise ValueError("API keys are not valid TOML") from None
        return cls.from_mapping(data)

    @classmethod
    def from_file(cls, path: str | Path) -> ApiKeyStore:
        """A ``.toml`` file is read as TOML, anything else as JSON."""
        file_path = Path(path)
        text = file_path.read_text(encoding="utf-8")
        if file_path.suffix.lower() == ".toml":
            return cls.from_toml(text)
        return cls.from_json(text)

    # ---- lookups --------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return not self._entries

    @property
    def tenants(self) -> tuple[str, ...]:
        """Every configured tenant, sorted (open mode: the one tenant every request is)."""
        if self.is_open:
            return (OPEN_TENANT,)
        return tuple(sorted({principal.tenant for _, principal in self._entries}))

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(principal.key_id for _, principal in self._entries)

    def authenticate(self, authorization_header: str | None) -> Principal:
        """The caller behind an ``Authorization: Bearer <key>`` header, or an APIError 401."""
        if self.is_open:
            # Whatever the header says: in open mode there is nothing to check it against.
            return Principal(OPEN_TENANT, ALL_CLASSES, None, key_id="open")
        presented = _digest(_parse_bearer(authorization_header))
        found: Principal | None = None
        # Every entry is compared, with no early exit, so the time taken says nothing about
        # which key (or how much of one) matched.
        for digest, principal in self._entries:
            if hmac.compare_digest(digest, presented):
                found = principal
        if found is None:
            raise APIError.authentication("Incorrect API key provided.", code="invalid_api_key")
        return found


# ---- rate limiting --------------------------------------------------------------------------


class RateLimiter(Protocol):
    def check(self, principal: Principal, now_s: float | None = None) -> float | None:
        """None when the request may go ahead (and it is counted), else seconds to wait."""
        ...


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated_s: float


class TokenBucketLimiter:
    """A token bucket per key: bursts up to ``max(1, rate)`` requests, refilled at ``rate``/s.

    NOTE: the buckets live in this process, so each replica allows the full rate; N replicas
    behind a balancer allow up to N times it. A Redis-backed shared limiter can replace this
    one behind the same ``RateLimiter`` protocol when that matters.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[tuple[str, str], _Bucket] = {}

    def check(self, principal: Principal, now_s: float | None = None) -> float | None:
        rate_per_s = principal.rate_limit_per_s
        if rate_per_s is None:
            return None
        if now_s is None:
            now_s = self._clock()
        capacity = max(1.0, rate_per_s)
        bucket = self._buckets.setdefault(
            (principal.tenant, principal.key_id), _Bucket(tokens=capacity, updated_s=now_s)
        )
        # max(0, ...): a clock that steps back must not drain the bucket.
        elapsed_s = max(0.0, now_s - bucket.updated_s)
        bucket.tokens = min(capacity, bucket.tokens + elapsed_s * rate_per_s)
        bucket.updated_s = max(bucket.updated_s, now_s)
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return None
        return (1.0 - bucket.tokens) / rate_per_s


def enforce_rate_limit(
    limiter: RateLimiter, principal: Principal, now_s: float | None = None
) -> None:
    """Count the request, or raise the 429 (``rate_limit_exceeded`` with ``Retry-After``)."""
    wait_s = limiter.check(principal, now_s)
    if wait_s is not None:
        raise APIError.rate_limit(
            f"Rate limit reached for this API key ({principal.rate_limit_per_s:g} requests "
            f"per second). Retry after {wait_s:.2f}s.",
            retry_after_s=wait_s,
        )
