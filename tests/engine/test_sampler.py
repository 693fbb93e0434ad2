"""Sampling: greedy, top-k/top-p cut-offs, per-request seeds, and the sampled distribution."""

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
VOCAB = 259


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3.0


def _sample(sampler: Sampler, logits: torch.Tensor, params: list[SamplingParams]) -> list[int]:
    ids = [f"r{i}" for i in range(len(params))]
    return sampler.sample(logits, ids, params)


def test_greedy_is_argmax_even_beside_random_rows() -> None:
    logits = _logits(8)
    greedy = SamplingParams(temperature=0.0)
    hot = SamplingParams(temperature=2.0)
    params = [greedy if i % 2 == 0 else hot for i in range(8)]
    tokens = _sample(Sampler(CPU, seed=0), logits, params)
    argmax = logits.argmax(dim=-1).tolist()
    assert tokens[::2] == argmax[::2]
    # The hot rows really sampled (at T=2 over 259 tokens, hitting the argmax 4 times of 4
    # with this seed would be a sign that they took the greedy path too).
    assert tokens[1::2] != argmax[1::2]


@pytest.mark.parametrize("temperature", [0.05, 0.7, 1.0, 2.0])
def test_top_k_1_is_greedy_at_any_temperature(temperature: float) -> None:
    logits = _logits(16, seed=1)
    params = [SamplingParams(temperature=temperature, top_k=1)] * 16
    assert _sample(Sampler(CPU, seed=5), logits, params) == logits.argmax(dim=-1).tolist()


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_tiny_top_p_is_greedy(temperature: float) -> None:
    logits = _logits(16, seed=2)
    params = [SamplingParams(temperature=temperature, top_p=1e-6)] * 16
    assert _sample(Sampler(CPU, seed=5), logits, params) == logits.argmax(dim=-1).tolist()


# ---- the sampled distribution --------------------------------------------------------------

CRAFTED = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0, -4.0])
DRAWS = 20_000
# NOTE: a fixed seed makes this deterministic; the bound is the chi-square statistic's
# 99.99th percentile for <= 7 degrees of freedom (~29.9), rounded up: a correct sampler
# passes it for nearly every seed, a wrong distribution (e.g. a missing temperature or
# an off-by-one in the cut-off) fails it by orders of magnitude.
CHI2_BOUND = 30.0


