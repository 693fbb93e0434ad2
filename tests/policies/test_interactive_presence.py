"""policies/interactive_presence.py: the bulk cap's linger after the last interactive request."""

from __future__ import annotations

import pytest

from policies.interactive_presence import InteractivePresence


def test_absent_until_interactive_work_is_first_seen() -> None:
    presence = InteractivePresence(linger_s=2.0)
    assert not presence.observe(False, 0.0)
    assert presence.observe(True, 1.0)


def test_lingers_for_linger_s_after_the_last_sighting_then_lifts() -> None:
    presence = InteractivePresence(linger_s=2.0)
    presence.observe(True, 10.0)
    assert presence.observe(False, 11.999)
    assert not presence.observe(False, 12.0)
    # Seen again: the linger counts from the new sighting.
    presence.observe(True, 20.0)
    assert presence.observe(False, 21.5)


def test_no_linger_means_the_cap_never_lifts() -> None:
    presence = InteractivePresence(linger_s=None)
    assert presence.observe(False, 0.0)
    presence.observe(True, 1.0)
    assert presence.observe(False, 1e9)


def test_zero_linger_is_presence_only() -> None:
    presence = InteractivePresence(linger_s=0.0)
    assert presence.observe(True, 5.0)
    assert not presence.observe(False, 5.0)


def test_negative_linger_is_refused() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        InteractivePresence(linger_s=-1.0)
