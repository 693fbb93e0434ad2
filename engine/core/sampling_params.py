"""Per-request decoding settings, validated before a request reaches the engine."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SamplingParams:
    # Output tokens to generate at most (OpenAI's max_tokens / max_completion_tokens).
    max_tokens: int = 16
    # 0 means greedy (argmax); otherwise logits are divided by it.
    temperature: float = 1.0
    # Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p.
    top_p: float = 1.0
    # Keep the k most likely tokens; -1 (or 0) keeps all.
    top_k: int = -1
    # Per-request seed: the same seed and prompt give the same tokens whatever the batch.
    seed: int | None = None
    # Strings that end generation; the matched string is not part of the output text.
    stop: tuple[str, ...] = ()
    # Token ids that end generation, in addition to the model's EOS unless ignore_eos.
    stop_token_ids: tuple[int, ...] = ()
    # Keep generating past EOS (benchmarks want fixed output lengths).
    ignore_eos: bool = False
    # vLLM's extensions. EOS and stop_token_ids cannot be sampled before this many output tokens.
    min_tokens: int = 0
    # Drop tokens whose probability is below min_p times the most likely token's (0 keeps all).
    min_p: float = 0.0
    # >1 makes tokens already in the prompt or output less likely, <1 more (1 is off);
    # a seen token's logit is divided by it when positive, multiplied when negative (as vLLM).
    repetition_penalty: float = 1.0
    # Decode the output to text (off for token-level benchmarks).
    detokenize: bool = True
    # NOTE: a bounded stop list: each string is searched in the tail of the text every token.
    max_stop_strings: int = field(default=16, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise ValueError("max_tokens must be an integer")
        if self.max_tokens <= 0:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or positive, got {self.top_k}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ValueError("seed must be a non-negative 63-bit integer")
        if len(self.stop) > self.max_stop_strings:
            raise ValueError(f"at most {self.max_stop_strings} stop strings are allowed")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop strings must be non-empty strings")
        if any(len(s) > 256 for s in self.stop):
            raise ValueError("stop strings must be at most 256 characters")
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ValueError("stop_token_ids must be non-negative integers")
        self._check_extensions()

    def _check_extensions(self) -> None:
        if isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, int):
            raise ValueError("min_tokens must be an integer")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}"
            )
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise ValueError(f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_history(self) -> bool:
        """The sampler must see the sequence's tokens (engine.model.sampler.Sampler.track)."""
        return self.min_tokens > 0 or self.repetition_penalty != 1.0
