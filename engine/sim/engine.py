"""The engine in virtual time: `LLMEngine`'s own step loop around a `SimulatedExecutor`.

Everything but the model is the live engine's code: validation, the `Scheduler` and
`BlockManager`, stop reasons, the step history admission reads. `step()` is inherited
unchanged (schedule -> execute -> update -> emit); the executor advances the virtual clock by
the cost model's estimate of the step, so token times and TTFTs come out in simulated seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from engine.core.config import EngineConfig
from engine.core.errors import RequestValidationError
from engine.core.llm_engine import LLMEngine
from engine.core.request import GenerationRequest
from engine.model.config import SUPPORTED_ARCHITECTURES, ModelConfig
from engine.sim.executor import SimulatedExecutor, SimulatedSampler, VirtualClock
from planning.costmodel import HardwareRates, ModelShape

__all__ = ["SimulatedEngine", "model_config_for_simulation"]


def model_config_for_simulation(raw_config: Mapping[str, Any]) -> ModelConfig:
    """The engine's view of a config.json (vocabulary, context, EOS ids).

    NOTE: the simulator never builds the model, so an architecture the torch engine cannot
    run is read as Llama for these few facts; its costs come from the cost model's shape.
    """
    raw = dict(raw_config)
    architectures = raw.get("architectures") or ["LlamaForCausalLM"]
    if architectures[0] not in SUPPORTED_ARCHITECTURES:
        raw["architectures"] = ["LlamaForCausalLM"]
    config = ModelConfig.from_dict(raw)
    if config.sliding_window is not None:
        # The torch engine caps a windowed model at its window; a simulation need not.
        config = replace(config, sliding_window=None)
    return config


class SimulatedEngine(LLMEngine):
    """Built from a config.json's facts, a cost-model shape, hardware rates and a KV pool."""

    def __init__(
        self,
        raw_model_config: Mapping[str, Any],
        config: EngineConfig,
        *,
        shape: ModelShape,
        hardware: HardwareRates,
        num_kv_blocks: int,
        clock: VirtualClock | None = None,
    ) -> None:
        self.config = config
        self.virtual_clock = clock or VirtualClock()
        self.clock = self.virtual_clock
        model_config = model_config_for_simulation(raw_model_config)
        sampler = SimulatedSampler(config.seed, model_config.vocab_size, model_config.eos_token_ids)
        self.executor = SimulatedExecutor(shape, hardware, self.virtual_clock, sampler)
        # config.num_kv_blocks, when set, wins (as in the torch engine): tests pin the pool.
        num_blocks = config.num_kv_blocks or num_kv_blocks
        # NOTE: duck-typed: the step loop calls runner.execute(output) and
        # runner.sampler.forget(seq_id), both of which the simulated executor has.
        self._init_core(model_config, self.executor, num_blocks)  # type: ignore[arg-type]

    def validate(self, request: GenerationRequest) -> None:
        if request.sampling.detokenize:
            raise RequestValidationError(
                "the simulated engine has no tokenizer: send requests with detokenize=False"
            )
        super().validate(request)
