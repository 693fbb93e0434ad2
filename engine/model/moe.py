"""Mixtral's sparse mixture-of-experts block, batched by expert.

Each token's router picks `num_experts_per_tok` of `num_local_experts` SwiGLU experts. The
step's tokens are grouped by the expert they picked and each touched expert runs once over its
tokens, so a step reads the weights of the union of experts its tokens chose and no others:
that union (not the active-parameter count) is what a batch of decodes pays in memory traffic.

The routing math is transformers' `MixtralTopKRouter`: router logits in the model dtype,
softmax over all experts in fp32, top-k, the k weights renormalised to sum to one. Experts are
applied in ascending id order with `index_add_`, as transformers does, so fp32 results match
it up to the matmuls' own rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.config import ModelConfig
from engine.model.prepacked_linear import prepacked_matmul

__all__ = ["ExpertGroups", "SparseMoeBlock", "group_by_expert", "route", "touched_experts"]


def route(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, E] router logits -> (fp32 weights [T, k] summing to 1 per token, expert ids [T, k])."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    weights /= weights.sum(dim=-1, keepdim=True)
    return weights, experts


def touched_experts(router_logits: torch.Tensor, top_k: int) -> list[int]:
    """The experts a step computes for these router logits: the union of every token's top-k."""
    _, experts = route(router_logits, top_k)
    return sorted(set(experts.flatten().tolist()))


class ExpertGroups:
    """The (token, top-k slot) pairs of one step, sorted by expert: a contiguous run per expert.

    `tokens[start:end]` are the rows that expert `expert_ids[i]` computes (with their routing
    weights `weights[start:end]`), for the i-th `(start, end)` of `bounds`.
    """

    __slots__ = ("bounds", "expert_ids", "tokens", "weights")

    def __init__(self, weights: torch.Tensor, experts: torch.Tensor, num_experts: int):
        flat_experts = experts.flatten()
        # Stable, so within one expert the tokens keep their order (as transformers' loop).
        order = torch.sort(flat_experts, stable=True).indices
        top_k = experts.shape[-1]
        self.tokens = order // top_k
        self.weights = weights.flatten()[order]
        counts = torch.bincount(flat_experts, minlength=num_experts).tolist()
        self.expert_ids: list[int] = []
        self.bounds: list[tuple[int, int]] = []
        start = 0
        for expert, count in enumerate(counts):
            if count:
                self.expert_ids.append(expert)
                self.bounds.append((start, start + count))
                start += count


def group_by_expert(router_logits: torch.Tensor, top_k: int) -> ExpertGroups:
    weights, experts = route(router_logits, top_k)
    return ExpertGroups(weights, experts, router_logits.shape[-1])


class SparseMoeBlock(nn.Module):
    """Router + experts. Expert weights are stacked at load time: gate_up_proj [E, 2I, H] (each
    expert's w1 then w3, as transformers 5 fuses them), down_proj [E, H, I] (w2)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        hidden, size = config.hidden_size, config.intermediate_size
        self.num_experts = config.num_local_experts
        self.top_k = config.num_experts_per_tok
        self.gate = nn.Linear(hidden, self.num_experts, bias=False)
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, 2 * size, hidden))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, hidden, size))
        # When a list, each forward appends how many experts it computed (the bench reads it).
        # NOTE: router_jitter_noise is a training-time perturbation: inference ignores it.
        self.touched_log: list[int] | None = None
        # Per expert (gate_up, down) weights prepacked by oneDNN (`prepack_experts`), or None.
        self._packed: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def prepack_experts(self) -> None:
        """Run each expert's two matmuls through oneDNN over prepacked weights (as
        engine.model.prepacked_linear does for nn.Linear): an expert sees few rows per step."""
        reorder = torch.ops.mkldnn._reorder_linear_weight
        self._packed = [
            (reorder(self.gate_up_proj[e].detach(), None), reorder(self.down_proj[e].detach()))
            for e in range(self.num_experts)
        ]

    def _expert_linear(self, x: torch.Tensor, expert: int, which: int) -> torch.Tensor:
        if self._packed is not None:
            return prepacked_matmul(x, self._packed[expert][which])
        weight = self.gate_up_proj[expert] if which == 0 else self.down_proj[expert]
        return F.linear(x, weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., H]; every leading position is one token."""
        tokens = x.reshape(-1, x.shape[-1])
        groups = group_by_expert(self.gate(tokens), self.top_k)
        if self.touched_log is not None:
            self.touched_log.append(len(groups.expert_ids))
        out = torch.zeros_like(tokens)
        for expert, (start, end) in zip(groups.expert_ids, groups.bounds, strict=True):
            rows = groups.tokens[start:end]
            gate, up = self._expert_linear(tokens[rows], expert, 0).chunk(2, dim=-1)
            expert_out = self._expert_linear(F.silu(gate) * up, expert, 1)
            # The weights are fp32: the product is too, and is cast back as transformers does.
            weighted = expert_out * groups.weights[start:end, None]
            out.index_add_(0, rows, weighted.to(out.dtype))
        return out.view_as(x)
