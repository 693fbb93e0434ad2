"""Token sampling for a batch of rows with per-request settings.

vLLM's logit rules come first, for greedy and random rows alike, and only on rows that ask
for them: `repetition_penalty` (tokens of the prompt or output seen so far) and `min_tokens`
(EOS and stop ids held back until that many output tokens exist). Both need the sequence's
tokens, which the engine hands over once per request (`track`). Greedy rows take the argmax.
Other rows are scaled by temperature, cut by `min_p` (as vLLM, before the others), top-k
and top-p in one sort, and sampled with the exponential race (argmax of p / E, E ~ Exp(1)),
which equals sampling from p. Seeded rows draw their noise from their own generator, so a
seed gives the same tokens whatever else shares the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.sampling_params import SamplingParams


@dataclass(slots=True)
class _History:
    """What the logit rules read of one sequence."""

    # The sequence's own token list (prompt, then output): the engine appends to it, so it is
    # current at every step without a copy.
    token_ids: list[int]
    num_prompt_tokens: int
    # The ids min_tokens holds back: stop_token_ids, plus EOS unless ignore_eos.
    stop_ids: tuple[int, ...]
    # [vocab] bool: which ids occur in token_ids[:synced] (repetition_penalty), kept up to date
    # with the tokens added since the last step rather than rebuilt.
    seen: torch.Tensor | None = None
    synced: int = 0

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


class Sampler:
    def __init__(self, device: torch.device, seed: int):
        self.device = device
        self._shared_generator = torch.Generator(device=device).manual_seed(seed)
        self._request_generators: dict[str, torch.Generator] = {}
        self._histories: dict[str, _History] = {}

    def track(
        self,
        request_id: str,
        token_ids: list[int],
        num_prompt_tokens: int,
        stop_ids: tuple[int, ...],
    ) -> None:
        """Give the sampler the sequence's growing token list (requests that `needs_history`)."""
        self._histories[request_id] = _History(token_ids, num_prompt_tokens, stop_ids)

    def forget(self, request_id: str) -> None:
        self._request_generators.pop(request_id, None)
        self._histories.pop(request_id, None)

    def sample(
        self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]
    ) -> list[int]:
        """logits: [rows, vocab] fp32 -> one token id per row."""
        if any(p.needs_history for p in params):
            self._apply_history_rules(logits, request_ids, params)
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
        if any(p.min_p > 0.0 for p in params):
            # min_p is relative to the most likely token (the first, sorted) of the whole
            # distribution; top-k and top-p then cut what is left, renormalized, as in vLLM.
            min_p = torch.tensor([p.min_p for p in params], dtype=logits.dtype, device=device)
            full = sorted_logits.softmax(dim=-1)
            below = full < min_p.unsqueeze(1) * full[:, :1]
            sorted_logits = sorted_logits.masked_fill(below, float("-inf"))
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

    def _apply_history_rules(
        self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]
    ) -> None:
        """repetition_penalty and min_tokens, in place, on the rows that ask for them."""
        device, vocab = logits.device, logits.shape[-1]
        penalized: list[int] = []
        held_rows: list[int] = []
        held_ids: list[int] = []
        for row, (request_id, p) in enumerate(zip(request_ids, params, strict=True)):
            if not p.needs_history:
                continue
            history = self._histories[request_id]
            if p.repetition_penalty != 1.0:
                penalized.append(row)
            if history.num_output_tokens < p.min_tokens:
                ids = [t for t in history.stop_ids if t < vocab]
                held_rows += [row] * len(ids)
                held_ids += ids
        if penalized:
            rows = torch.tensor(penalized, device=device)
            seen = torch.stack([self._seen(request_ids[row], vocab) for row in penalized])
            penalty = torch.tensor(
                [params[row].repetition_penalty for row in penalized],
                dtype=logits.dtype,
                device=device,
            ).unsqueeze(1)
            picked = logits.index_select(0, rows)
            scaled = torch.where(picked > 0, picked / penalty, picked * penalty)
            logits[rows] = torch.where(seen, scaled, picked)
        if held_rows:
            at = (torch.tensor(held_rows, device=device), torch.tensor(held_ids, device=device))
            logits.index_put_(at, torch.tensor(float("-inf"), dtype=logits.dtype, device=device))

    def _seen(self, request_id: str, vocab: int) -> torch.Tensor:
        """The [vocab] mask of ids in the sequence so far, updated with its new tokens only."""
        history = self._histories[request_id]
        if history.seen is None:
            history.seen = torch.zeros(vocab, dtype=torch.bool, device=self.device)
        new = history.token_ids[history.synced :]
        if new:
            history.seen[torch.tensor(new, device=self.device)] = True
            history.synced = len(history.token_ids)
        return history.seen

    def _generator(self, request_id: str, params: SamplingParams) -> torch.Generator:
        if params.seed is None:
            return self._shared_generator
        generator = self._request_generators.get(request_id)
        if generator is None:
            generator = torch.Generator(device=self.device).manual_seed(params.seed)
            self._request_generators[request_id] = generator
        return generator
