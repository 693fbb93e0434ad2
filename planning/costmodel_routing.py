"""How many of an MoE layer's experts a step reads: the union of the experts its tokens pick.

A dense layer's weights are read once per step however many tokens the step carries. An MoE
layer with ``E`` experts routes each token to ``k`` of them, and a step must read every expert
that at least one of its ``T`` tokens picked. One token reads ``k`` experts; a step of many
tokens reads nearly all ``E``. So the weight bytes of a step grow with the batch, and the
active-parameter count (``k / E`` of the experts) says how much arithmetic a token costs, not
how many bytes a batch reads.

Uniform routing (every expert equally likely, tokens independent)::

    touched(T) = E · (1 − (1 − k/E)^T)

Skewed routing, ``routing_skew = s > 0``: expert ``e`` (0-based) has popularity
``w_e = (e + 1)^(−s)`` (Zipf-like; ``s = 0`` is uniform). A token picks ``k`` distinct experts,
so the chance ``q_e`` that it picks expert ``e`` is ``min(1, λ · w_e)`` with ``λ`` set so that
``Σ q_e = k`` (water-filling: a very popular expert is picked by every token, never "more than
once"). Tokens route independently, so::

    touched(T) = Σ_e 1 − (1 − q_e)^T

which reduces to the uniform formula at ``s = 0``. Skew lowers the union: popular experts are
shared, rare ones are seldom read. Real routers are neither uniform nor independent across the
tokens of one sequence; measure the chosen model, and treat this as the shape of the curve.
"""

from __future__ import annotations

import functools
import math

__all__ = ["expected_experts_touched", "expert_pick_probabilities"]

# Bisection steps for λ: each halves the bracket, so 200 is far past float precision.
_BISECTION_STEPS = 200


def _check_experts(num_experts: int, experts_per_token: int) -> None:
    if num_experts < 1:
        raise ValueError("num_experts must be at least 1")
    if not 1 <= experts_per_token <= num_experts:
        raise ValueError("experts_per_token must be in [1, num_experts]")


def expert_pick_probabilities(
    num_experts: int, experts_per_token: int, routing_skew: float = 0.0
) -> list[float]:
    """``q_e``: the chance that one token picks expert ``e``; they sum to ``experts_per_token``."""
    return list(_pick_probabilities(num_experts, experts_per_token, routing_skew))


# NOTE: cached because the simulated executor costs every virtual step, and the skewed case
# bisects over all experts; a model has one (E, k, skew), so the cache stays tiny.
@functools.lru_cache(maxsize=64)
def _pick_probabilities(
    num_experts: int, experts_per_token: int, routing_skew: float
) -> tuple[float, ...]:
    _check_experts(num_experts, experts_per_token)
    if not (math.isfinite(routing_skew) and routing_skew >= 0):
        raise ValueError("routing_skew must be finite and non-negative")
    k = experts_per_token
    if routing_skew == 0 or k == num_experts:
        return (k / num_experts,) * num_experts
    weights = [float(e + 1) ** -routing_skew for e in range(num_experts)]

    def picked(scale: float) -> float:
        return math.fsum(min(1.0, scale * w) for w in weights)

    # picked() grows with the scale from 0 to num_experts (>= k): bisect for picked == k.
    low, high = 0.0, 1.0 / weights[-1]  # at `high` every q_e is 1
    for _ in range(_BISECTION_STEPS):
        mid = (low + high) / 2
        if picked(mid) < k:
            low = mid
        else:
            high = mid
    return tuple(min(1.0, high * w) for w in weights)


def expected_experts_touched(
    num_experts: int, experts_per_token: int, tokens: int, routing_skew: float = 0.0
) -> float:
    """Expected number of distinct experts per MoE layer that ``tokens`` tokens pick.

    Uniform (``routing_skew = 0``): ``E · (1 − (1 − k/E)^T)``. Skewed: see the module text.
    ``k = E`` reads every expert at any ``T >= 1``; ``T = 1`` reads exactly ``k``.
    """
    if tokens < 0:
        raise ValueError("tokens must be non-negative")
    probabilities = _pick_probabilities(num_experts, experts_per_token, routing_skew)
    if tokens == 0:
        return 0.0
    if len(set(probabilities)) == 1:  # uniform: the closed form, exact for hand-worked cases
        return num_experts * (1.0 - (1.0 - probabilities[0]) ** tokens)
    return sum(1.0 - (1.0 - q) ** tokens for q in probabilities)
