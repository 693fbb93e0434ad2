"""How long vLLM's engine-core process busy-waits for its worker's answer: briefly, then it sleeps.

On CPU vLLM always runs the model in a worker process of its own (its CPU platform forces the
multiproc executor), and the engine-core process reads each step's result from a shared-memory
ring (`vllm.distributed.device_communicators.shm_broadcast`). Its reader waits in a loop of
`sched_yield()` for `SpinCondition.busy_loop_s` (hard-coded to 1 s in vLLM 0.32) after its last
read before it parks on a zmq notification. Under load a step's result comes every few tens of
milliseconds, so the window never lapses and the engine core spins through every step the worker
computes: `py-spy` of the engine core under `bench breakdown --workload mixed --engine vllm`
(`small`, 2-vCPU AMD EPYC) put 87% of its samples in that wait, the process on a core the whole
time. On two vCPUs that is the core the worker's second OpenMP thread, the gateway and Redis
need; every op barrier of the step then waits for whichever thread the spinner displaced.

The writer notifies the zmq socket after every write (vLLM's own idle path), so a reader that
parks loses only the wake-up (tens of microseconds against steps of milliseconds). This bounds
the window to READER_SPIN_S in the process that calls `bound_reader_spin` (the engine core:
`ClassAwareScheduler` calls it when vLLM builds it there). Upstream knows the problem
(vllm-project/vllm#19036 for idle servers; #52814 and #51950 propose making the window a setting
for loaded ones, neither in 0.32). The plain vLLM servers `bench compare` runs as baselines keep
vLLM's behaviour.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["READER_SPIN_S", "bound_reader_spin"]

# Long enough to catch an answer that is already on its way (a step of a few decodes on a fast
# device), far shorter than a step here: after a read the engine core spends longer than this
# on its own work (outputs, the next schedule) before it waits again, so it parks at once.
READER_SPIN_S: Final = 0.002

_BOUND_MARK: Final = "_mixgate_reader_spin_s"


def bound_reader_spin(spin_s: float = READER_SPIN_S) -> bool:
    """Make every shared-memory reader in this process busy-wait at most `spin_s` after its last
    read (idempotent). False, and nothing changed, where vLLM's reader has no such window (a
    version whose `SpinCondition` differs)."""
    if not spin_s >= 0:
        raise ValueError(f"spin_s must be >= 0, got {spin_s!r}")
    from vllm.distributed.device_communicators import shm_broadcast

    condition = getattr(shm_broadcast, "SpinCondition", None)
    original = getattr(condition, "wait", None)
    if condition is None or original is None:
        return False
    if hasattr(original, _BOUND_MARK):
        original = original.__wrapped__

    def wait(self: Any, timeout_ms: int | None = None) -> None:
        # Readers made before the bound (the executor's, built before the scheduler) get it on
        # their next wait; writers have no window.
        if self.is_reader and self.busy_loop_s > spin_s:
            self.busy_loop_s = spin_s
        original(self, timeout_ms)

    wait.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(wait, _BOUND_MARK, spin_s)
    condition.wait = wait
    return True
