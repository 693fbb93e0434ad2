"""Classify a request: which traffic class it runs in, or why it may not run at all.

The class decides the queue, the scheduling priority and the admission test, so it is decided
once, at the edge, from three inputs in increasing order of precedence:

1. the endpoint's default (chat completions -> interactive, jobs -> bulk);
2. OpenAI's ``service_tier`` body field: ``"flex"`` -> bulk, ``"priority"`` -> interactive,
   ``"auto"``/``"default"``/absent keep the endpoint default;
3. the ``X-Mixgate-Class`` header (``interactive`` | ``bulk``, case-insensitive).

The API key's allowed classes are checked last, against the class actually asked for. A key that
may not use that class gets a 403: the request is never silently moved to a class the caller did
not ask for, because a silent downgrade turns a latency promise into a surprise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal

from policies.request_class import RequestClass

__all__ = [
    "CLASS_HEADER",
    "SERVICE_TIERS",
    "Classification",
    "ClassificationError",
    "ClassSource",
    "classify",
]

CLASS_HEADER: Final = "X-Mixgate-Class"

# None: keep the endpoint's default class.
# NOTE: service_tier is matched case-sensitively, as OpenAI's API does; the header is not,
# because HTTP header values are typed by hand far more often than JSON enum values.
SERVICE_TIERS: Final[Mapping[str, RequestClass | None]] = MappingProxyType(
    {
        "auto": None,
        "default": None,
        "flex": RequestClass.BULK,
        "priority": RequestClass.INTERACTIVE,
    }
)

# Where the final class came from, so a 403 (and the request log) can say why.
ClassSource = Literal["endpoint", "service_tier", "header"]

_PARAM_BY_SOURCE: Final[Mapping[ClassSource, str | None]] = MappingProxyType(
    {"endpoint": None, "service_tier": "service_tier", "header": CLASS_HEADER}
)


@dataclass(frozen=True, slots=True)
class ClassificationError:
    """An OpenAI-style error: the gateway renders ``{"error": {message, type, code, param}}``."""

    status_code: int  # HTTP status: 400 (bad input) or 403 (class not allowed for this key)
    error_type: str  # OpenAI "type": invalid_request_error | permission_error
    code: str  # OpenAI "code": invalid_value | class_not_allowed
    message: str  # human-readable, names the offending value
    param: str | None  # the input at fault (body field or header name); None: the endpoint

    def __post_init__(self) -> None:
        if self.status_code not in (400, 403):
            raise ValueError(f"status_code must be 400 or 403, got {self.status_code}")
        if not self.code or not self.error_type or not self.message:
            raise ValueError("error_type, code and message must be non-empty")


@dataclass(frozen=True, slots=True)
class Classification:
    """Exactly one of ``request_class`` (the request may run) and ``error`` (it may not)."""

    request_class: RequestClass | None = None
    error: ClassificationError | None = None
    # Which input decided the class (also set on a 403, where it names what asked for it).
    source: ClassSource = "endpoint"

    def __post_init__(self) -> None:
        if (self.request_class is None) == (self.error is None):
            raise ValueError("exactly one of request_class and error must be set")

    @property
    def ok(self) -> bool:
        return self.error is None


def _invalid(param: str, message: str) -> Classification:
    return Classification(
        error=ClassificationError(
            status_code=400,
            error_type="invalid_request_error",
            code="invalid_value",
            message=message,
            param=param,
        )
    )


def _parse_header(class_header: str) -> RequestClass | None:
    value = class_header.strip().lower()
    for request_class in RequestClass:
        if value == request_class.value:
            return request_class
    return None


def classify(
    endpoint_default: RequestClass,
    service_tier: str | None,
    class_header: str | None,
    allowed_classes: frozenset[RequestClass],
) -> Classification:
    """Decide the request's class, or return a 400/403 error saying why it cannot have one.

    ``class_header`` is the raw ``X-Mixgate-Class`` value (None when the header is absent);
    ``allowed_classes`` comes from the API key. An unknown ``service_tier`` is a 400 even when
    the header overrides it: a typo must not be hidden by another input that happens to win.
    """
    request_class = endpoint_default
    source: ClassSource = "endpoint"

    if service_tier is not None:
        if service_tier not in SERVICE_TIERS:
            supported = ", ".join(repr(tier) for tier in SERVICE_TIERS)
            return _invalid(
                "service_tier",
                f"Invalid value for service_tier: {service_tier!r}. Supported values are: "
                f"{supported}.",
            )
        tier_class = SERVICE_TIERS[service_tier]
        if tier_class is not None:
            request_class, source = tier_class, "service_tier"

    if class_header is not None:
        # NOTE: an empty header value is rejected, not treated as absent: a client that sends
        # the header meant to choose, and an empty choice is a bug on its side worth surfacing.
        header_class = _parse_header(class_header)
        if header_class is None:
            return _invalid(
                CLASS_HEADER,
                f"Invalid value for {CLASS_HEADER} header: {class_header!r}. Supported values "
                "are: 'interactive', 'bulk' (case-insensitive).",
            )
        request_class, source = header_class, "header"

    if request_class not in allowed_classes:
        allowed = ", ".join(sorted(c.value for c in allowed_classes)) or "none"
        return Classification(
            error=ClassificationError(
                status_code=403,
                error_type="permission_error",
                code="class_not_allowed",
                message=(
                    f"This API key may not submit {request_class.value} requests (allowed: "
                    f"{allowed}); the class came from the {source.replace('_', ' ')}."
                ),
                param=_PARAM_BY_SOURCE[source],
            ),
            source=source,
        )
    return Classification(request_class=request_class, source=source)
