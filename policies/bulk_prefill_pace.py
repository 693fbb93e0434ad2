"""How fast a bulk backlog drains, as the engine measured it: bulk prompt tokens per step, and
the time of those steps, over the steps in which bulk had a prompt to prefill.

A backlog's drain is then `steps x step_s`, steps being what its slower side needs: its
prompts at `tokens_per_step`, or (while the jobs ahead hold every bulk slot) the outputs that
free one, a sequence a token a step. Whatever else those steps carry (the running sequences'
decodes, a chat's prefill, the steps that held bulk back for one) is in `step_s` already, so
nothing is charged twice and nothing is left out. The step-cost fit (`policies/step_cost.py`)
extrapolates to steps of another make-up, which is what it is for; for the backlog's own steps
the measurement is closer: over `bench breakdown --workload mixed` on vLLM the fit's fixed and
per-token parts moved from window to window and predicted bulk TTFT at 1.5x what it took.

A pace holds for the regime it was measured in: a backlog admitted while chats keep bulk to its
chunk drains faster if the chats stop (the cap lifts). That errs on the side of refusing.

Pure arithmetic: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.validation import require_positive_finite

__all__ = ["BulkPrefillPace"]


@dataclass(frozen=True, slots=True)
class BulkPrefillPace:
    tokens_per_step: float
    step_s: float

    def __post_init__(self) -> None:
        require_positive_finite("tokens_per_step", self.tokens_per_step)
        require_positive_finite("step_s", self.step_s)

    def drain_s(self, prompt_tokens: int, output_tokens: int, seqs_per_step: int) -> float:
        """Seconds until `prompt_tokens` are prefilled and `output_tokens` made, `seqs_per_step`
        sequences a token a step (0: no bound on the outputs known; they are left out)."""
        if min(prompt_tokens, output_tokens, seqs_per_step) < 0:
            raise ValueError("token and sequence counts must be non-negative")
        steps = prompt_tokens / self.tokens_per_step
        if seqs_per_step:
            steps = max(steps, output_tokens / seqs_per_step)
        return steps * self.step_s
