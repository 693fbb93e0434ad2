"""Classification: endpoint default < service_tier < X-Mixgate-Class, then the key's allowance."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.classify import (
    CLASS_HEADER,
    SERVICE_TIERS,
    Classification,
    ClassificationError,
    classify,
)
from policies.request_class import RequestClass

INTERACTIVE = RequestClass.INTERACTIVE
BULK = RequestClass.BULK
BOTH = frozenset({INTERACTIVE, BULK})


@pytest.mark.parametrize(
    ("endpoint", "tier", "header", "expected", "source"),
    [
        (INTERACTIVE, None, None, INTERACTIVE, "endpoint"),
        (BULK, None, None, BULK, "endpoint"),
        (INTERACTIVE, "auto", None, INTERACTIVE, "endpoint"),
        (BULK, "auto", None, BULK, "endpoint"),
        (INTERACTIVE, "default", None, INTERACTIVE, "endpoint"),
        (BULK, "default", None, BULK, "endpoint"),
        (INTERACTIVE, "flex", None, BULK, "service_tier"),
        (BULK, "priority", None, INTERACTIVE, "service_tier"),
        (INTERACTIVE, None, "bulk", BULK, "header"),
        (BULK, None, "interactive", INTERACTIVE, "header"),
        # The header is case-insensitive and its surrounding whitespace is ignored.
        (INTERACTIVE, None, "BULK", BULK, "header"),
        (BULK, None, "  Interactive ", INTERACTIVE, "header"),
        # The header beats the tier, in both directions.
        (INTERACTIVE, "flex", "interactive", INTERACTIVE, "header"),
        (INTERACTIVE, "priority", "bulk", BULK, "header"),
    ],
)
def test_precedence(
    endpoint: RequestClass,
    tier: str | None,
    header: str | None,
    expected: RequestClass,
    source: str,
) -> None:
    result = classify(endpoint, tier, header, BOTH)
    assert result.ok
    assert result.error is None
    assert result.request_class is expected
    assert result.source == source


@pytest.mark.parametrize("tier", ["turbo", "Flex", "", "scale", " flex"])
def test_unknown_service_tier_is_a_400(tier: str) -> None:
    result = classify(INTERACTIVE, tier, None, BOTH)
    assert not result.ok
    assert result.request_class is None
    assert result.error is not None
    assert result.error.status_code == 400
    assert result.error.error_type == "invalid_request_error"
    assert result.error.code == "invalid_value"
    assert result.error.param == "service_tier"
    assert repr(tier) in result.error.message
    # The message lists what would have been accepted.
    assert "'flex'" in result.error.message


def test_unknown_tier_is_reported_even_when_the_header_would_decide() -> None:
    result = classify(INTERACTIVE, "flexx", "bulk", BOTH)
    assert result.error is not None
    assert result.error.param == "service_tier"


@pytest.mark.parametrize("header", ["batch", "", "   ", "inter active", "bulk,interactive"])
def test_unknown_header_value_is_a_400(header: str) -> None:
    result = classify(BULK, None, header, BOTH)
    assert result.error is not None
    assert result.error.status_code == 400
    assert result.error.code == "invalid_value"
    assert result.error.param == CLASS_HEADER
    assert repr(header) in result.error.message


def test_key_without_bulk_gets_403_not_a_downgrade() -> None:
    result = classify(INTERACTIVE, "flex", None, frozenset({INTERACTIVE}))
    assert result.request_class is None
    assert result.error is not None
    assert result.error.status_code == 403
    assert result.error.error_type == "permission_error"
    assert result.error.code == "class_not_allowed"
    assert result.error.param == "service_tier"
    assert "bulk" in result.error.message
    assert result.source == "service_tier"


def test_403_names_the_header_when_the_header_asked() -> None:
    result = classify(BULK, None, "interactive", frozenset({BULK}))
    assert result.error is not None
    assert result.error.status_code == 403
    assert result.error.param == CLASS_HEADER
    assert result.source == "header"


def test_403_from_the_endpoint_default_has_no_param() -> None:
    # A bulk-only key calling the chat endpoint with no tier: chat is interactive by default.
    result = classify(INTERACTIVE, None, None, frozenset({BULK}))
    assert result.error is not None
    assert result.error.status_code == 403
    assert result.error.param is None
    assert "endpoint" in result.error.message


def test_key_with_no_classes_is_refused_everything() -> None:
    for endpoint in RequestClass:
        result = classify(endpoint, None, None, frozenset())
        assert result.error is not None
        assert result.error.status_code == 403
        assert "allowed: none" in result.error.message


def test_bad_input_400_comes_before_the_permission_403() -> None:
    result = classify(INTERACTIVE, "nope", None, frozenset())
    assert result.error is not None
    assert result.error.status_code == 400


def test_service_tier_table_is_the_documented_one() -> None:
    assert dict(SERVICE_TIERS) == {
        "auto": None,
        "default": None,
        "flex": BULK,
        "priority": INTERACTIVE,
    }


def test_classification_needs_exactly_one_outcome() -> None:
    error = ClassificationError(403, "permission_error", "class_not_allowed", "no", None)
    with pytest.raises(ValueError, match="exactly one"):
        Classification()
    with pytest.raises(ValueError, match="exactly one"):
        Classification(request_class=BULK, error=error)


def test_classification_error_validates_its_fields() -> None:
    with pytest.raises(ValueError, match="400 or 403"):
        ClassificationError(500, "server_error", "oops", "boom", None)
    with pytest.raises(ValueError, match="non-empty"):
        ClassificationError(400, "invalid_request_error", "", "bad", None)


tiers = st.one_of(st.none(), st.sampled_from(sorted(SERVICE_TIERS)), st.text(max_size=8))
headers = st.one_of(
    st.none(),
    st.sampled_from(["interactive", "bulk", "BULK", "Interactive"]),
    st.text(max_size=12),
)
allowed_sets = st.frozensets(st.sampled_from(list(RequestClass)))


@given(
    endpoint=st.sampled_from(list(RequestClass)),
    tier=tiers,
    header=headers,
    allowed=allowed_sets,
)
def test_an_accepted_class_is_always_allowed_and_errors_are_400_or_403(
    endpoint: RequestClass,
    tier: str | None,
    header: str | None,
    allowed: frozenset[RequestClass],
) -> None:
    result = classify(endpoint, tier, header, allowed)
    if result.request_class is not None:
        assert result.request_class in allowed
    else:
        assert result.error is not None
        assert result.error.status_code in (400, 403)


@given(
    endpoint=st.sampled_from(list(RequestClass)),
    tier=st.one_of(st.none(), st.sampled_from(sorted(SERVICE_TIERS))),
    asked=st.sampled_from(list(RequestClass)),
    allowed=allowed_sets,
)
def test_a_valid_header_is_honoured_exactly_or_refused(
    endpoint: RequestClass,
    tier: str | None,
    asked: RequestClass,
    allowed: frozenset[RequestClass],
) -> None:
    result = classify(endpoint, tier, asked.value.upper(), allowed)
    if asked in allowed:
        assert result.request_class is asked
    else:
        # Never another class in its place: a refusal.
        assert result.request_class is None
        assert result.error is not None
        assert result.error.code == "class_not_allowed"
