"""The naive way to serve a batch, as `transformers.generate` does: static padded batches.

Requests are cut into batches of B in arrival order. Each batch is left-padded to its longest
prompt, prefilled in one forward, then decoded one token per row per step until its longest
request is done; rows that finished early keep computing. The KV cache is one contiguous
tensor per batch, [B, max_len, kv_heads, head_dim] per layer for K and for V, with a mask that
hides the padding: no paging, no continuous batching.

It runs as an attention backend over the engine's own `LlamaModel`, so weights and every
matmul are the engine's: a speed difference is the batching strategy, nothing else.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.model.transformer import LlamaModel

__all__ = ["BenchRequest", "NaiveResult", "StaticBatchAttention", "run_naive", "run_static_batch"]

# Token id in the padded columns; masked everywhere, so its value never reaches real tokens.
_PAD_TOKEN_ID = 0


@dataclass(frozen=True, slots=True)
class BenchRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int  # generated exactly (greedy, EOS ignored)


@dataclass(frozen=True, slots=True)
class NaiveResult:
    tokens: dict[str, list[int]]  # request id -> its max_tokens greedy tokens
    elapsed_s: float
    padded_prompt_tokens: int  # prompt positions computed, padding included
    decode_steps: int  # forwards after the prefills, all batches together


class StaticBatchAttention:
    """The contiguous K/V cache of one left-padded batch, and attention over it."""

    def __init__(self, model: LlamaModel, pad_lens: torch.Tensor, max_len: int, dtype: torch.dtype):
        config = model.config
        batch = pad_lens.shape[0]
        shape = (
            config.num_hidden_layers,
            batch,
            max_len,
            config.num_key_value_heads,
            config.head_dim,
        )
        device = pad_lens.device
        # NOTE: zeros, not empty: a masked key still multiplies its value by a zero weight,
        # and 0 * NaN from uninitialised memory would be NaN.
        self.k_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.v_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.pad_lens = pad_lens
        self.batch = batch
        self.filled = 0  # cache columns written by earlier forwards
        self.num_new = 0  # columns this forward writes (per row)
        self.mask: torch.Tensor | None = None

    def begin(self, num_new: int) -> None:
        """Prepare a forward that appends `num_new` columns; the mask is shared by all layers."""
        self.num_new = num_new
        end = self.filled + num_new
        device = self.pad_lens.device
        key_pos = torch.arange(end, device=device)
        query_pos = torch.arange(self.filled, end, device=device).unsqueeze(1)
        causal = key_pos.unsqueeze(0) <= query_pos  # [new, end]
        real_key = key_pos.unsqueeze(0) >= self.pad_lens.unsqueeze(1)  # [B, end]
        # A padding query would see no key at all and turn NaN; let it see itself. Its output
        # only feeds padding columns, which real queries never attend to.
        itself = key_pos.unsqueeze(0) == query_pos
        mask = (causal.unsqueeze(0) & real_key.unsqueeze(1)) | itself.unsqueeze(0)
        self.mask = mask.unsqueeze(1)  # [B, 1, new, end]

    def finish(self) -> None:
        self.filled += self.num_new

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        batch, new, end = self.batch, self.num_new, self.filled + self.num_new
        heads, head_dim = q.shape[1], q.shape[2]
        self.k_cache[layer, :, self.filled : end] = k.view(batch, new, *k.shape[1:])
        self.v_cache[layer, :, self.filled : end] = v.view(batch, new, *v.shape[1:])
        out = F.scaled_dot_product_attention(
            q.view(batch, new, heads, head_dim).transpose(1, 2),
            self.k_cache[layer, :, :end].transpose(1, 2),
            self.v_cache[layer, :, :end].transpose(1, 2),
            attn_mask=self.mask,
            enable_gqa=True,
        )
        return out.transpose(1, 2).reshape(batch * new, heads, head_dim)


def _greedy_next(
    model: LlamaModel, ids: torch.Tensor, positions: torch.Tensor, attn: StaticBatchAttention
) -> torch.Tensor:
    """One forward of [B, new] tokens -> the greedy next token of every row, [B]."""
    attn.begin(ids.shape[1])
    hidden = model(ids.flatten(), positions.flatten(), attn)
    attn.finish()
    last = hidden.view(attn.batch, attn.num_new, -1)[:, -1]
    return model.compute_logits(last).argmax(dim=-1)


@torch.inference_mode()
def run_static_batch(model: LlamaModel, batch: list[BenchRequest]) -> list[list[int]]:
    """Greedy tokens of one static batch, each request's list cut to its max_tokens."""
    device = model.embed_tokens.weight.device
    prompt_lens = torch.tensor([len(r.prompt_token_ids) for r in batch], device=device)
    width = int(prompt_lens.max())
    steps = max(r.max_tokens for r in batch)
    pad_lens = width - prompt_lens
    rows = [[_PAD_TOKEN_ID] * (width - len(r.prompt_token_ids)) + list(r.prompt_token_ids)
            for r in batch]  # fmt: skip
    ids = torch.tensor(rows, dtype=torch.long, device=device)
    # Positions count real tokens only, as transformers derives them from the attention mask.
    positions = (torch.arange(width, device=device).unsqueeze(0) - pad_lens.unsqueeze(1)).clamp(
        min=0
    )
    attn = StaticBatchAttention(model, pad_lens, width + steps - 1, model.embed_tokens.weight.dtype)
    generated = [_greedy_next(model, ids, positions, attn)]
    for step in range(1, steps):
        # The token sampled at the previous step sits at position prompt_len + step - 1.
        step_positions = (prompt_lens + (step - 1)).unsqueeze(1)
        generated.append(_greedy_next(model, generated[-1].unsqueeze(1), step_positions, attn))
    tokens = torch.stack(generated, dim=1).tolist()
    return [row[: r.max_tokens] for row, r in zip(tokens, batch, strict=True)]


def run_naive(model: LlamaModel, requests: list[BenchRequest], batch_size: int) -> NaiveResult:
    """Serve `requests` in arrival order, `batch_size` at a time, one batch after another."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    tokens: dict[str, list[int]] = {}
    padded = steps = 0
    started_s = time.perf_counter()
    for start in range(0, len(requests), batch_size):
        batch = requests[start : start + batch_size]
        for request, out in zip(batch, run_static_batch(model, batch), strict=True):
            tokens[request.request_id] = out
        padded += len(batch) * max(len(r.prompt_token_ids) for r in batch)
        steps += max(r.max_tokens for r in batch) - 1
    return NaiveResult(tokens, time.perf_counter() - started_s, padded, steps)
