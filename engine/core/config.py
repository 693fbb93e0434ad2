"""Engine configuration: the knobs the operating envelope sets, plus where the model lives."""

from __future__ import annotations

from dataclasses import dataclass

from policies.interactive_presence import DEFAULT_LINGER_S
from policies.scheduling_policy import SchedulingPolicy


@dataclass(frozen=True, slots=True)
class EngineConfig:
    # Bulk sequences that hold KV blocks and take part in steps at once, at most; and every
    # sequence, unless interactive ones overcommit (below).
    max_active_seqs: int = 32
    # Slots above max_active_seqs that only interactive sequences take: a chat arriving while
    # bulk fills every slot runs beside it instead of preempting a bulk sequence (whose recompute
    # is thrown-away work) or taking one of bulk's slots for good. vLLM's priority scheduling
    # gives bulk all of max_num_seqs; so does this, with chats riding on top.
    interactive_overcommit_seqs: int = 0
    # Tokens (decode tokens + prefill-chunk tokens) one forward may carry; bounds ITL.
    step_token_budget: int = 512
    # Bulk prefill tokens per step at most, taken only from what interactive work left.
    bulk_prefill_chunk_tokens: int = 128
    # Once bulk work has waited bulk_aging_s since arrival, it is owed this share of every step
    # that holds it back (policies/bulk_guarantee.py).
    bulk_min_share: float = 0.2
    bulk_aging_s: float = 5.0
    # How long after interactive work was last in the engine the bulk prefill cap lifts (bulk
    # alone then runs full-budget steps): 0 at once; None never, so that a chat arriving into
    # a lull waits for a capped step, not a full-budget one (policies/interactive_presence.py:
    # on this project's CPU neither chat latency nor bulk gained from holding it).
    interactive_linger_s: float | None = DEFAULT_LINGER_S
    # KV cache geometry: tokens per block, and blocks (None: sized from kv_cache_bytes).
    block_size_tokens: int = 16
    num_kv_blocks: int | None = None
    kv_cache_bytes: int = 1 << 30
    # Longest prompt + output; None: the model's own context length.
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    # "float32" | "bfloat16" | "float16" | "auto" (the checkpoint's dtype).
    dtype: str = "float32"
    # "cpu" | "cuda" | "auto" (cuda when available).
    device: str = "auto"
    # CPU: run every linear through oneDNN over weights prepacked at load (2-7x faster decode
    # GEMMs than torch's default MKL path on a Zen 4 EPYC); False keeps torch's own linears.
    prepack_linears: bool = True
    # Decode attention by the engine's own kernel over the paged cache in place: on CPU (fp32 or
    # bf16 caches) a C kernel (engine/model/kernels/; 4-6x faster than gathering K/V copies for
    # torch's SDPA on this project's 2-vCPU machines), on CUDA a Triton one; False, or no C
    # compiler / no Triton, keeps the gather and SDPA. Prefill chunks too, on CPU with an fp32
    # cache (engine/model/kernels/paged_prefill_attention.c: causal over the cache in place,
    # 1.6x torch's flash SDPA on a 2,048-token prompt of 100m, no gather or mask for a later
    # chunk); False keeps SDPA.
    paged_attention_kernel: bool = True
    # CPU, fp32: RMSNorm (with the residual add), SiLU * up and rotary each in one C pass
    # (engine/model/kernels/fused_elementwise.c: 2-4x faster than eager torch's op chains, 4x
    # for a prefill chunk's SiLU * up); False, or no C compiler, keeps eager torch.
    fused_elementwise_kernels: bool = True
    # CPU, fp32, with prepack_linears: weights of <= 64 MiB also through the engine's own C loop
    # for calls of <= 128 rows with AVX-512, 64 with AVX2 (engine/model/kernels/skinny.py:
    # faster than oneDNN there, from its fixed cost per call on small weights, from streaming on
    # large ones); False keeps oneDNN for every call. (The name is from when it took small
    # weights only.)
    small_linear_kernel: bool = True
    # Pure-decode steps through padded static shapes replayed as CUDA graphs
    # (engine/model/decode_graphs.py): "auto" (on CUDA; the eager forward's launches left an
    # H200 idle most of an 8B decode step), "off", or "eager" (the padded path without graphs,
    # on any device: tests).
    decode_graphs: str = "auto"
    # CPU, fp32, where the C kernels above all run: a step's whole forward (decodes and prefill
    # chunks, up to the skinny kernel's rows) in one C call (engine/model/kernels/
    # step_forward.py), the same kernels in the same order without the Python between them;
    # False keeps the layer-by-layer forward.
    fused_step_forward: bool = True
    # CPU: a fresh engine's steps as fast as its later ones. The KV cache's pages are committed
    # ahead of use on a background thread (engine/model/kv_cache_memory.py: first touch of
    # fresh huge pages doubled a prefill step), and oneDNN's primitive for every weight shape
    # and row bucket a step can take is made before the engine is ready
    # (prepacked_linear.warm_row_buckets). Off here (tests build many engines); `mixgate serve`
    # turns it on.
    prewarm: bool = False
    # torch intra-op threads; None leaves torch's default.
    num_threads: int | None = None
    # The engine core process (engine/process/main.py) runs a step on fewer threads while
    # other work holds the cores it spans (engine/process/thread_governor.py). Off here (an
    # engine in a test's own process keeps its count); `mixgate serve` turns it on.
    adapt_threads: bool = False
    # Seed for requests without their own seed.
    seed: int = 0
    # "mixgate" | "priority" | "fcfs" (policies/scheduling_policy.py): the presets compared.
    scheduling_policy: str = "mixgate"

    @property
    def max_running_seqs(self) -> int:
        """Sequences running at once at most: bulk's slots and interactive's overcommit."""
        return self.max_active_seqs + self.interactive_overcommit_seqs

    def __post_init__(self) -> None:
        self._check_scheduling()
        self._check_cache_and_device()

    def _check_scheduling(self) -> None:
        if self.max_active_seqs < 1:
            raise ValueError("max_active_seqs must be at least 1")
        if self.interactive_overcommit_seqs < 0:
            raise ValueError("interactive_overcommit_seqs must be non-negative")
        if self.step_token_budget < self.max_running_seqs:
            # NOTE: every running sequence's decode token must fit in one step, or a decoding
            # sequence could be skipped, which the scheduling contract forbids (bulk decodes
            # sit out only a step that runs an interactive prefill: policies/step_budget.py).
            raise ValueError(
                "step_token_budget must be >= max_active_seqs + interactive_overcommit_seqs"
            )
        if self.bulk_prefill_chunk_tokens < 1:
            raise ValueError("bulk_prefill_chunk_tokens must be at least 1")
        if not 0.0 <= self.bulk_min_share < 1.0:
            raise ValueError("bulk_min_share must be in [0, 1)")
        if self.bulk_aging_s < 0:
            raise ValueError("bulk_aging_s must be non-negative")
        if self.interactive_linger_s is not None and self.interactive_linger_s < 0:
            raise ValueError("interactive_linger_s must be non-negative")
        if self.scheduling_policy not in {p.value for p in SchedulingPolicy}:
            raise ValueError(f"unknown scheduling_policy {self.scheduling_policy!r}")

    def _check_cache_and_device(self) -> None:
        if self.block_size_tokens < 1:
            raise ValueError("block_size_tokens must be at least 1")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError("num_kv_blocks must be at least 1")
        if self.kv_cache_bytes < 1:
            raise ValueError("kv_cache_bytes must be positive")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError("max_model_len must be at least 2")
        if self.dtype not in ("float32", "bfloat16", "float16", "auto"):
            raise ValueError(f"unknown dtype {self.dtype!r}")
        if self.device not in ("cpu", "cuda", "auto") and not self.device.startswith("cuda:"):
            raise ValueError(f"unknown device {self.device!r}")
        if self.decode_graphs not in ("auto", "off", "eager"):
            raise ValueError(f"unknown decode_graphs {self.decode_graphs!r}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError("num_threads must be at least 1")
