"""The data-only contract between the gateway and its engine core process (msgpack via msgspec).

Inputs (gateway -> engine): AddRequest, AbortRequest, Shutdown. Outputs (engine -> gateway):
EngineReady once, then one StepOutputs per engine step (and one for aborts or rejections that
arrive while the engine is idle), or EngineFailed before the process exits on an error.
The payloads are the engine's own frozen data classes (GenerationRequest, RequestOutput,
LoadSnapshot, StepRecord): ids, token ids, text, timings; never a live Sequence.
"""

from __future__ import annotations

import msgspec

from engine.core.request import GenerationRequest, RequestOutput
from engine.core.step_record import LoadSnapshot, StepRecord


class AddRequest(msgspec.Struct, tag=True, frozen=True):
    request: GenerationRequest


class AbortRequest(msgspec.Struct, tag=True, frozen=True):
    request_id: str


class Shutdown(msgspec.Struct, tag=True, frozen=True):
    pass


EngineInput = AddRequest | AbortRequest | Shutdown


class Rejection(msgspec.Struct, frozen=True):
    """An AddRequest the engine refused (RequestValidationError's fields)."""

    request_id: str
    message: str
    code: str
    param: str | None


class EngineReady(msgspec.Struct, tag=True, frozen=True):
    """Sent once the model is loaded: what the gateway needs to validate requests itself."""

    pid: int
    max_model_len: int
    kv_capacity_tokens: int
    vocab_size: int
    eos_token_ids: list[int]
    load: LoadSnapshot


class StepOutputs(msgspec.Struct, tag=True, frozen=True):
    """Everything one engine step (plus the inputs applied before it) produced."""

    # Every delta of the step, and the final outputs of requests aborted before it.
    outputs: list[RequestOutput]
    rejections: list[Rejection]
    # The load after the step (admission and /metrics read it).
    load: LoadSnapshot
    # The step's record (empty when no forward ran, e.g. only aborts were applied).
    steps: list[StepRecord]


class EngineFailed(msgspec.Struct, tag=True, frozen=True):
    """The step loop raised; the process exits right after sending this."""

    message: str


EngineOutput = EngineReady | StepOutputs | EngineFailed

input_encoder = msgspec.msgpack.Encoder()
input_decoder = msgspec.msgpack.Decoder(EngineInput)
output_encoder = msgspec.msgpack.Encoder()
output_decoder = msgspec.msgpack.Decoder(EngineOutput)
