"""The binding of step_forward.c: a step's forward, all layers, in one C call.

`StepForward.for_model` returns one for a model it can run (CPU, fp32, dense Llama layers,
every linear packed for the skinny kernel, the C paged-attention and elementwise kernels in use),
else None; the runner then keeps the layer-by-layer forward. `hidden` returns the final norm's
output for a step of up to `max_rows` rows (decodes, and prefill chunks where the layers attend
them with the C prefill kernel), the same bits as `LlamaModel.forward` gives (the C side calls
the very kernel functions the layers call); the caller computes the logits.

NOTE: measured on the 2-vCPU Xeon (AMX, 2.6 GHz), torch 2.13, 2 threads, `100m` (12 layers),
context 128, `mixgate bench engine` run both ways back to back (medians of 3 rounds x 10 steps):
decode steps at B=1/2/4/8/16/32/64 took 18.6/19.6/20.5/24.0/32.7/51.1/90.4 ms layer by layer
and 15.2/15.7/17.5/20.1/28.4/47.6/89.8 ms in one call: 3.5-4 ms less a step up to B=16 (the
ctypes calls, the tensors each allocated and first touched, the views, the embedding and the
rotary tables), less at B=64 where the arithmetic is the step. `plan calibrate`'s fitted fixed
cost per step went from 3.8-4.7 ms to 0.0 (rms error 4.3%). A step's kernels were timed alone
in a probe before: 17.0/21.5/50.9 ms of the 19.1/24.4/54.3 ms steps at B=1/8/32.

NOTE: mixed steps (decodes and prefill chunks) came here later. On the 2-vCPU AMD EPYC (Zen 5,
AVX-512), torch 2.13, 2 threads, one ModelRunner timing both ways alternately (`python -m
bench.engine.mixed --forward both --chunk-tokens 64`, medians), one call vs the layers:
`small`, 30 decodes at 100-1,500 tokens + a 64-token chunk at 1,000: 5.68 vs 5.95 and 6.43 vs
6.64 ms (0.95-0.97x); 8 decodes + 64: 3.53 vs 3.89 and 3.98 vs 4.54 (0.88-0.91x); the chunk
alone 2.10-2.41 vs 2.36-2.76 (0.86-0.92x). `100m`: 30 + 64 77.0 vs 82.2 ms, the chunk alone 44.2
vs 47.3 (0.94x). An earlier probe over the same steps read 0.82-0.92x on `small`.
"""

from __future__ import annotations

import ctypes
import functools
import math
from pathlib import Path

import torch

from engine.model.kernels.fused_ops import FusedElementwise
from engine.model.kernels.native_build import load_kernel_or_none
from engine.model.kernels.paged_decode import PagedDecodeKernel
from engine.model.kernels.paged_prefill import PagedPrefillKernel
from engine.model.kernels.skinny import SkinnyLinear
from engine.model.prepacked_linear import PrepackedLinear
from engine.model.transformer import MLP, DecoderLayer, LlamaModel

__all__ = ["MAX_ROWS", "StepForward", "step_forward_library"]

_SOURCE = Path(__file__).with_name("step_forward.c")
# The C entry's limit (its scratch buffers' rows: the skinny kernel's bound with AVX-512, 64 with
# AVX2, whose build `StepForward.max_rows` holds to its own). Larger steps go layer by layer.
MAX_ROWS = 128

_ptr = ctypes.c_void_p
_i64 = ctypes.c_int64


class _Layer(ctypes.Structure):
    _fields_ = [
        (name, _ptr)
        for name in (
            "input_norm", "post_attention_norm", "qkv_panels", "qkv_bias", "o_panels", "o_bias",
            "gate_up_panels", "gate_up_bias", "down_panels", "down_bias", "k_cache", "v_cache",
        )
    ]  # fmt: skip


class _Kernels(ctypes.Structure):
    _fields_ = [
        (name, _ptr)
        for name in ("rms_norm", "silu_mul", "rotary", "linear", "attention", "prefill_attention")
    ]


class _Model(ctypes.Structure):
    _fields_ = [
        *[(name, _i64) for name in (
            "layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "block_size",
        )],
        ("eps", ctypes.c_float),
        ("attention_scale", ctypes.c_float),
        *[(name, _ptr) for name in ("embedding", "cos_table", "sin_table", "final_norm")],
    ]  # fmt: skip


