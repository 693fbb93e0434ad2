"""policies/interactive_presence.py: the bulk cap's linger after the last interactive request."""

from __future__ import annotations

import pytest

from policies.interactive_presence import InteractivePresence


def _bulk_steps(
    presence: InteractivePresence, start_s: float, end_s: float, step_s: float
) -> dict[float, bool]:
    """Bulk-only steps back to back from start_s; what each was told, by its start."""
    told: dict[float, bool] = {}
    now_s = start_s
    while now_s < end_s:
        told[now_s] = presence.observe(False, now_s)
        now_s += step_s
        presence.step_ended(now_s)
    return told


def test_a_busy_stretch_starts_capped_until_bulk_has_had_the_engine_for_linger_s() -> None:
    presence = InteractivePresence(linger_s=2.0)
    told = _bulk_steps(presence, 100.0, 103.0, 0.25)
    assert all(present for start_s, present in told.items() if start_s < 102.0)
    assert not any(present for start_s, present in told.items() if start_s >= 102.0)


def test_an_idle_spell_of_linger_s_starts_a_new_capped_stretch() -> None:
    presence = InteractivePresence(linger_s=2.0)
    _bulk_steps(presence, 0.0, 3.0, 0.5)
    assert not presence.observe(False, 3.0)
    presence.step_ended(3.5)
    # Idle from 3.5 s: a step planned 1.9 s later continues the stretch, lifted.
    assert not presence.observe(False, 5.4)
    presence.step_ended(5.5)
    # Idle for 2 s: the next step starts a new stretch, capped for linger_s.
    assert presence.observe(False, 7.5)
    presence.step_ended(7.6)
    assert presence.observe(False, 9.4)
    assert not presence.observe(False, 9.5)


def test_lingers_for_linger_s_after_the_last_sighting_then_lifts() -> None:
    presence = InteractivePresence(linger_s=2.0)
    presence.observe(True, 10.0)
    presence.step_ended(10.1)
    assert presence.observe(False, 11.999)
    presence.step_ended(12.0)
    assert not presence.observe(False, 12.0)
    # Seen again: the linger counts from the new sighting.
    presence.observe(True, 20.0)
    presence.step_ended(20.1)
    assert presence.observe(False, 21.5)


def test_no_linger_means_the_cap_never_lifts() -> None:
    presence = InteractivePresence(linger_s=None)
    assert presence.observe(False, 0.0)
    presence.observe(True, 1.0)
    assert presence.observe(False, 1e9)


def test_zero_linger_is_presence_only() -> None:
    presence = InteractivePresence(linger_s=0.0)
    assert not presence.observe(False, 1.0)
    assert presence.observe(True, 5.0)
    assert not presence.observe(False, 5.0)


def test_negative_linger_is_refused() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        InteractivePresence(linger_s=-1.0)
