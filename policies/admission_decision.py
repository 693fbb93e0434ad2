"""What admission decides: accept, or reject with an HTTP status, an error code and a reason.

Kept apart from the decision logic (``policies/admission.py``) because the gateway, its
metrics and its logs consume this shape without caring how it was reached.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal

from policies.request_class import RequestClass

__all__ = ["AdmissionDecision", "Rejection", "RejectionCode"]

RejectionCode = Literal[
    "prompt_too_long",
    "max_tokens_too_large",
    "context_length_exceeded",
    "queue_full",
    "deadline_unmeetable",
]

_STATUS_BY_CODE: Final[dict[str, int]] = {
    "prompt_too_long": 413,
    "max_tokens_too_large": 400,
    "context_length_exceeded": 413,
    "queue_full": 429,
    "deadline_unmeetable": 429,
}


@dataclass(frozen=True, slots=True)
class Rejection:
    """An OpenAI-style error; the gateway renders it as ``{"error": {...}}`` (+ Retry-After)."""

    status_code: int  # 413 / 400 (lengths) or 429 (overload)
    error_type: str  # OpenAI "type": invalid_request_error | rate_limit_error
    code: RejectionCode
    message: str  # human-readable, with the numbers that decided it
    param: str | None  # the request field at fault, None for overload
    retry_after_s: int | None  # whole seconds >= 1 on a 429; None otherwise

    def __post_init__(self) -> None:
        expected_status = _STATUS_BY_CODE.get(self.code)
        if expected_status is None:
            raise ValueError(f"unknown rejection code {self.code!r}")
        if self.status_code != expected_status:
            raise ValueError(f"{self.code} is a {expected_status}, not {self.status_code}")
        if not self.message:
            raise ValueError("message must be non-empty")
        if self.status_code == 429:
            if self.retry_after_s is None or self.retry_after_s < 1:
                raise ValueError("a 429 needs retry_after_s >= 1")
        elif self.retry_after_s is not None:
            # Retrying a too-long request cannot help, so it must not be told to retry.
            raise ValueError("retry_after_s is only for 429 rejections")

    @classmethod
    def too_long(cls, code: RejectionCode, message: str, param: str) -> Rejection:
        """A length-limit rejection (413, or 400 for max_tokens): retrying cannot help."""
        return cls(_STATUS_BY_CODE[code], "invalid_request_error", code, message, param, None)

    @classmethod
    def overloaded(cls, code: RejectionCode, message: str, retry_after_s: int) -> Rejection:
        """A 429: the request is fine, the service is busy; retry after ``retry_after_s``."""
        return cls(429, "rate_limit_error", code, message, None, retry_after_s)


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    """The outcome plus the predictions behind it (the gateway logs and exposes both)."""

    request_class: RequestClass
    # Seconds from now, unscaled by the safety factor: when the work queued ahead is done,
    # when this request's first token arrives, and when its max_tokens-th token would.
    predicted_start_s: float
    predicted_ttft_s: float
    predicted_finish_s: float
    # The deadline applied (the request's own, else the class default), seconds from now.
    deadline_s: float
    rates_measured: bool  # False: the predictions rest on the cost model's estimate
    rejection: Rejection | None = None  # None: accepted

    def __post_init__(self) -> None:
        times_s = (self.predicted_start_s, self.predicted_ttft_s, self.predicted_finish_s)
        if not all(math.isfinite(t) and t >= 0 for t in times_s):
            raise ValueError("predicted times must be finite and non-negative")
        if not self.predicted_start_s <= self.predicted_ttft_s <= self.predicted_finish_s:
            raise ValueError("predictions must be ordered: start <= ttft <= finish")
        if not (math.isfinite(self.deadline_s) and self.deadline_s > 0):
            raise ValueError("deadline_s must be positive and finite")

    @property
    def accepted(self) -> bool:
        return self.rejection is None
