"""WorkInFlight's running sums: what a replica's held jobs have still to run, per class."""

from __future__ import annotations

import pytest

from gateway.dispatch.work_in_flight import WorkInFlight
from policies.in_flight_work import InFlightWork
from policies.request_class import RequestClass

BULK = RequestClass.BULK
INTERACTIVE = RequestClass.INTERACTIVE


def test_a_job_counts_its_cost_as_prompt_until_split_then_what_it_has_left() -> None:
    work = WorkInFlight()
    work.start(1, BULK, 1_100, 0)  # claimed: only prompt + max_tokens known
    assert work.of(BULK) == InFlightWork(jobs=1, prompt_tokens=1_100, output_tokens=0)
    work.update(1, 1_000, 100)  # its request parsed
    work.start(2, BULK, 500, 50)
    work.start(3, INTERACTIVE, 200, 32)
    assert work.of(BULK) == InFlightWork(jobs=2, prompt_tokens=1_500, output_tokens=150)
    work.made_tokens(1, 1)  # its first token: the prompt is done
    work.made_tokens(1, 3)
    assert work.of(BULK) == InFlightWork(jobs=2, prompt_tokens=500, output_tokens=146)
    work.made_tokens(2, 80)  # more than max_tokens (a stop string's tail): never below 0
    assert work.of(BULK) == InFlightWork(jobs=2, prompt_tokens=0, output_tokens=96)
    assert work.of(INTERACTIVE) == InFlightWork(jobs=1, prompt_tokens=200, output_tokens=32)


def test_an_ended_job_leaves_nothing_and_late_news_of_it_is_ignored() -> None:
    work = WorkInFlight()
    work.start("a", BULK, 700, 64)
    work.start("b", BULK, 300, 16)
    work.end("a")
    work.end("a")
    work.made_tokens("a", 5)
    work.update("a", 10, 10)
    assert work.of(BULK) == InFlightWork(jobs=1, prompt_tokens=300, output_tokens=16)
    work.end("b")
    assert work.of(BULK) == InFlightWork()


def test_nonsense_raises() -> None:
    work = WorkInFlight()
    work.start(1, BULK, 10, 10)
    with pytest.raises(ValueError):
        work.start(1, BULK, 10, 10)
    with pytest.raises(ValueError):
        work.update(1, -1, 0)
    with pytest.raises(ValueError):
        InFlightWork(jobs=0, prompt_tokens=5)
