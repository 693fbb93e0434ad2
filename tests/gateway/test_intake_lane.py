"""Bulk intake's slots: `limit` at once, fewer while a chat waits, handed over in arrival order;
and through a real `mixgate serve`, a chat that holds them low until its first text."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from gateway.admission.intake_lane import IntakeLane
from tests.gateway.test_gateway_e2e import chat_body, kv_state, metric_value, model_name, new_server


class _Holder:
    """A submission that holds its slot until released, noting when it got in."""

    def __init__(self, lane: IntakeLane, name: str, entered: list[str]) -> None:
        self.release = asyncio.Event()
        self.inside = asyncio.Event()
        self._lane, self._name, self._entered = lane, name, entered
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async with self._lane.bulk():
            self._entered.append(self._name)
            self.inside.set()
            await self.release.wait()


# A trickle that never comes within a test: only what the test releases starts a submission.
NO_TRICKLE_S = 3600.0


async def _one_in(
    limit: int,
    limit_while_chats_wait: int,
    max_chat_wait_s: float = 1.0,
    trickle_interval_s: float = NO_TRICKLE_S,
) -> tuple[IntakeLane, list[str], _Holder]:
    """A lane with submission s0 holding a slot."""
    lane = IntakeLane(limit, limit_while_chats_wait, max_chat_wait_s, trickle_interval_s)
    entered: list[str] = []
    first = _Holder(lane, "s0", entered)
    await first.inside.wait()
    return lane, entered, first


async def _settle() -> None:
    # Let every ready task run to its next await (each hop is one loop turn).
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.anyio
async def test_slots_up_to_the_limit_then_arrival_order() -> None:
    lane = IntakeLane(limit=2, limit_while_chats_wait=1)
    entered: list[str] = []
    holders = [_Holder(lane, f"s{i}", entered) for i in range(4)]
    await _settle()
    assert entered == ["s0", "s1"]
    assert (lane.in_flight, lane.parked) == (2, 2)
    holders[1].release.set()
    await holders[2].inside.wait()
    assert entered == ["s0", "s1", "s2"]
    for holder in holders:
        holder.release.set()
    await asyncio.gather(*(h.task for h in holders))
    assert entered == ["s0", "s1", "s2", "s3"]
    assert (lane.in_flight, lane.parked) == (0, 0)


@pytest.mark.anyio
@pytest.mark.parametrize("lower", [1, 0])
async def test_a_waiting_chat_lowers_the_limit_until_its_ticket_is_released(lower: int) -> None:
    lane, entered, first = await _one_in(limit=3, limit_while_chats_wait=lower)
    ticket = lane.chat_arrived()
    assert lane.current_limit() == lower
    later = [_Holder(lane, f"s{i}", entered) for i in (1, 2)]
    await _settle()
    # s0 goes on (what is in flight finishes); nothing new starts past the lower limit (at 0,
    # though slots are free).
    assert entered == ["s0"] and (lane.in_flight, lane.parked) == (1, 2)
    ticket.release()
    ticket.release()  # idempotent: the count does not go below zero
    assert lane.chats_waiting == 0
    await asyncio.gather(*(h.inside.wait() for h in later))
    assert entered == ["s0", "s1", "s2"]
    for holder in (first, *later):
        holder.release.set()
    await asyncio.gather(first.task, *(h.task for h in later))


@pytest.mark.anyio
async def test_a_ticket_never_released_expires_after_max_chat_wait() -> None:
    lane, entered, first = await _one_in(limit=2, limit_while_chats_wait=1, max_chat_wait_s=0.01)
    ticket = lane.chat_arrived()
    second = _Holder(lane, "s1", entered)
    await _settle()
    assert entered == ["s0"]
    # The ticket's own timer hands the slot over; nothing else releases it.
    await asyncio.wait_for(second.inside.wait(), timeout=10)
    assert ticket.released and lane.chats_waiting == 0
    first.release.set()
    second.release.set()
    await asyncio.gather(first.task, second.task)


@pytest.mark.anyio
async def test_a_parked_submission_that_is_cancelled_leaves_no_slot_taken() -> None:
    lane, entered, first = await _one_in(limit=1, limit_while_chats_wait=1)
    gone = _Holder(lane, "gone", entered)
    third = _Holder(lane, "s2", entered)
    await _settle()
    gone.task.cancel()
    first.release.set()
    await third.inside.wait()
    assert entered == ["s0", "s2"]
    assert lane.in_flight == 1
    third.release.set()
    await third.task
    assert (lane.in_flight, lane.parked) == (0, 0)
    with pytest.raises(asyncio.CancelledError):
        await gone.task


@pytest.mark.anyio
async def test_a_flood_of_chats_slows_intake_to_the_trickle_and_never_stops_it() -> None:
    # The chat's ticket outlives the test: only the trickle can start anything.
    lane, entered, first = await _one_in(
        limit=3, limit_while_chats_wait=0, max_chat_wait_s=3600, trickle_interval_s=0.001
    )
    ticket = lane.chat_arrived()
    gone = _Holder(lane, "gone", entered)
    later = [_Holder(lane, f"s{i}", entered) for i in (1, 2, 3)]
    await _settle()
    gone.task.cancel()  # a parked submission whose client left: the trickle skips it
    await asyncio.gather(*(h.inside.wait() for h in later[:2]))
    assert entered == ["s0", "s1", "s2"]
    # The full limit still holds: s3 starts only once a slot frees, and then by the trickle.
    assert lane.in_flight == 3 and lane.parked == 1
    first.release.set()
    await later[2].inside.wait()
    assert entered == ["s0", "s1", "s2", "s3"]
    assert not ticket.released and lane.chats_waiting == 1
    for holder in later:
        holder.release.set()
    await asyncio.gather(first.task, *(h.task for h in later))
    assert (lane.in_flight, lane.parked) == (0, 0)
    ticket.release()


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError):
        IntakeLane(limit=0, limit_while_chats_wait=1)
    with pytest.raises(ValueError):
        IntakeLane(limit=2, limit_while_chats_wait=-1)
    with pytest.raises(ValueError):
        IntakeLane(limit=2, limit_while_chats_wait=0, trickle_interval_s=0)
    # A lower limit above the full one is clamped to it rather than refused.
    lane = IntakeLane(limit=1, limit_while_chats_wait=4)
    assert (lane.limit, lane.limit_while_chats_wait) == (1, 1)


@pytest.mark.redis
@pytest.mark.slow
def test_a_chat_holds_bulk_intake_low_only_until_its_first_text(
    tiny_model_dir: Path, redis_server: str, tmp_path: Path
) -> None:
    # gateway/admission/intake_lane.py: from its handler's start to its first text a chat
    # lowers bulk intake's limit; once that text is written it must not, while it streams on.
    # The hold's own expiry is set far out, so only the first text can have released it.
    proc = new_server(
        tiny_model_dir, redis_server, tmp_path, extra_env={"MIXGATE_CHAT_INTAKE_HOLD_MAX_S": "600"}
    ).start()
    try:
        body = chat_body(
            model_name(proc), max_tokens=980, temperature=0, stream=True, ignore_eos=True
        )
        full_limit = metric_value(proc, "mixgate_job_intake_limit")
        with httpx.stream("POST", proc.url + "/v1/chat/completions", json=body) as response:
            lines = response.iter_lines()
            while '"content":' not in (line := next(lines)) or '"content":""' in line:
                pass
            assert metric_value(proc, "mixgate_chats_awaiting_first_token") == 0
            assert metric_value(proc, "mixgate_job_intake_limit") == full_limit == 16
            # Read after the gauges: the stream had not ended (its end releases the hold too).
            assert kv_state(proc)[1] >= 1
            response.close()
        assert metric_value(proc, "mixgate_job_intake_in_flight") == 0
    finally:
        assert proc.stop() == 0, proc.logs()
