"""The Llama family (Llama, Mistral, Qwen2, and Mixtral's MoE) over a flattened batch of tokens.

Every tensor is [tokens, ...]: prefill chunks and decode tokens of many sequences are laid
end to end and run as one forward; the attention backend keeps sequences apart. q/k/v and
gate/up projections are fused into single matmuls at load time. A Mixtral layer's MLP is a
sparse mixture of experts (`engine.model.moe`); everything else is shared.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.attention import AttentionBackend
from engine.model.config import ModelConfig
from engine.model.kernels.elementwise import ElementwiseKernels
from engine.model.moe import SparseMoeBlock
from engine.model.rotary import RotaryEmbedding, RotaryTables


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        # Fused kernels (engine/model/kernels/: C on CPU, Triton on CUDA) where the model runs
        # them (LlamaModel.use_fused_elementwise); None: eager torch.
        self.fused: ElementwiseKernels | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused is not None and x.dim() == 2 and self.fused.applies_to(x):
            return self.fused.rms_norm(x, self.weight, self.eps)
        # In fp32 whatever the model dtype, as transformers does.
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)

    def add_and_norm(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + residual, this norm of it): one pass where the fused kernel runs."""
        if self.fused is not None and x.dim() == 2 and self.fused.applies_to(x):
            return self.fused.add_rms_norm(x, residual, self.weight, self.eps)
        total = x + residual
        return total, self(total)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        self.split_sizes = [q_size, kv_size, kv_size]
        self.qkv_proj = nn.Linear(config.hidden_size, q_size + 2 * kv_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(q_size, config.hidden_size, bias=config.o_proj_bias)
        self.fused: ElementwiseKernels | None = None  # the rotary kernel where it runs

    def forward(self, rope: RotaryTables, x: torch.Tensor, attn: AttentionBackend) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        q_size, kv_size = self.split_sizes[0], self.split_sizes[1]
        # q and k rotate together (one view over both, one set of ops), then split.
        qk = qkv[:, : q_size + kv_size].view(-1, self.num_heads + self.num_kv_heads, self.head_dim)
        if self.fused is not None and self.fused.applies_to(qk):
            qk = self.fused.rotary(qk, rope.cos, rope.signed_sin)
        else:
            qk = rope.apply(qk)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        v = qkv[:, q_size + kv_size :].view(-1, self.num_kv_heads, self.head_dim)
        out = attn.attend(self.layer, q, k, v)
        projected: torch.Tensor = self.o_proj(out.reshape(-1, self.num_heads * self.head_dim))
        return projected


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        size = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(size, config.hidden_size, bias=config.mlp_bias)
        self.fused: ElementwiseKernels | None = None  # the SiLU * up kernel where it runs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if self.fused is not None and gate_up.dim() == 2 and self.fused.applies_to(gate_up):
            # One pass instead of silu over a strided half, then a product (4.8 ms vs 1.4 for
            # a 512-token chunk of 100m: fused_ops.py's note).
            activated = self.fused.silu_mul(gate_up)
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            activated = F.silu(gate) * up
        down: torch.Tensor = self.down_proj(activated)
        return down


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp: MLP | SparseMoeBlock = SparseMoeBlock(config) if config.is_moe else MLP(config)

    def forward(
        self,
        rope: RotaryTables,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        attn: AttentionBackend,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, residual) -> (this layer's MLP output, the residual stream before it).

        The residual add after the MLP is left to the next layer's input norm (or the final
        norm), which does it in the same pass as the norm, as vLLM's layers do: one launch per
        layer fewer on a GPU, one pass over the activations fewer on CPU. `residual` is None for
        the first layer (its input is the embeddings)."""
        if residual is None:
            residual, normed = x, self.input_layernorm(x)
        else:
            residual, normed = self.input_layernorm.add_and_norm(x, residual)
        attended = self.self_attn(rope, normed, attn)
        residual, normed = self.post_attention_layernorm.add_and_norm(attended, residual)
        return self.mlp(normed), residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.rotary = RotaryEmbedding(
            config.head_dim,
            config.max_position_embeddings,
            config.rope_theta,
            config.rope_scaling,
        )
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        """input_ids, positions: [T] -> final hidden states [T, hidden] (before lm_head)."""
        x = self.embed_tokens(input_ids)
        rope = self.rotary.tables(positions, x.dtype)
        residual: torch.Tensor | None = None
        for layer in self.layers:
            x, residual = layer(rope, x, residual, attn)
        assert residual is not None, "a model has at least one layer"
        _, hidden = self.norm.add_and_norm(x, residual)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits in fp32 (sampling and comparisons want full precision)."""
        logits: torch.Tensor = self.lm_head(hidden)
        return logits.float()

    def use_fused_elementwise(self, kernel: ElementwiseKernels | None) -> None:
        """Run RMSNorm (with the residual add), SiLU * up and rotary through `kernel` where it
        applies to a tensor (None: eager torch everywhere). The dense reference path
        (`dense_logits`) runs through the same modules, so it follows the same choice."""
        for module in self.modules():
            if isinstance(module, (RMSNorm, Attention, MLP)):
                module.fused = kernel

    def moe_blocks(self) -> list[SparseMoeBlock]:
        """The MoE blocks, one per layer (none for a dense model)."""
        return [m for m in self.modules() if isinstance(m, SparseMoeBlock)]

    @torch.inference_mode()
    def dense_logits(self, token_ids: list[int]) -> torch.Tensor:
        """Reference path: one sequence, no cache, every position's logits [T, vocab]."""
        from engine.model.attention import DenseCausalAttention

        device = self.embed_tokens.weight.device
        ids = torch.tensor(token_ids, dtype=torch.long, device=device)
        positions = torch.arange(len(token_ids), device=device)
        return self.compute_logits(self.forward(ids, positions, DenseCausalAttention()))