def _counts(params: SamplingParams, seed: int) -> torch.Tensor:
    logits = CRAFTED.unsqueeze(0).expand(DRAWS, -1).contiguous()
    tokens = _sample(Sampler(CPU, seed=seed), logits, [params] * DRAWS)
    return torch.bincount(torch.tensor(tokens), minlength=len(CRAFTED)).double()


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    support = probs > 0
    assert counts[~support].sum() == 0, "a token outside the allowed set was sampled"
    expected = probs[support].double() * DRAWS
    return float(((counts[support] - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_sampled_distribution_matches_softmax(temperature: float) -> None:
    counts = _counts(SamplingParams(temperature=temperature), seed=123)
    probs = (CRAFTED / temperature).softmax(dim=-1)
    assert _chi2(counts, probs) < CHI2_BOUND
    # The bound has teeth: the same counts are far from a 1.5x hotter distribution.
    hotter = (CRAFTED / (1.5 * temperature)).softmax(dim=-1)
    assert _chi2(counts, hotter) > 10 * CHI2_BOUND


def test_top_k_samples_the_renormalised_top_k() -> None:
    counts = _counts(SamplingParams(temperature=1.0, top_k=3), seed=7)
    probs = CRAFTED.softmax(dim=-1)
    probs[3:] = 0.0
    assert _chi2(counts, probs / probs.sum()) < CHI2_BOUND


def test_top_p_samples_the_renormalised_nucleus() -> None:
    probs = CRAFTED.softmax(dim=-1)
    # softmax(CRAFTED) ~ [.53, .20, .12, .07, .04, ...]; top_p=0.9 keeps the first 4
    # (the mass before the 4th is 0.85 < 0.9, before the 5th 0.92).
    before = probs.cumsum(dim=-1) - probs
    keep = before < 0.9
    assert keep.tolist() == [True] * 4 + [False] * 4
    counts = _counts(SamplingParams(temperature=1.0, top_p=0.9), seed=9)
    nucleus = torch.where(keep, probs, torch.zeros_like(probs))
    assert _chi2(counts, nucleus / nucleus.sum()) < CHI2_BOUND


# ---- seeds ---------------------------------------------------------------------------------


def test_sampler_seed_is_independent_of_the_batch() -> None:
    logits = _logits(6, seed=3)
    seeded = SamplingParams(temperature=1.0, seed=42)
    alone = Sampler(CPU, seed=0).sample(logits[2:3], ["me"], [seeded])
    others = [SamplingParams(temperature=1.0)] * 6
    params = [*others[:2], seeded, *others[3:]]
    ids = ["a", "b", "me", "c", "d", "e"]
    batched = Sampler(CPU, seed=99).sample(logits, ids, params)
    assert batched[2] == alone[0]


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> LLMEngine:
    # One torch thread: see the NOTE in test_engine_requests.py.
    return LLMEngine(tiny_model_dir, EngineConfig(device="cpu", num_kv_blocks=128, num_threads=1))


def _generate(engine: LLMEngine, requests: list[GenerationRequest]) -> dict[str, list[int]]:
    for request in requests:
        engine.add_request(request)
    tokens: dict[str, list[int]] = {r.request_id: [] for r in requests}
    for _ in range(1_000):
        if not engine.has_unfinished_requests():
            break
        for output in engine.step():
            tokens[output.request_id].extend(output.new_token_ids)
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    return tokens


PROMPT = tuple(b"Once upon a time")


def _seeded(request_id: str, seed: int, max_tokens: int = 32) -> GenerationRequest:
    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed, ignore_eos=True)
    return GenerationRequest(request_id, PROMPT, params)


def test_seeded_request_gives_the_same_tokens_alone_and_in_a_batch(engine: LLMEngine) -> None:
    alone = _generate(engine, [_seeded("seeded", 1234)])["seeded"]
    assert len(alone) == 32
    generator = torch.Generator().manual_seed(0)
    crowd: list[GenerationRequest] = []
    for i in range(7):
        length = int(torch.randint(1, 60, (1,), generator=generator))
        prompt = tuple(int(t) for t in torch.randint(0, 256, (length,), generator=generator))
        params = SamplingParams(
            max_tokens=int(torch.randint(1, 40, (1,), generator=generator)),
            temperature=float(torch.rand(1, generator=generator)) * 2.0,
            top_k=[-1, 5, 50][i % 3],
            top_p=[1.0, 0.9][i % 2],
            seed=None if i % 2 else i,
            ignore_eos=True,
        )
        crowd.append(GenerationRequest(f"other{i}", prompt, params))
    # The seeded request joins mid-crowd, so its steps share batches of different sizes.
    batched = _generate(engine, [*crowd[:4], _seeded("seeded", 1234), *crowd[4:]])
    assert batched["seeded"] == alone
    assert all(len(batched[r.request_id]) == r.sampling.max_tokens for r in crowd)


def test_different_seeds_give_different_tokens(engine: LLMEngine) -> None:
    tokens = _generate(engine, [_seeded("a", 1), _seeded("b", 2), _seeded("c", 1)])
    assert tokens["a"] != tokens["b"]
    assert tokens["a"] == tokens["c"]  # same seed, same prompt, different request ids


def test_tiny_top_p_and_top_k_1_match_greedy_in_the_engine(engine: LLMEngine) -> None:
    def request(request_id: str, **kwargs: object) -> GenerationRequest:
        params = SamplingParams(max_tokens=24, ignore_eos=True, **kwargs)  # type: ignore[arg-type]
        return GenerationRequest(request_id, PROMPT, params)

    tokens = _generate(
        engine,
        [
            request("greedy", temperature=0.0),
            request("top_p", temperature=1.0, top_p=1e-6),
            request("top_k", temperature=2.0, top_k=1),
        ],
    )
    assert tokens["top_p"] == tokens["greedy"]
    assert tokens["top_k"] == tokens["greedy"]
    # Greedy in the engine is the argmax of the reference (cache-free) forward at every step.
    logits = engine.runner.model.dense_logits([*PROMPT, *tokens["greedy"]])
    rows = logits[len(PROMPT) - 1 : -1]
    chosen = rows.gather(1, torch.tensor(tokens["greedy"]).unsqueeze(1)).squeeze(1)
    assert torch.all(chosen >= rows.max(dim=-1).values - 1e-5)
