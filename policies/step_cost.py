"""A step's time as a fixed part plus a part per token, and the time to drain queued work by it.

Admission's rates (`EngineRates.prefill_tokens_per_s`, `decode_tokens_per_s`) charge each step's
whole time to every kind of token in it, and measure decode at whatever batch the engine ran
lately. Both make the drain of a bulk backlog look several times longer than it takes:

- a bulk step carries a prefill chunk *and* the running sequences' decodes, so its time was
  counted twice, once per kind;
- decode was measured at a few chats' batch (a step per token per chat), while the backlog
  decodes `max_active_seqs` sequences a step, each paying only its own token's share beside
  the step's fixed cost.

`bench breakdown --workload mixed` (a 400-job burst; 2-vCPU AMD EPYC) showed it: bulk's
predicted TTFT was 129 s on average against 20 s measured on the vLLM backend, 66 s against 19
s on the native engine, a prediction a job with a deadline is refused by. By this model: 20.5 s
against 19.0 s, and 20.1 s against 19.8 s.

`StepCost` is the engine's recent steps fit as `fixed_s + token_s * tokens`
(`engine/core/step_cost_fit.py`; on vLLM's CPU backend with `small`, about 10 ms + 0.06 ms per
token). Work of P prompt and D output tokens then drains in as many steps as its slower side
needs, `max(P / prefill per step, D / sequences per step)`, each paying the fixed part once,
plus every token's own part: prefill and decode overlap in the same steps. One cost for both
kinds of token, because a window of steps seldom tells them apart: fit separately over 256
steps of `mixed` on vLLM, a decode token came out at 0.001-0.6 ms, and at 2.7-3 ms in the
first second of a burst (a few steps inflated while decodes grew), where the one-cost fit kept
the projected bulk step at 17-41 ms against ~20 ms measured. A decode token costs more than a
prefill token (its logits, its attention over the whole context), so work of many more
decodes than the window ran is predicted short; admission's safety factor covers some of
that. Optimistic too where the engine runs fewer sequences or a smaller chunk than its limits
allow (a short queue), and arrivals after the prediction are ignored.

Pure arithmetic: no I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["StepCost"]


@dataclass(frozen=True, slots=True)
class StepCost:
    fixed_s: float
    token_s: float

    def __post_init__(self) -> None:
        for name in ("fixed_s", "token_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"{name} must be finite and >= 0, got {value}")
        if self.fixed_s + self.token_s <= 0.0:
            raise ValueError("a step must cost something")

    def drain_s(
        self,
        prompt_tokens: int,
        output_tokens: int,
        *,
        prefill_tokens_per_step: int,
        seqs_per_step: int,
        output_tokens_beside: int = 0,
    ) -> float:
        """Seconds to run `prompt_tokens` of prefill and `output_tokens` of decode when a step
        carries at most `prefill_tokens_per_step` of the one and `seqs_per_step` of the other.

        `output_tokens_beside`: decode tokens that run in the same steps without bounding them
        (sequences that go on after the drain ends); they fill what room the steps have left,
        `seqs_per_step` a step, and cost only their own part."""
        if prefill_tokens_per_step < 1 or seqs_per_step < 1:
            raise ValueError("prefill_tokens_per_step and seqs_per_step must be >= 1")
        if min(prompt_tokens, output_tokens, output_tokens_beside) < 0:
            raise ValueError("token counts must be non-negative")
        steps = max(prompt_tokens / prefill_tokens_per_step, output_tokens / seqs_per_step)
        beside = min(output_tokens_beside, steps * seqs_per_step - output_tokens)
        return steps * self.fixed_s + (prompt_tokens + output_tokens + beside) * self.token_s
