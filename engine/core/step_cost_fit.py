"""The engine's recent steps fit as time = fixed + per token (`policies/step_cost.py` says why
one cost for both kinds of token).

Least squares over a window of steps (`StepHistory` adds each step and takes off the one that
leaves the window), kept as running sums so that the fit after every step is a few
arithmetic operations, not a pass over the window: the load snapshot that carries it is made
after every step. Token sums are Python ints (exact); only the time sums are floats.

The per-token cost is fit only where the window can tell it from the fixed part: enough steps,
a spread in their token counts, and neither part below zero (a negative one means the window's
steps do not follow the linear shape, e.g. a few steps inflated by a busy machine). Where it
cannot, the last per-token cost fit is kept and the fixed part re-anchored on this window's
mean step: a steady backlog runs steps of one size (a bulk chunk and a full batch of decodes),
which is exactly when admission predicts its drain, and its mean step is what the prediction
needs. Dropping to admission's per-kind rates there instead made a simulated GPU backlog's
predicted bulk TTFT jump from ~1x to 4x the measured one whenever the steps evened out. With no
per-token cost fit yet, `fit()` is None and admission keeps its per-kind rates.
"""

from __future__ import annotations

from policies.step_cost import StepCost

__all__ = ["StepCostFit"]

# Fewer steps than this give no fit: one inflated step would move it too far.
MIN_STEPS = 32
# Variance of the tokens per step that tells the per-token cost from the fixed part: counts
# that vary by ~8 tokens or more.
MIN_TOKEN_VARIANCE = 64.0


class StepCostFit:
    def __init__(self) -> None:
        self.steps = 0
        self._tokens = self._tokens_sq = 0
        self._time_s = self._time_tokens = 0.0
        # The per-token cost of the last window that could tell it apart.
        self._last_token_s: float | None = None

    def add(self, tokens: int, duration_s: float, sign: int = 1) -> None:
        """Count a step in (`sign` +1) or take it off (-1) the window."""
        self.steps += sign
        self._tokens += sign * tokens
        self._tokens_sq += sign * tokens * tokens
        self._time_s += sign * duration_s
        self._time_tokens += sign * duration_s * tokens

    def fit(self) -> StepCost | None:
        n = self.steps
        if n < MIN_STEPS:
            return None
        mean_tokens, mean_s = self._tokens / n, self._time_s / n
        variance = self._tokens_sq / n - mean_tokens * mean_tokens
        if variance >= MIN_TOKEN_VARIANCE:
            token_s = (self._time_tokens / n - mean_tokens * mean_s) / variance
            fixed_s = mean_s - token_s * mean_tokens
            if fixed_s >= 0.0 and token_s >= 0.0 and fixed_s + token_s > 0.0:
                self._last_token_s = token_s
                return StepCost(fixed_s, token_s)
        if self._last_token_s is None:
            return None
        # Re-anchored: the last per-token cost through this window's mean step.
        fixed_s = mean_s - self._last_token_s * mean_tokens
        if fixed_s < 0.0 or fixed_s + self._last_token_s <= 0.0:
            return None
        return StepCost(fixed_s, self._last_token_s)
