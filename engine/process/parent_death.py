"""A child process that dies with its parent (Linux PR_SET_PDEATHSIG), so that a SIGKILLed
`mixgate serve` leaves no engine process or redis-server behind."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    return prctl


def die_with_parent_preexec(parent_pid: int) -> Callable[[], None] | None:
    """A Popen `preexec_fn` that asks Linux to SIGKILL the child when its parent dies.

    NOTE: the signal fires when the *thread* that forked exits, not the process: call Popen
    from a thread that lives as long as the process (the main / event-loop thread). The libc
    function is looked up here, before the fork, so the child only makes one plain call.
    """
    prctl = _prctl()
    if prctl is None:
        return None

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        # The parent may have died between fork and prctl: then nobody would ever signal us.
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


def die_with_parent(parent_pid: int) -> None:
    """The same, called by a Python child itself at start (belt and braces over preexec)."""
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)


def parent_alive(parent_pid: int) -> bool:
    """False once the child was re-parented (its parent died): where pdeathsig is missing."""
    return os.getppid() == parent_pid
