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
            if len(random_rows) == len(params):
                chosen = self._sample_random(logits, request_ids, params)
                return [int(t) for t in chosen.tolist()]
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
        vocab = logits.shape[-1]
        # One host tensor for every row's settings (one copy, not three).
        settings = torch.tensor(
            [[p.temperature, p.top_k if p.top_k > 0 else vocab, p.top_p] for p in params],
            dtype=torch.float64,
        ).to(device)
        temperature = settings[:, 0].to(logits.dtype)
        top_k, top_p = settings[:, 1].long(), settings[:, 2].to(logits.dtype)
        sorted_logits, sorted_ids = (logits / temperature.unsqueeze(1)).sort(
            dim=-1, descending=True
        )
        ranks = torch.arange(vocab, device=device).unsqueeze(0)
        sorted_logits = sorted_logits.masked_fill(ranks >= top_k.unsqueeze(1), float("-inf"))
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the tokens before it already reach top_p (the first always stays).
        outside = (probs.cumsum(dim=-1) - probs) >= top_p.unsqueeze(1)
        probs = probs.masked_fill(outside, 0.0)
        noise = torch.empty_like(probs)
        # Unseeded rows share one draw from the shared generator; a seeded row draws from its
        # own generator (so a seed gives the same tokens whatever shares the batch).
        unseeded = [row for row, p in enumerate(params) if p.seed is None]
        if len(unseeded) == len(params):
            noise.exponential_(generator=self._shared_generator)
        else:
            if unseeded:
                shared = torch.empty(len(unseeded), vocab, dtype=probs.dtype, device=device)
                shared.exponential_(generator=self._shared_generator)
                noise[torch.tensor(unseeded, device=device)] = shared
            for row, (request_id, p) in enumerate(zip(request_ids, params, strict=True)):
                if p.seed is not None:
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
