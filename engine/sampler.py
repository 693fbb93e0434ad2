"""Token sampling for a batch of rows with per-request settings.

Greedy rows take the argmax. Other rows are scaled by temperature, cut by top-k and top-p in
one sort, and sampled with the exponential race (argmax of p / E, E ~ Exp(1)), which equals
sampling from p. Seeded rows draw their noise from their own generator, so a seed gives the
same tokens whatever else shares the batch.
"""

from __future__ import annotations

import torch

from engine.sampling_params import SamplingParams


class Sampler:
    def __init__(self, device: torch.device, seed: int):
        self.device = device
        self._shared_generator = torch.Generator(device=device).manual_seed(seed)
        self._request_generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self._request_generators.pop(request_id, None)

    def sample(
        self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]
    ) -> list[int]:
        """logits: [rows, vocab] fp32 -> one token id per row."""
        tokens = logits.argmax(dim=-1)
        random_rows = [i for i, p in enumerate(params) if not p.greedy]
        if random_rows:
            rows = torch.tensor(random_rows, device=logits.device)
            chosen = self._sample_random(
                logits.index_select(0, rows),
                [request_ids[i] for i in random_rows],
                [params[i] for i in random_rows],
            )
            tokens[rows] = chosen
        return [int(t) for t in tokens.tolist()]

    def _sample_random(
        self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]
    ) -> torch.Tensor:
        device = logits.device
        temperature = torch.tensor([p.temperature for p in params], device=device)
        sorted_logits, sorted_ids = (logits / temperature.unsqueeze(1)).sort(
            dim=-1, descending=True
        )
        vocab = logits.shape[-1]
        ranks = torch.arange(vocab, device=device).unsqueeze(0)
        top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=device)
        sorted_logits = sorted_logits.masked_fill(ranks >= top_k.unsqueeze(1), float("-inf"))
        probs = sorted_logits.softmax(dim=-1)
        top_p = torch.tensor([p.top_p for p in params], device=device)
        # Drop a token when the tokens before it already reach top_p (the first always stays).
        outside = (probs.cumsum(dim=-1) - probs) >= top_p.unsqueeze(1)
        probs = probs.masked_fill(outside, 0.0)
        noise = torch.empty_like(probs)
        for row, (request_id, p) in enumerate(zip(request_ids, params, strict=True)):
            noise[row].exponential_(generator=self._generator(request_id, p))
        choice = (probs / noise).argmax(dim=-1, keepdim=True)
        return sorted_ids.gather(1, choice).squeeze(1)

    def _generator(self, request_id: str, params: SamplingParams) -> torch.Generator:
        if params.seed is None:
            return self._shared_generator
        generator = self._request_generators.get(request_id)
        if generator is None:
            generator = torch.Generator(device=self.device).manual_seed(params.seed)
            self._request_generators[request_id] = generator
        return generator
