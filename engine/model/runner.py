"""Runs one step: one forward over a flattened batch mixing prefill chunks and decode tokens."""

from __future__ import annotations

import torch

from engine.core.scheduler_output import ScheduledChunk, SchedulerOutput
from engine.model.attention import (
    DecodeGroup,
    DecodeKernel,
    GatherBuffers,
    PagedAttention,
    PagedAttentionMetadata,
    PrefillKernel,
    PrefillSpan,
    additive_mask,
    decode_attention_dtype,
)
from engine.model.config import ModelConfig
from engine.model.decode_graphs import DecodeGraphs
from engine.model.heap_reuse import keep_large_frees_for_reuse
from engine.model.kernels.elementwise import ElementwiseKernels
from engine.model.kernels.fused_elementwise_triton import triton_fused_elementwise
from engine.model.kernels.fused_ops import fused_elementwise_kernel
from engine.model.kernels.paged_decode import PagedDecodeKernel, paged_decode_kernel
from engine.model.kernels.paged_decode_triton import TritonPagedDecode, triton_paged_decode
from engine.model.kernels.paged_prefill import PagedPrefillKernel, paged_prefill_kernel
from engine.model.kernels.skinny import skinny_linear_kernel
from engine.model.kernels.step_forward import StepForward
from engine.model.kv_cache_memory import populate_in_background, zeroed_kv_cache
from engine.model.prepacked_linear import (
    move_panels_into_huge_pages,
    prepack_linears,
    prepacking_supported,
)
from engine.model.sampler import Sampler
from engine.model.step_inputs import StepInputBuilder, StepInputs
from engine.model.transformer import LlamaModel


