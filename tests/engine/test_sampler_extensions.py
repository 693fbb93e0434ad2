"""vLLM's sampling extensions in the torch sampler: repetition_penalty, min_tokens, min_p.

Crafted logits make each rule's effect on the argmax (or on the sampled support) certain; the
engine test checks the whole path (the engine hands each sequence's tokens to the sampler).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.request import GenerationRequest
from engine.core.sampling_params import SamplingParams
from engine.model.sampler import Sampler

CPU = torch.device("cpu")
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


def _crafted(rows: int) -> torch.Tensor:
    # Token 0 leads, then 1; token 5 is very negative.
    base = torch.tensor([3.0, 2.5, 1.0, 0.5, 0.0, -4.0, -5.0, -6.0])
    return base.repeat(rows, 1)


def test_repetition_penalty_divides_a_seen_positive_logit_and_multiplies_a_negative_one() -> None:
    sampler = Sampler(CPU, seed=0)
    # Prompt holds token 0 (3.0 / 2 = 1.5 < 2.5: token 1 now leads).
    sampler.track("seen0", [0, 4], 2, ())
    sampler.track("unseen", [6, 7], 2, ())
    penalized = SamplingParams(temperature=0.0, max_tokens=8, repetition_penalty=2.0)
    logits = _crafted(3)
    tokens = sampler.sample(logits, ["seen0", "unseen", "plain"], [penalized, penalized, GREEDY])
    assert tokens == [1, 0, 0]
    # In place on the penalized rows only; negative seen logits are multiplied (-5 * 2).
    assert logits[0, 0].item() == pytest.approx(1.5)
    assert logits[1, 6].item() == pytest.approx(-10.0)
    assert torch.equal(logits[2], _crafted(1)[0])


def test_repetition_penalty_sees_output_tokens_as_they_are_appended() -> None:
    sampler = Sampler(CPU, seed=0)
    history = [4]  # the engine's own list: the sampler must see what is appended to it
    sampler.track("r", history, 1, ())
    params = SamplingParams(temperature=0.0, max_tokens=8, repetition_penalty=2.0)
    assert sampler.sample(_crafted(1), ["r"], [params]) == [0]
    history.append(0)
    assert sampler.sample(_crafted(1), ["r"], [params]) == [1]
    history.append(1)
    # 0 -> 1.5 and 1 -> 1.25: token 0 leads again; 2 (1.0) stays below both.
    assert sampler.sample(_crafted(1), ["r"], [params]) == [0]


def test_min_tokens_holds_back_stop_ids_until_enough_output_exists() -> None:
    sampler = Sampler(CPU, seed=0)
    history = [7, 7]
    # Stop ids 0 (EOS, say) and 2; an id beyond the vocabulary is ignored, not an IndexError.
    sampler.track("r", history, 2, (0, 2, 10_000))
    params = SamplingParams(temperature=0.0, max_tokens=8, min_tokens=2)
    assert sampler.sample(_crafted(1), ["r"], [params]) == [1]
    history.append(1)
    assert sampler.sample(_crafted(1), ["r"], [params]) == [1]
    history.append(1)
    # Two output tokens now: the stop id may be sampled.
    assert sampler.sample(_crafted(1), ["r"], [params]) == [0]


def test_min_p_keeps_only_tokens_near_the_most_likely_one() -> None:
    # p ~ softmax([3, 2.5, 1, ...]): token 1 has 0.61 of token 0's probability, token 2 0.14.
    rows = 4_000
    logits = _crafted(rows)
    params = [SamplingParams(temperature=1.0, min_p=0.5)] * rows
    tokens = Sampler(CPU, seed=3).sample(logits, [f"r{i}" for i in range(rows)], params)
    assert set(tokens) == {0, 1}
    # Renormalized over the two kept tokens: 1 / (1 + e^-0.5) = 0.62 for token 0.
    share = tokens.count(0) / rows
    assert 0.58 < share < 0.66
    # Without min_p the same draw reaches beyond them.
    plain = [SamplingParams(temperature=1.0)] * rows
    others = Sampler(CPU, seed=3).sample(_crafted(rows), [f"r{i}" for i in range(rows)], plain)
    assert set(others) - {0, 1}


def test_rows_without_extensions_are_exact_argmax_beside_rows_with_them() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 259, generator=generator) * 3.0
    expected = logits.argmax(dim=-1).tolist()
    sampler = Sampler(CPU, seed=0)
    sampler.track("pen", [int(expected[1])], 1, ())
    params = [GREEDY] * 6
    params[1] = SamplingParams(temperature=0.0, max_tokens=8, repetition_penalty=2.0)
    tokens = sampler.sample(logits, [f"r{i}" if i != 1 else "pen" for i in range(6)], params)
    assert [t for i, t in enumerate(tokens) if i != 1] == [
        t for i, t in enumerate(expected) if i != 1
    ]


def test_sampling_params_bound_the_extensions() -> None:
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=4, min_tokens=5)
    with pytest.raises(ValueError, match="min_p"):
        SamplingParams(min_p=1.5)
    with pytest.raises(ValueError, match="repetition_penalty"):
        SamplingParams(repetition_penalty=0.0)
    assert not SamplingParams().needs_history
    assert SamplingParams(min_tokens=1).needs_history


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> LLMEngine:
    return LLMEngine(tiny_model_dir, EngineConfig(device="cpu", num_kv_blocks=64, num_threads=1))


def _run(engine: LLMEngine, request: GenerationRequest) -> list[int]:
    engine.add_request(request)
    tokens: list[int] = []
    for _ in range(200):
        if not engine.has_unfinished_requests():
            break
        for output in engine.step():
            tokens.extend(output.new_token_ids)
    assert not engine.has_unfinished_requests()
    return tokens


def test_engine_min_tokens_defers_a_stop_token_id(engine: LLMEngine) -> None:
    prompt = tuple(b"Once upon a time")
    free = _run(
        engine,
        GenerationRequest("free", prompt, SamplingParams(temperature=0.0, max_tokens=6)),
    )
    first = free[0]
    # The first greedy token as a stop id ends the request at once...
    stopped = _run(
        engine,
        GenerationRequest(
            "stopped",
            prompt,
            SamplingParams(temperature=0.0, max_tokens=6, stop_token_ids=(first,)),
        ),
    )
    assert stopped == [first]
    # ...unless min_tokens holds it back: 3 tokens at least, none of the first 3 the stop id.
    held = _run(
        engine,
        GenerationRequest(
            "held",
            prompt,
            SamplingParams(temperature=0.0, max_tokens=6, stop_token_ids=(first,), min_tokens=3),
        ),
    )
    assert len(held) >= 3
    assert first not in held[:3]
    # A greedy repetition penalty changes the output of the tiny model (it repeats itself).
    plain = _run(
        engine,
        GenerationRequest(
            "plain", prompt, SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
        ),
    )
    penalized = _run(
        engine,
        GenerationRequest(
            "pen",
            prompt,
            SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, repetition_penalty=2.0),
        ),
    )
    assert len(penalized) == 32
    assert penalized != plain
    assert engine.runner.sampler._histories == {}  # forgotten at the end
