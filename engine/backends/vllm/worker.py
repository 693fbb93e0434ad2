"""`GovernedCPUWorker`: vLLM's CPU worker, each forward on as many threads as the cores it gets.

vLLM 0.32 runs the model on CPU in a worker process of its own (the MP executor: OpenMP needs
its environment set before the process starts), its threads bound to cores 0..n-1. This
subclass times each `execute_model` (process CPU and wall) and sets the next forward's thread
count with the native engine core's governor (`engine.backends.vllm.step_threads`). vLLM loads
it by name (`worker_cls`, set by `engine.backends.vllm.args.engine_kwargs` when the envelope
adapts threads on CPU). Import this only where vLLM is installed.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.worker.cpu_worker import CPUWorker

from engine.backends.vllm.step_threads import StepThreads

__all__ = ["GovernedCPUWorker"]


class GovernedCPUWorker(CPUWorker):  # type: ignore[misc]
    mixgate_threads: StepThreads | None = None

    def mixgate_thread_counts(self) -> tuple[int, int, int]:
        """(threads of the next forward, the most it gets, drops so far), for the parent's
        `collective_rpc`; (0, 0, 0) before the first forward."""
        threads = self.mixgate_threads
        if threads is None:
            return (0, 0, 0)
        return (threads.threads, threads.governor.max_threads, threads.governor.drops)

    def execute_model(self, scheduler_output: Any) -> Any:
        threads = self.mixgate_threads
        if threads is None:
            # NOTE: built at the first forward, after vLLM bound its threads (the count they
            # were bound with is the most a step gets). torch._C.set_num_threads: vLLM replaced
            # torch.set_num_threads with a warning once it had bound them; a lower count runs
            # a step on the first ones (cores 0..k-1), a higher one wakes the others again.
            threads = StepThreads(torch.get_num_threads(), torch._C.set_num_threads)
            self.mixgate_threads = threads
        threads.step_started()
        try:
            return super().execute_model(scheduler_output)
        finally:
            threads.step_ended(scheduler_output.total_num_scheduled_tokens)
