"""How many tokens of KV cache, and so how many sequences of a given context, fit in memory.

    KV capacity (tokens) = (device memory − weights − activations − headroom) / KV bytes per token
    KV bytes per token   = 2 · layers · kv_heads · head_dim · dtype bytes   (K and V, every layer)

Headroom is memory the service must not plan to use: the OS and other services on a CPU, the
CUDA context, library workspaces and allocator slack on a GPU.

NOTE: this is a budget, not a complete admission policy. It assumes every sequence holds its
whole context at once and nothing else; it ignores paging granularity and fragmentation (a
partly filled last block per sequence), prefix sharing (which lets more fit), the growth of
running sequences as they generate (which a scheduler must reserve for or preempt), swap or
recompute on preemption, and allocator behaviour. The engine's block manager and the envelope's
``max_active_seqs`` are what enforce a limit at run time.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_HEADROOM_FRACTION", "MemoryBudget"]

# A tenth of device memory kept free, as vLLM's default gpu_memory_utilization=0.9 does.
DEFAULT_HEADROOM_FRACTION = 0.1


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    device_memory_bytes: int  # all the memory of the device (or the RAM the service may use)
    weight_bytes: int  # every weight, every expert: they all stay resident
    kv_bytes_per_token: int
    activation_bytes: int = 0  # activations and temporary buffers of the largest step
    headroom_bytes: int = 0  # kept free for the OS, runtime, other services

    def __post_init__(self) -> None:
        if self.device_memory_bytes < 1:
            raise ValueError("device_memory_bytes must be at least 1")
        if self.kv_bytes_per_token < 1:
            raise ValueError("kv_bytes_per_token must be at least 1")
        if min(self.weight_bytes, self.activation_bytes, self.headroom_bytes) < 0:
            raise ValueError("weight, activation and headroom bytes must be non-negative")

    @classmethod
    def with_headroom_fraction(
        cls,
        device_memory_bytes: int,
        weight_bytes: int,
        kv_bytes_per_token: int,
        activation_bytes: int = 0,
        headroom_fraction: float = DEFAULT_HEADROOM_FRACTION,
    ) -> MemoryBudget:
        """Headroom as a share of device memory (default: a tenth)."""
        if not 0.0 <= headroom_fraction < 1.0:
            raise ValueError("headroom_fraction must be in [0, 1)")
        return cls(
            device_memory_bytes=device_memory_bytes,
            weight_bytes=weight_bytes,
            kv_bytes_per_token=kv_bytes_per_token,
            activation_bytes=activation_bytes,
            headroom_bytes=int(device_memory_bytes * headroom_fraction),
        )

    @property
    def fixed_bytes(self) -> int:
        """Memory spoken for before any KV: weights, activations, headroom."""
        return self.weight_bytes + self.activation_bytes + self.headroom_bytes

    @property
    def kv_budget_bytes(self) -> int:
        """What is left for the KV cache (0 when the model does not fit at all)."""
        return max(0, self.device_memory_bytes - self.fixed_bytes)

    def kv_token_capacity(self) -> int:
        """Tokens of KV cache that fit, over all sequences together."""
        return self.kv_budget_bytes // self.kv_bytes_per_token

    def max_sequences(self, context_tokens: int) -> int:
        """Sequences of ``context_tokens`` each (prompt + output) that fit at once."""
        if context_tokens < 1:
            raise ValueError("context_tokens must be at least 1")
        return self.kv_token_capacity() // context_tokens

    def used_bytes(self, sequences: int, context_tokens: int) -> int:
        """Memory in use with ``sequences`` of ``context_tokens`` (headroom not counted)."""
        if sequences < 0 or context_tokens < 0:
            raise ValueError("sequences and context_tokens must be non-negative")
        kv_bytes = sequences * context_tokens * self.kv_bytes_per_token
        return self.weight_bytes + self.activation_bytes + kv_bytes

    def fits(self, sequences: int, context_tokens: int) -> bool:
        return self.used_bytes(sequences, context_tokens) + self.headroom_bytes <= (
            self.device_memory_bytes
        )