def kv_block_bytes(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one KV block takes over all layers (K and V)."""
    element_bytes = torch.empty((), dtype=dtype).element_size()
    return (
        2
        * config.num_hidden_layers
        * block_size
        * config.num_key_value_heads
        * (config.head_dim * element_bytes)
    )


class ModelRunner:
    """Owns the model, the paged KV cache and the sampler; the executor of the torch engine."""

    def __init__(
        self,
        model: LlamaModel,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        seed: int,
        *,
        prepack: bool = True,
        paged_kernel: bool = True,
        fused_elementwise: bool = True,
        small_linear_kernel: bool = True,
        decode_graphs: str = "auto",
        fused_step_forward: bool = True,
        populate_kv_cache: bool = False,
    ):
        config = model.config
        # oneDNN-prepacked weights where this CPU runs them (engine/model/prepacked_linear.py: 2-7x
        # faster small-row GEMMs than torch's default path on Zen 4); `prepack=False` keeps
        # torch's own linears (EngineConfig.prepack_linears).
        self.prepacked = prepack and prepacking_supported(device, dtype)
        # fp32 weights also through the engine's own few-rows kernel for decode-sized calls
        # (engine/model/kernels/skinny.py: 0.56-0.85x oneDNN's time up to 64 rows, small and
        # streamed weights alike); `small_linear_kernel=False` keeps oneDNN for every call.
        use_skinny = small_linear_kernel and self.prepacked and dtype == torch.float32
        self.skinny_linear = skinny_linear_kernel() if use_skinny else None
        if self.prepacked:
            prepack_linears(model, self.skinny_linear)
            # The panels a decode step streams whole, in 2 MiB pages (engine/model/huge_pages.py:
            # 1.2-1.7 ms of a 25 ms B=8 step of 100m was TLB misses and their cache pollution).
            move_panels_into_huge_pages(model)
        self.model = model
        self.block_size = block_size
        self.device = device
        graph_mode = _decode_graph_mode(decode_graphs, device, config)
        self.kv_cache = zeroed_kv_cache(
            (
                config.num_hidden_layers,
                2,
                # One block past the block manager's: padded decode rows write there.
                num_blocks + (graph_mode != "off"),
                block_size,
                config.num_key_value_heads,
                config.head_dim,
            ),
            dtype,
            device,
        )
        if device.type == "cpu":
            # After the cache: it keeps its own lazily committed mapping (heap_reuse.py).
            keep_large_frees_for_reuse()
        # Pages committed ahead of the steps that first write them (EngineConfig.prewarm).
        self.populate_thread = populate_in_background(self.kv_cache) if populate_kv_cache else None
        # Decode attention over the cache in place (engine/model/kernels/) where it runs: fp32
        # and bf16 caches on CPU, with a C compiler here; any cache on CUDA, with Triton
        # installed; else gathered copies and torch's SDPA.
        # `paged_kernel=False` keeps the latter (EngineConfig.paged_attention_kernel).
        self.decode_kernel = _decode_kernel(config, dtype, device) if paged_kernel else None
        # Prefill chunks likewise, causally over the cache in place: fp32 caches on CPU (a C
        # compiler here); else SDPA over the fresh K/V, or over a gathered copy and a mask.
        self.prefill_kernel = _prefill_kernel(config, dtype, device) if paged_kernel else None
        # RMSNorm (with the residual add), SiLU * up and rotary in one pass each where a kernel
        # runs: C for fp32 on CPU (a C compiler here), Triton on CUDA (Triton installed);
        # `fused_elementwise=False` keeps eager torch (EngineConfig.fused_elementwise_kernels).
        self.fused_elementwise = _elementwise_kernels(dtype, device) if fused_elementwise else None
        model.use_fused_elementwise(self.fused_elementwise)
        self.sampler = Sampler(device, seed)
        self.gather_buffers = GatherBuffers()
        self.inputs = StepInputBuilder(block_size, device)
        # Pure-decode steps through padded static shapes, replayed as CUDA graphs on a GPU
        # (engine/model/decode_graphs.py): the eager forward's ~1,200 launches per step kept an
        # H200 idle 77% of an 8B decode step.
        self.decode_graphs = (
            None
            if graph_mode == "off"
            else DecodeGraphs(
                model,
                self.kv_cache,
                block_size,
                num_blocks,
                capture=graph_mode == "capture",
                decode_kernel=self.decode_kernel,
            )
        )
        # A step's whole forward in one C call where the layers run on the C kernels, decodes
        # and prefill chunks alike (engine/model/kernels/step_forward.py: the per-layer Python
        # between them was most of a decode step's fixed cost, and 8-18% of a `small` mixed
        # step's); `fused_step_forward=False` keeps the layers.
        self.step_forward = (
            StepForward.for_model(
                model,
                self.kv_cache,
                self.skinny_linear,
                self.decode_kernel,
                self.fused_elementwise,
                self.prefill_kernel,
            )
            if fused_step_forward and self.decode_graphs is None
            else None
        )

    def wait_kv_cache_committed(self) -> None:
        """Block until the background commit of the KV cache's pages is done (no-op without
        one): a benchmark's timed steps then write committed pages, as a served engine's do."""
        if self.populate_thread is not None:
            self.populate_thread.join()

    @torch.inference_mode()
    def execute(self, output: SchedulerOutput) -> dict[str, int]:
        """Run the step's forward and return the token sampled for each chunk that samples."""
        # Single-token chunks first, shortest context first: the attention backend batches
        # them by similar length.
        chunks = sorted(output.chunks, key=lambda c: (c.num_tokens != 1, c.end_pos))
        inputs = self.inputs.build(chunks)
        if self.decode_graphs is not None and inputs.all_single:
            # Ascending context: the last chunk needs the most blocks.
            width_blocks = -(-chunks[-1].end_pos // self.block_size)
            all_logits = self.decode_graphs.logits(
                inputs.input_ids,
                inputs.positions,
                inputs.slot_mapping,
                inputs.context_lens,
                self._table_rows(inputs.rows),
                width_blocks,
            )
            if all_logits is not None:
                return self._sample(inputs, _sampling_rows(inputs, all_logits))
        forward = self.step_forward
        if (
            forward is not None
            and (inputs.all_single or forward.takes_prefill)
            and inputs.input_ids.shape[0] <= forward.max_rows
        ):
            hidden = self._fused_hidden(forward, chunks, inputs)
            if hidden is not None:
                return self._sample_hidden(inputs, hidden)
        meta = self._metadata(chunks, inputs)
        attention = PagedAttention(
            self.kv_cache, meta, self.gather_buffers, self.decode_kernel, self.prefill_kernel
        )
        hidden = self.model(inputs.input_ids, inputs.positions, attention)
        return self._sample_hidden(inputs, hidden)

    def _fused_hidden(
        self, forward: StepForward, chunks: list[ScheduledChunk], inputs: StepInputs
    ) -> torch.Tensor | None:
        """The step's final hidden states from the one-call C forward, or None where it refuses.
        Single-token chunks (sorted first) go to its decode attention, the rest to its prefill
        attention, as `_metadata` splits them for the layers."""
        singles = inputs.num_single_chunks
        width_blocks = -(-chunks[singles - 1].end_pos // self.block_size) if singles else 1
        tables = self._table_rows(inputs.rows[:singles], width_blocks)
        spans = span_tables = None
        if singles < len(chunks):
            prefills = chunks[singles:]
            spans = torch.tensor([[c.num_tokens, c.start_pos] for c in prefills], dtype=torch.long)
            span_tables = self._table_rows(inputs.rows[singles:])
        return forward.hidden(
            inputs.input_ids,
            inputs.positions,
            inputs.slot_mapping,
            tables,
            inputs.context_lens[:singles],
            spans,
            span_tables,
        )

    def _table_rows(self, rows: torch.Tensor, width_blocks: int | None = None) -> torch.Tensor:
        """The block-table rows of a step's decodes (`rows`, the step's row ids in chunk
        order), cut to their first `width_blocks` columns (all of them when None)."""
        tables = self.inputs.block_tables.table.index_select(0, rows)
        return tables if width_blocks is None else tables[:, :width_blocks]

    def _sample_hidden(self, inputs: StepInputs, hidden: torch.Tensor) -> dict[str, int]:
        """Logits of the rows that sample (only those: the LM head is the widest matmul of a
        small model's step), then their tokens."""
        if not inputs.sampling_chunks:
            return {}
        return self._sample(inputs, self.model.compute_logits(_sampling_rows(inputs, hidden)))

    def _sample(self, inputs: StepInputs, logits: torch.Tensor) -> dict[str, int]:
        """The token of each chunk that samples, from its row of `logits`."""
        sampling = inputs.sampling_chunks
        if not sampling:
            return {}
        ids = [c.seq.seq_id for c in sampling]
        tokens = self.sampler.sample(logits, ids, [c.seq.sampling for c in sampling])
        return dict(zip(ids, tokens, strict=True))

    def _metadata(self, chunks: list[ScheduledChunk], inputs: StepInputs) -> PagedAttentionMetadata:
        num_singles = inputs.num_single_chunks
        size = self.block_size
        table = self.inputs.block_tables.table
        dtype = self.kv_cache.dtype
        groups = []
        start = 0
        block_counts = [-(-c.end_pos // size) for c in chunks[:num_singles]]
        cache = self.kv_cache
        # One layer's K and V of one block.
        block_bytes = 2 * cache[0, 0, 0].numel() * cache.element_size()
        # The cap is for CPU caches; on a GPU more groups would only mean more kernel launches.
        cap = DECODE_GROUP_BYTES if self.device.type == "cpu" else None
        # The kernel reads each row's own blocks: every decode in one group, no padding, no mask.
        kernel = self.decode_kernel is not None
        runs = (
            [num_singles]
            if kernel and num_singles
            else length_groups(block_counts, block_bytes, cap)
        )
        for group in runs:
            end = start + group
            max_blocks = block_counts[end - 1]  # ascending context: the last is the longest
            # Contiguous once per step: every layer's gather flattens it (a view, not a copy).
            tables = self._table_rows(inputs.rows[start:end], max_blocks).contiguous()
            lengths = inputs.context_lens[start:end]
            if kernel:
                groups.append(DecodeGroup(start, end, tables, None, lengths))
            else:
                key_pos = self.inputs.arange(max_blocks * size)
                visible = key_pos.unsqueeze(0) < lengths.unsqueeze(1)
                mask = additive_mask(visible, decode_attention_dtype(dtype, self.device))
                groups.append(DecodeGroup(start, end, tables, mask.view(group, 1, 1, -1)))
            start = end
        spans = []
        for index in range(num_singles, len(chunks)):
            chunk = chunks[index]
            row = inputs.row_ids[index]
            block_table = table[row, : -(-chunk.end_pos // size)]
            span_mask: torch.Tensor | None = None
            if chunk.start_pos > 0 and self.prefill_kernel is None:
                query_pos = inputs.positions[start : start + chunk.num_tokens]
                key_pos = self.inputs.arange(chunk.end_pos)
                span_mask = additive_mask(key_pos.unsqueeze(0) <= query_pos.unsqueeze(1), dtype)
            spans.append(
                PrefillSpan(start, start + chunk.num_tokens, chunk.end_pos, block_table, span_mask)
            )
            start += chunk.num_tokens
        return PagedAttentionMetadata(inputs.slot_mapping, tuple(groups), tuple(spans))


DECODE_GRAPH_MODES = ("auto", "off", "eager")


def _sampling_rows(inputs: StepInputs, rows: torch.Tensor) -> torch.Tensor:
    """The rows of `rows` (one per token the step runs) that sample: each sampling chunk's last
    token (all of them when every row samples)."""
    return rows if inputs.sample_rows is None else rows.index_select(0, inputs.sample_rows)


def _decode_graph_mode(mode: str, device: torch.device, config: ModelConfig) -> str:
    """The path pure-decode steps take: "capture" (CUDA graphs), "eager" (the padded static
    path without graphs: tests) or "off". "auto" captures on CUDA only; an MoE model never
    takes the static path (its experts see data-dependent row counts)."""
    if mode not in DECODE_GRAPH_MODES:
        raise ValueError(f"decode_graphs must be one of {DECODE_GRAPH_MODES}, got {mode!r}")
    if mode == "off" or config.is_moe:
        return "off"
    if mode == "eager":
        return "eager"
    return "capture" if device.type == "cuda" else "off"


def _decode_kernel(
    config: ModelConfig, dtype: torch.dtype, device: torch.device
) -> DecodeKernel | None:
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if device.type == "cuda":
        # Triton's kernel over the cache in place, where Triton is installed (any dtype).
        if not TritonPagedDecode.supports(heads, kv_heads, config.head_dim):
            return None
        return triton_paged_decode()
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return None
    if not PagedDecodeKernel.supports(heads, kv_heads, config.head_dim):
        return None
    return paged_decode_kernel()


def _prefill_kernel(
    config: ModelConfig, dtype: torch.dtype, device: torch.device
) -> PrefillKernel | None:
    if device.type != "cpu" or dtype != torch.float32:
        return None
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if not PagedPrefillKernel.supports(heads, kv_heads, config.head_dim):
        return None
    return paged_prefill_kernel()


def _elementwise_kernels(dtype: torch.dtype, device: torch.device) -> ElementwiseKernels | None:
    if device.type == "cuda":
        return triton_fused_elementwise()
    if device.type == "cpu" and dtype == torch.float32:
        return fused_elementwise_kernel()
    return None


# Gathered K+V bytes (one layer) a decode group may hold before the next group starts; None:
# no cap (groups by length only). A module switch so that a benchmark can time both.
DECODE_GROUP_BYTES: int | None = 4 << 20


def length_groups(
    block_counts: list[int], block_bytes: int = 0, cap_bytes: int | None = None
) -> list[int]:
    """Split ascending block counts into runs whose padding stays small; returns run sizes.

    NOTE: one padded gather for every decode copies the longest context for each sequence;
    with mixed lengths that was nearly twice the blocks needed. A run closes once the next
    sequence needs more than 1.5x (+1) the blocks of the run's first, or once its gathered
    K/V (rows x the longest row's blocks x `block_bytes`) would pass `cap_bytes`: a gather
    small enough to stay in cache is read back by SDPA from cache, not from memory, so the
    copy costs a read of the cache and little more. 30 decodes over 100-1,500 tokens, one
    layer, 1 thread, interleaved (noisy helper machine): 100m 25.8 -> 12.0 ms with a 1-8 MB
    cap, small 4.8 -> 3.6 ms with 2-4 MB (this CPU: 1 MB L2 a core, 32 MB L3).
    """
    sizes: list[int] = []
    first = -1
    for count in block_counts:
        new_run = not sizes or count > first * 1.5 + 1
        if not new_run and cap_bytes is not None:
            new_run = (sizes[-1] + 1) * count * block_bytes > cap_bytes
        if new_run:
            sizes.append(0)
            first = count
        sizes[-1] += 1
    return sizes
