"""vLLM's shared-memory reader parks on its notification once the bound is set
(engine/backends/vllm/reader_spin.py): a real writer/reader `SpinCondition` pair over zmq.

Which way a `wait()` went is read off the notification socket, not a clock: the spinning branch
returns with the writer's notification still pending, the parking branch consumes it.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator

import pytest
import zmq

from tests.dependencies import require_module

require_module("vllm", "run with the vLLM environment's python (.venv-vllm)")

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    warnings.simplefilter("ignore", FutureWarning)
    from vllm.distributed.device_communicators import shm_broadcast  # noqa: E402
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition  # noqa: E402

from engine.backends.vllm.reader_spin import READER_SPIN_S, bound_reader_spin  # noqa: E402

# The reader's last read this long ago: inside vLLM's own window (1 s), past the bound.
LAST_READ_AGO_S = 0.5


@pytest.fixture
def vllm_wait() -> Iterator[None]:
    """vLLM's own `SpinCondition.wait` for the test, and whatever was there after it: the bound
    is process-wide, and a scheduler built in this process (the async scheduler's tests) sets
    it."""
    before = SpinCondition.wait
    SpinCondition.wait = getattr(before, "__wrapped__", before)
    yield
    SpinCondition.wait = before


@pytest.fixture
def pair(vllm_wait: None) -> Iterator[tuple[SpinCondition, SpinCondition]]:
    context = zmq.Context()
    address = shm_broadcast.get_open_zmq_ipc_path()
    writer = SpinCondition(is_reader=False, context=context, notify_address=address)
    reader = SpinCondition(is_reader=True, context=context, notify_address=address)
    _notify_until_pending(writer, reader)
    reader.local_notify_socket.recv()
    try:
        yield writer, reader
    finally:
        context.destroy(linger=0)


def _notify_until_pending(writer: SpinCondition, reader: SpinCondition) -> None:
    """vLLM's writer may drop a notification (its socket holds one at most, and a subscription
    or a freed slot reaches it a moment late; its readers recheck the ring on a timer for
    that): notify until one is pending at the reader."""
    while not reader.local_notify_socket.poll(10):
        writer.notify()


def _pending_after_wait(writer: SpinCondition, reader: SpinCondition) -> bool:
    """Notify, wait once as a reader whose last read was LAST_READ_AGO_S ago, and say whether
    the notification is still pending (the wait spun) or was taken (the wait parked)."""
    _notify_until_pending(writer, reader)
    reader.last_read = time.monotonic() - LAST_READ_AGO_S
    reader.wait(timeout_ms=5000)
    return bool(reader.local_notify_socket.poll(0))


def test_vllms_reader_spins_for_a_second_after_its_last_read(
    pair: tuple[SpinCondition, SpinCondition],
) -> None:
    # The contrast that shows the next test measures something.
    assert _pending_after_wait(*pair)


def test_a_bounded_reader_parks_on_its_notification(
    pair: tuple[SpinCondition, SpinCondition],
) -> None:
    writer, reader = pair
    assert bound_reader_spin()
    assert not _pending_after_wait(writer, reader)
    assert reader.busy_loop_s == READER_SPIN_S
    assert writer.busy_loop_s == 0  # a writer has no window to bound


def test_bounding_twice_keeps_one_bound(pair: tuple[SpinCondition, SpinCondition]) -> None:
    assert bound_reader_spin(0.2) and bound_reader_spin(0.001)
    assert SpinCondition.wait.__wrapped__.__qualname__ == "SpinCondition.wait"
    assert not _pending_after_wait(*pair)
    assert pair[1].busy_loop_s == 0.001


def test_a_negative_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="spin_s"):
        bound_reader_spin(-1.0)
