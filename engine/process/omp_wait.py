"""How long the engine child's OpenMP threads spin before they sleep: its environment.

torch's CPU wheels run every parallel op on libgomp's thread team. Between two ops a waiting
thread spins for GOMP_SPINCOUNT iterations (300,000 when unset: ~milliseconds) before it sleeps
on a futex. On a machine whose cores the engine shares with the gateway (HTTP, tokenizing,
Redis) that spinning is what breaks the engine's steps under a burst: the spinners keep both
cores busy, the gateway's threads preempt one of the engine's threads in the middle of a step,
and every later op's barrier waits for it. Measured on the 2-vCPU Xeon (`small`, 2 threads, a
fresh server taking a burst of 400 job submissions with chats arriving during it): steps of
128 bulk tokens + 2 decodes took 0.32 s instead of ~12 ms, 512-token prefills 0.24 s instead
of ~40 ms, and chats' TTFT was 0.38-0.68 s (worst of 5, three runs).

A short spin keeps the back-to-back ops of a quiet step as fast as before (decode steps
B=1/8/32 on `small`: 1.08/1.99/7.70 ms at 300,000, 1.19/2.05/7.51 ms at 10,000; 3,000 cost
0.4-1 ms a step; OMP_WAIT_POLICY=PASSIVE, no spin at all, cost 1.8 ms a step) and gives the
cores back within microseconds when a thread must wait: the same burst's worst chat TTFT was
0.26-0.33 s. The variable is read when libgomp loads, so it is set for the child before it
starts; an operator's own GOMP_SPINCOUNT or OMP_WAIT_POLICY is left as it is. The vLLM
backend gives its engine-core process the same setting (`engine.backends.vllm.backend`); the
plain vLLM servers `bench compare` runs as baselines keep vLLM's own defaults.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["ENGINE_GOMP_SPINCOUNT", "engine_child_environment", "omp_wait_settings"]

ENGINE_GOMP_SPINCOUNT = 10_000


def omp_wait_settings(parent: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to `parent` for an engine process: none when it chose its own."""
    if "GOMP_SPINCOUNT" in parent or "OMP_WAIT_POLICY" in parent:
        return {}
    return {"GOMP_SPINCOUNT": str(ENGINE_GOMP_SPINCOUNT)}


def engine_child_environment(parent: Mapping[str, str]) -> dict[str, str]:
    """The parent's environment with the engine's OpenMP spin count, unless already chosen."""
    return {**parent, **omp_wait_settings(parent)}