_SCRATCH_FIELDS = (
    "residual", "stream", "normed", "qkv", "qk", "q", "attended", "gate_up", "activated",
    "cos_rows", "signed_sin",
)  # fmt: skip


class _Scratch(ctypes.Structure):
    _fields_ = [(name, _ptr) for name in _SCRATCH_FIELDS]


def _address(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def _skinny_panels(linear: object) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(panels, bias) of a linear the skinny kernel runs at every decode row count, else None."""
    if not isinstance(linear, PrepackedLinear) or linear.panels is None:
        return None
    if linear.bias is not None and linear.bias.dtype != torch.float32:
        return None
    return linear.panels, linear.bias


class StepForward:
    """One model's step forward in C: pointer tables built once, scratch reused per step."""

    def __init__(
        self,
        library: ctypes.CDLL,
        kernels: _Kernels,
        model: LlamaModel,
        kv_cache: torch.Tensor,
        max_rows: int = MAX_ROWS,
    ):
        fn = library.mixgate_step_forward_f32
        fn.argtypes = [_ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _i64, _ptr, _i64]
        fn.argtypes += [_ptr, _ptr, _i64, _i64, _i64, _ptr, ctypes.c_int]
        fn.restype = ctypes.c_int
        self._fn = fn
        self._kernels = kernels
        # Rows a step may have here: the scratch's, and the skinny kernel's bound on this build
        # (past it the layers' linears are oneDNN's, other bits).
        self.max_rows = min(max_rows, MAX_ROWS)
        # Whether prefill chunks run here too (the layers attend them with the prefill kernel).
        self.takes_prefill = bool(kernels.prefill_attention)
        config = model.config
        self.hidden_size = config.hidden_size
        self._widths = {
            "residual": config.hidden_size,
            "stream": config.hidden_size,
            "normed": config.hidden_size,
            "qkv": (config.num_attention_heads + 2 * config.num_key_value_heads) * config.head_dim,
            "qk": (config.num_attention_heads + config.num_key_value_heads) * config.head_dim,
            "q": config.num_attention_heads * config.head_dim,
            "attended": config.num_attention_heads * config.head_dim,
            "gate_up": 2 * config.intermediate_size,
            "activated": config.intermediate_size,
            "cos_rows": config.head_dim,
            "signed_sin": config.head_dim,
        }
        # Everything the C side reads through a pointer is held here, so it outlives the calls.
        self._keep: list[torch.Tensor] = []
        layers = (_Layer * config.num_hidden_layers)()
        for index, layer in enumerate(model.layers):
            assert isinstance(layer, DecoderLayer)
            layers[index] = self._layer(index, layer, kv_cache)
        embedding = model.embed_tokens.weight.detach()
        cos, sin = model.rotary.cos, model.rotary.sin
        final_norm = model.norm.weight.detach()
        self._keep += [embedding, cos, sin, final_norm]
        self._model = _Model(
            config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
            config.num_key_value_heads, config.head_dim, config.intermediate_size,
            kv_cache.shape[3], config.rms_norm_eps,
            # As PagedDecodeKernel.attend computes it: in double, rounded to float on the way in.
            1.0 / math.sqrt(config.head_dim),
            embedding.data_ptr(), cos.data_ptr(), sin.data_ptr(), final_norm.data_ptr(),
        )  # fmt: skip
        self._layers = layers
        # Sized for max_rows once (100m at 128 rows: 8.8 MB) and reused by every step: fresh
        # buffers per call were what made each kernel's first touch of its output slow.
        self._scratch_tensors = {
            name: torch.empty(self.max_rows * self._widths[name], dtype=torch.float32)
            for name in _SCRATCH_FIELDS
        }
        self._scratch = _Scratch(*(self._scratch_tensors[n].data_ptr() for n in _SCRATCH_FIELDS))

    def _layer(self, index: int, layer: DecoderLayer, kv_cache: torch.Tensor) -> _Layer:
        """One layer's pointers (and its tensors kept alive in self._keep)."""
        attn, mlp = layer.self_attn, layer.mlp
        if not isinstance(mlp, MLP):
            raise ValueError(f"layer {index} is not a dense MLP layer")
        packed = [
            _skinny_panels(m) for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        ]
        weights: list[torch.Tensor | None] = []
        for entry in packed:
            if entry is None:
                raise ValueError(f"layer {index} has a linear the skinny kernel does not take")
            weights += entry
        norms = [layer.input_layernorm.weight.detach(), layer.post_attention_layernorm.weight]
        caches = [kv_cache[index, 0], kv_cache[index, 1]]
        # _Layer's field order: the two norms, (panels, bias) of each linear, then the caches.
        fields = [norms[0], norms[1].detach(), *weights, *caches]
        self._keep += [t for t in fields if t is not None]
        return _Layer(*(_address(t) for t in fields))

    @classmethod
    def for_model(
        cls,
        model: LlamaModel,
        kv_cache: torch.Tensor,
        linear: object,
        attention: object,
        elementwise: object,
        prefill: object = None,
    ) -> StepForward | None:
        """The C forward for `model` where it can run it exactly as the layers do, else None.

        `linear`, `attention`, `elementwise`, `prefill`: the kernels the runner's layers use
        (None, or another kind, where they do not run the C ones: then neither does this; without
        the prefill kernel it runs pure-decode steps only)."""
        config = model.config
        if not (
            isinstance(linear, SkinnyLinear)
            and isinstance(attention, PagedDecodeKernel)
            and isinstance(elementwise, FusedElementwise)
        ):
            return None
        attention_address = attention.entry_address(torch.float32)
        fits = (
            attention_address is not None
            and not config.is_moe
            and kv_cache.dtype == torch.float32
            and kv_cache.device.type == "cpu"
            and kv_cache.is_contiguous()
            and model.embed_tokens.weight.dtype == torch.float32
            and config.head_dim % 2 == 0
        )
        library = step_forward_library() if fits else None
        if library is None:
            return None
        norm, silu_mul, rotary = elementwise.entry_addresses()
        prefill_address = prefill.entry_address if isinstance(prefill, PagedPrefillKernel) else None
        kernels = _Kernels(
            norm, silu_mul, rotary, linear.entry_address, attention_address, prefill_address
        )
        try:
            return cls(library, kernels, model, kv_cache, linear.max_rows)
        except ValueError:
            return None

    def hidden(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        spans: torch.Tensor | None = None,
        span_tables: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """Final hidden states [rows, hidden] of a step (int64 inputs [rows]), or None when the C
        side refuses it (more than `max_rows` rows).

        Its single-token rows come first: block tables [decode rows, width] and context lengths
        [decode rows]. Prefill chunks follow, laid end to end: `spans` [chunks, 2] (each chunk's
        rows and first position) and `span_tables` [chunks, width] (each chunk's block table)."""
        rows = input_ids.shape[0]
        if rows > self.max_rows:
            return None
        tables = block_tables.contiguous()
        ids, pos = input_ids.contiguous(), positions.contiguous()
        slots, lengths = slot_mapping.contiguous(), context_lens.contiguous()
        span_count, span_ptr, span_table_ptr, span_stride = 0, None, None, 0
        if spans is not None and spans.shape[0] > 0:
            if not self.takes_prefill or span_tables is None:
                return None
            spans, span_tables = spans.contiguous(), span_tables.contiguous()
            span_count, span_ptr = spans.shape[0], spans.data_ptr()
            span_table_ptr, span_stride = span_tables.data_ptr(), span_tables.shape[1]
        out = torch.empty(rows, self.hidden_size, dtype=torch.float32)
        status = self._fn(
            ctypes.byref(self._kernels), ctypes.byref(self._model), self._layers,
            ctypes.byref(self._scratch), ids.data_ptr(), pos.data_ptr(), slots.data_ptr(),
            tables.data_ptr(), tables.shape[1], lengths.data_ptr(), tables.shape[0], span_ptr,
            span_table_ptr, span_stride, span_count, rows, out.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        return out if status == 0 else None


@functools.cache
def step_forward_library() -> ctypes.CDLL | None:
    """The compiled library, built on first use; None (logged once) where it cannot be here."""
    return load_kernel_or_none(_SOURCE, "step_forward_unavailable")
